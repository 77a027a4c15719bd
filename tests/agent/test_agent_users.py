"""cloud-agent init, user create-superuser, user grant/revoke; clean errors; help on every command."""

import configparser
import json
import os
import stat
import subprocess
from pathlib import Path

import click
import pexpect
import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from falcon import testing

from agent.cli import cli
from controller.store import migrations
from controller.config import load_config, write_config
from controller.context import build_context
from tests.fixtures.agent import AGENT
from tests.fixtures.api import config_values_for as cheap_config_values
from tests.fixtures.api import user_envelope

PASSWORD = "Admin-pass-2026"


def agent(*args: str, input: str | None = None):
    """Run cloud-agent in process; an exception other than a clean exit fails the test."""
    result = CliRunner().invoke(cli, list(args), input=input, prog_name="cloud-agent",
                                env={"CLOUD_CONTROLLER_CONFIG": "/nonexistent/controller.ini"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert "Traceback" not in result.output
    return result


def json_out(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def config_path(tmp_path) -> str:
    """An initialised config with cheap password hashes."""
    path = str(tmp_path / "controller.ini")
    write_config(cheap_config_values(tmp_path / "state"), path)
    json_out(agent("--config", path, "--json", "init"))
    return path


def superuser(config_path: str, email: str = "admin@example.org") -> dict:
    return json_out(agent("--config", config_path, "--json", "user", "create-superuser",
                          "--email", email, "--password", PASSWORD))


def context(config_path: str):
    return build_context(load_config(config_path))


# -- init ---------------------------------------------------------------------
def test_init_sandbox_writes_config_and_database(tmp_path):
    config = tmp_path / "etc" / "controller.ini"
    state = tmp_path / "state"
    out = json_out(agent("--config", str(config), "--json", "init", "--sandbox", str(state)))
    assert out == {"config": str(config.resolve())}

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    assert parser["controller"]["profile"] == "sandbox"
    assert parser["database"]["path"] == str(state / "controller.db")
    assert parser["libvirt"]["uri"] == "test:///default"
    assert parser["volumes"]["home_root"] == str(state / "home")
    assert parser["volumes"]["quota_backend"] == "none"
    assert parser["unix"]["root"] == str(state / "sysroot")
    assert parser["directory"]["backend"] == "local"
    # Everything the sandbox keeps is under DIR.
    for section, key in (("database", "path"), ("auth", "secret_key_file"), ("volumes", "home_root"),
                         ("unix", "root")):
        assert Path(parser[section][key]).is_relative_to(state), (section, key)

    assert (state / "home").is_dir()
    assert (state / "sysroot" / "etc" / "passwd").read_text().startswith("root:")
    assert (state / "sysroot" / "etc" / "group").is_file()
    ctx = context(str(config))
    assert ctx.store.schema_version() == migrations.SCHEMA_VERSION
    key_file = Path(parser["auth"]["secret_key_file"])
    Fernet(key_file.read_bytes().strip())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((state / "controller.db").stat().st_mode) == 0o600


def test_init_sandbox_again_keeps_key_and_users(tmp_path):
    config, state = str(tmp_path / "c.ini"), str(tmp_path / "state")
    json_out(agent("--config", config, "--json", "init", "--sandbox", state))
    key = (Path(state) / "secret.key").read_bytes()
    admin = superuser(config)
    # --json also works after the command name.
    json_out(agent("--config", config, "init", "--sandbox", state, "--json"))
    assert (Path(state) / "secret.key").read_bytes() == key
    ctx = context(config)
    assert ctx.secret_box.decrypt(ctx.store.get_user(admin["userid"])["api_secret_enc"]) == admin["api_secret"]


def test_init_creates_or_migrates_the_database_of_a_config(tmp_path):
    path = str(tmp_path / "controller.ini")
    values = cheap_config_values(tmp_path / "state")
    write_config(values, path)
    out = json_out(agent("--config", path, "--json", "init"))
    assert out == {"database": str(values["database"]["path"])}
    ctx = context(path)
    assert ctx.store.schema_version() == migrations.SCHEMA_VERSION
    assert Path(values["auth"]["secret_key_file"]).is_file()
    # Running it again is harmless.
    assert json_out(agent("--config", path, "--json", "init")) == out


def test_init_without_json_prints_a_line(config_path):
    result = agent("--config", config_path, "init")
    assert result.exit_code == 0
    assert "database ready" in result.stdout


def test_config_from_environment(config_path):
    result = CliRunner().invoke(cli, ["--json", "init"], env={"CLOUD_CONTROLLER_CONFIG": config_path})
    assert result.exit_code == 0, result.output
    assert "database" in json.loads(result.stdout)


# -- create-superuser -----------------------------------------------------------
def test_create_superuser_with_password(config_path):
    out = superuser(config_path)
    assert set(out) == {"userid", "api_key", "api_secret"}
    ctx = context(config_path)
    row = ctx.store.get_user(out["userid"])
    assert row["email"] == "admin@example.org"
    assert row["roles"] == ["superuser"]
    assert row["active"] == 1
    assert row["api_key"] == out["api_key"]
    assert row["password_hash"].startswith("$argon2id$") and ctx.passwords.verify(row["password_hash"], PASSWORD)
    assert ctx.secret_box.decrypt(row["api_secret_enc"]) == out["api_secret"]


def test_new_superuser_can_use_the_api(config_path):
    out = superuser(config_path)
    from api.app import create_app

    client = testing.TestClient(create_app(context(config_path), interfaces=("user",)))
    for body in ({"api_key": out["api_key"], "api_secret": out["api_secret"]},
                 {"email": "admin@example.org", "password": PASSWORD}):
        data = user_envelope(client.simulate_post("/v1/auth/token", json=body), 200, data=True)
        assert data["userid"] == out["userid"]
    headers = {"X-Auth-Token": data["token"], "X-Auth-Cloudauth-Id": out["userid"]}
    listed = user_envelope(client.simulate_get("/v1/user/list", headers=headers), 200, data=True)
    assert listed["users"][0]["roles"] == ["superuser"]


def test_create_superuser_human_output(config_path):
    result = agent("--config", config_path, "user", "create-superuser", "--email", "a@example.org",
                   "--password", PASSWORD, "--name", "Admin")
    assert result.exit_code == 0
    row = context(config_path).store.get_user_by_email("a@example.org")
    assert row["id"] in result.stdout and row["api_key"] in result.stdout
    assert row["name"] == "Admin"
    assert PASSWORD not in result.output


@pytest.mark.parametrize("args, message", [
    (["--email", "admin@example.org", "--password", PASSWORD], "email already used"),
    (["--email", "ADMIN@example.org", "--password", PASSWORD], "email already used"),
    (["--email", "b@example.org", "--password", "short-1"], "password must be 14 to 24"),
    (["--email", "b@example.org", "--password", "onlyletterslong"], "password must mix"),
    (["--email", "not-an-email", "--password", PASSWORD], "email is not a valid address"),
])
def test_create_superuser_errors(config_path, args, message):
    superuser(config_path)
    result = agent("--config", config_path, "user", "create-superuser", *args)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    result = agent("--config", config_path, "--json", "user", "create-superuser", *args)
    assert result.exit_code == 1
    assert message in json.loads(result.stdout)["error"]
    assert len(context(config_path).store.list_users(include_inactive=True)) == 1


def test_create_superuser_needs_a_terminal_to_prompt(config_path):
    result = agent("--config", config_path, "user", "create-superuser", "--email", "a@example.org",
                   input=f"{PASSWORD}\n{PASSWORD}\n")
    assert result.exit_code == 2
    assert "--password is required" in result.stderr
    assert context(config_path).store.get_user_by_email("a@example.org") is None


@pytest.mark.parametrize("case", ["missing-config", "no-database", "no-key"])
def test_create_superuser_environment_errors_are_clean(tmp_path, case):
    path = str(tmp_path / "controller.ini")
    if case != "missing-config":
        values = cheap_config_values(tmp_path / "state")
        if case == "no-key":
            values["auth"]["secret_key_file"] = tmp_path / "nowhere" / "secret.key"
        write_config(values, path)
        if case == "no-key":
            json_out(agent("--config", path, "--json", "init"))
            os.remove(values["auth"]["secret_key_file"])
    result = agent("--config", path, "user", "create-superuser", "--email", "a@example.org", "--password", PASSWORD)
    assert result.exit_code == 1
    expected = {"missing-config": "config file not found", "no-database": "cloud-agent init",
                "no-key": "secret key file missing"}[case]
    assert expected in result.stderr
    assert result.stderr.startswith("error: ")


# -- the interactive prompt, on a real terminal -----------------------------------
def spawn(config_path: str, email: str) -> pexpect.spawn:
    assert AGENT.is_file(), f"{AGENT} is missing: run scripts/setup-host.sh"
    return pexpect.spawn(str(AGENT), ["--config", config_path, "--json", "user", "create-superuser", "--email", email],
                         timeout=30, encoding="utf-8")


def test_prompts_twice_for_the_password(config_path):
    child = spawn(config_path, "p@example.org")
    child.expect("Password: ")
    child.sendline(PASSWORD)
    child.expect("Repeat password: ")
    child.sendline(PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert PASSWORD not in child.before  # hidden input is not echoed
    out = json.loads(child.before[child.before.index("{"):])
    row = context(config_path).store.get_user(out["userid"])
    assert row["email"] == "p@example.org" and row["roles"] == ["superuser"]
    assert context(config_path).passwords.verify(row["password_hash"], PASSWORD)


def test_prompt_mismatch_asks_again(config_path):
    child = spawn(config_path, "m@example.org")
    child.expect("Password: ")
    child.sendline(PASSWORD)
    child.expect("Repeat password: ")
    child.sendline(PASSWORD + "x")
    child.expect("do not match")
    child.expect("Password: ")
    child.sendline("Second-pass-2026")
    child.expect("Repeat password: ")
    child.sendline("Second-pass-2026")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    row = context(config_path).store.get_user_by_email("m@example.org")
    assert context(config_path).passwords.verify(row["password_hash"], "Second-pass-2026")


def test_prompted_password_must_follow_the_rule(config_path):
    child = spawn(config_path, "r@example.org")
    child.expect("Password: ")
    child.sendline("too-short-1")
    child.expect("Repeat password: ")
    child.sendline("too-short-1")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "password must be 14 to 24 characters" in child.before
    assert "Traceback" not in child.before
    assert context(config_path).store.get_user_by_email("r@example.org") is None


# -- grant / revoke -----------------------------------------------------------
def api_view_as_superuser(config_path: str, admin: dict, userid: str) -> dict:
    from api.app import create_app

    client = testing.TestClient(create_app(context(config_path), interfaces=("user",)))
    token = user_envelope(client.simulate_post(
        "/v1/auth/token", json={"api_key": admin["api_key"], "api_secret": admin["api_secret"]}), 200, data=True)
    resp = client.simulate_get(f"/v1/user/view/{userid}",
                               headers={"X-Auth-Token": token["token"], "X-Auth-Cloudauth-Id": admin["userid"]})
    return user_envelope(resp, 200, data=True)["user"]


def test_grant_and_revoke_print_the_user_object(config_path):
    admin = superuser(config_path)
    other = superuser(config_path, "bob@example.org")
    ctx = context(config_path)
    ctx.store.update_user(other["userid"], {"roles": [], "owner_userid": admin["userid"]})

    out = json_out(agent("--config", config_path, "--json", "user", "grant", "bob@example.org", "create_user"))
    assert out == api_view_as_superuser(config_path, admin, other["userid"])
    assert out["roles"] == ["create_user"] and out["owner_userid"] == admin["userid"]
    assert context(config_path).store.get_user(other["userid"])["roles"] == ["create_user"]

    out = json_out(agent("--config", config_path, "--json", "user", "grant", "BOB@example.org", "view_user_secret"))
    assert out["roles"] == ["create_user", "view_user_secret"]
    # Granting a role it holds changes nothing.
    assert json_out(agent("--config", config_path, "user", "grant", "bob@example.org", "create_user", "--json")) == out

    out = json_out(agent("--config", config_path, "--json", "user", "revoke", "bob@example.org", "create_user"))
    assert out == api_view_as_superuser(config_path, admin, other["userid"])
    assert out["roles"] == ["view_user_secret"]
    assert context(config_path).store.get_user(other["userid"])["roles"] == ["view_user_secret"]
    # Revoking a role it does not hold changes nothing.
    assert json_out(agent("--config", config_path, "--json", "user", "revoke", "bob@example.org", "superuser")) == out
    assert "password" not in json.dumps(out) and other["api_secret"] not in json.dumps(out)


def test_grant_without_json_prints_the_roles(config_path):
    superuser(config_path)
    result = agent("--config", config_path, "user", "grant", "admin@example.org", "view_user")
    assert result.exit_code == 0
    assert "superuser" in result.stdout and "view_user" in result.stdout


@pytest.mark.parametrize("command", ["grant", "revoke"])
def test_grant_revoke_errors(config_path, command):
    superuser(config_path)
    result = agent("--config", config_path, "user", command, "nobody@example.org", "view_user")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "nobody@example.org" in result.stderr
    result = agent("--config", config_path, "user", command, "admin@example.org", "root")
    assert result.exit_code == 2
    assert "root" in result.stderr and "view_user" in result.stderr
    result = agent("--config", config_path, "user", command, "admin@example.org")
    assert result.exit_code == 2
    assert context(config_path).store.get_user_by_email("admin@example.org")["roles"] == ["superuser"]


# -- clean errors from the real command ---------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--config", "{missing}", "user", "grant", "a@example.org", "view_user"], "config file not found"),
    (["--config", "{missing}", "init"], "config file not found"),
    (["--config", "{config}", "user", "grant", "nobody@example.org", "view_user"], "no user with email"),
    (["--config", "{config}", "user", "create-superuser", "--email", "x@example.org"], "--password is required"),
    (["--config", "{config}", "user", "nonsense"], "No such command"),
    (["--config", "{config}", "--json", "user", "grant", "nobody@example.org", "view_user"], "no user with email"),
])
def test_real_command_errors_are_clean(tmp_path, config_path, args, message):
    argv = [a.format(missing=tmp_path / "missing.ini", config=config_path) for a in args]
    proc = subprocess.run([str(AGENT), *argv], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if "--json" in argv:
        assert message in json.loads(proc.stdout)["error"]


# -- help ---------------------------------------------------------------------
def _commands(group: click.Group, prefix=()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def test_every_command_has_help_text():
    commands = list(_commands(cli))
    names = {" ".join(path) for path, _ in commands}
    assert {"init", "serve", "user", "user create-superuser", "user grant", "user revoke"} <= names
    for path, command in commands:
        assert (command.help or "").strip(), f"`cloud-agent {' '.join(path)}` has no help text"
        result = agent(*path, "--help")
        assert result.exit_code == 0
        # click's \b marks a paragraph kept verbatim (examples); it is not shown.
        words = [w for w in command.help.split() if w != "\b"]
        assert " ".join(words[:6]) in " ".join(result.stdout.split())


@pytest.mark.parametrize("path", [("init",), ("serve",), ("user", "create-superuser"), ("user", "grant"),
                                  ("user", "revoke")])
def test_user_and_setup_commands_show_an_example_and_explain_options(path):
    result = agent(*path, "--help")
    assert "Example" in result.stdout and "cloud-agent " in result.stdout
    command = cli
    for name in path:
        command = command.commands[name]
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"`cloud-agent {' '.join(path)}` option {param.opts[0]} has no help"


def test_create_superuser_reads_the_password_from_a_file_or_stdin(tmp_path):
    import subprocess

    config = tmp_path / "c.ini"
    subprocess.run([str(AGENT), "--config", str(config), "init", "--sandbox", str(tmp_path / "s")], check=True,
                   capture_output=True)
    pw = tmp_path / "pw"
    pw.write_text("File-pass-2026!\n")
    made = subprocess.run([str(AGENT), "--config", str(config), "--json", "user", "create-superuser",
                           "--email", "f@example.org", "--password-file", str(pw)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    made = subprocess.run([str(AGENT), "--config", str(config), "--json", "user", "create-superuser",
                           "--email", "s@example.org", "--password-file", "-"], input="Stdin-pass-2026!\n",
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    from controller.config import load_config
    from controller.context import build_context

    ctx = build_context(load_config(str(config)))
    for email, password in (("f@example.org", "File-pass-2026!"), ("s@example.org", "Stdin-pass-2026!")):
        assert ctx.passwords.verify(ctx.store.get_user_by_email(email)["password_hash"], password)
    both = subprocess.run([str(AGENT), "--config", str(config), "user", "create-superuser", "--email",
                           "b@example.org", "--password", "x", "--password-file", str(pw)], capture_output=True,
                          text=True)
    assert both.returncode != 0 and "not both" in both.stderr
