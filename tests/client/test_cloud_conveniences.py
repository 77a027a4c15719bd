"""Help and conveniences of both commands (issue 29), no service needed: examples in --help
kept verbatim at any width, --version, `ls`/`rm`, fish completion, and the password
prompt that tells the rule first and asks twice."""

import inspect
import os
import subprocess

import click
import pexpect
from click.testing import CliRunner

from agent.cli import cli as agent_cli
from agent.cloud.cli import cli as cloud_cli
from tests.fixtures.agent import AGENT
from tests.fixtures.cloud import CLOUD


def _commands(group: click.Group, path=()):
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


def _example_lines(cmd: click.Command) -> list[str]:
    text = inspect.cleandoc(cmd.help or "")
    return [line.strip() for line in text.splitlines()
            if line.strip().startswith(("Example: ", "cloud ", "cloud-agent ", "eval "))]


def test_every_example_line_is_kept_verbatim_in_help_at_a_narrow_width():
    checked = 0
    for root in (cloud_cli, agent_cli):
        for path, cmd in _commands(root):
            out = CliRunner().invoke(root, [*path, "--help"], terminal_width=60).output
            shown = {line.strip() for line in out.splitlines()}
            for example in _example_lines(cmd):
                assert example in shown, (path, example, out)
                checked += 1
    assert checked > 80


def test_the_image_add_example_is_one_line_from_the_installed_command():
    out = subprocess.run([str(AGENT), "image", "add", "--help"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "COLUMNS": "80"}).stdout
    assert ("Example: cloud-agent image add --name \"Debian 12\" --os-name debian --os-major 12 --os-minor 7 "
            "--min-disk 2 --min-ram 512") in out.splitlines()[4]


def test_version_on_both_commands():
    for command, name in ((CLOUD, "cloud"), (AGENT, "cloud-agent")):
        proc = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and proc.stdout.startswith(f"{name}, version 0.")


def test_ls_and_rm_name_list_and_delete():
    for command, args, usage in ((CLOUD, ["server", "ls"], "cloud server list"),
                                 (CLOUD, ["volume", "rm"], "cloud volume delete"),
                                 (AGENT, ["image", "ls"], "cloud-agent image list"),
                                 (AGENT, ["flavor", "rm"], "cloud-agent flavor delete")):
        proc = subprocess.run([str(command), *args, "--help"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: {usage} "), proc.stdout + proc.stderr
    # Not listed twice in the group's help.
    listing = subprocess.run([str(CLOUD), "server", "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "  ls " not in listing and "  list " in listing


def test_volume_list_exists_and_takes_json():
    cmd = cloud_cli.commands["volume"].commands["list"]
    assert "--json" in [o for p in cmd.params for o in p.opts]


def test_fish_completion_script():
    fish = subprocess.run([str(CLOUD), "completion", "fish"], capture_output=True, text=True, timeout=30)
    assert fish.returncode == 0 and "_CLOUD_COMPLETE=fish_complete" in fish.stdout and "complete " in fish.stdout


def test_user_create_tells_the_password_rule_then_asks_twice(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CC_")}
    env.update({"CC_URL": "http://127.0.0.1:9", "CC_API_KEY": "k", "CC_API_SECRET": "s",
                "XDG_CONFIG_HOME": str(tmp_path)})
    child = pexpect.spawn(str(CLOUD), ["user", "create", "--email", "x@example.org"], env=env, encoding="utf-8",
                          timeout=30)
    child.expect("14 to 24 characters long and mixes at least two of: letters, digits, punctuation")
    child.expect("Password for the new user: ")
    child.sendline("First-pass-20266")
    child.expect("Repeat the password: ")
    child.sendline("Other-pass-20266")
    child.expect("Error: The two entered values do not match.")
    child.expect("Password for the new user: ")
    child.sendline("First-pass-20266")
    child.expect("Repeat the password: ")
    child.sendline("First-pass-20266")
    # Only then is the service asked (here: nothing listens, so it fails).
    child.expect("error: ")
    child.expect(pexpect.EOF)


def test_server_ssh_passes_its_options_on_to_ssh():
    # -f and -c are ssh's (and the remote command's) there, not output formats.
    cmd = cloud_cli.commands["server"].commands["ssh"]
    opts = [o for p in cmd.params for o in p.opts]
    assert "-c" not in opts and "-f" not in opts and "--json" in opts
    assert {"-f", "-c"} <= {o for p in cloud_cli.commands["server"].commands["list"].params for o in p.opts}
