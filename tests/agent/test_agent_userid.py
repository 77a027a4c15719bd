"""Admin commands name a user by email or by id (issue 8, finding 10).

A user may change its email, so every agent command that looks a user up by
email also takes `--userid UUID` (exactly one of the two), looks the user up
once and acts by id; while it acts, the address it resolved is reserved: no
other user can take it through /user/update or /user/create (409). The agent
runs as the real `cloud-agent` in a subprocess.
"""

import getpass
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from controller.users import users
from controller.config import load_config
from controller.context import build_context
from controller.errors import Conflict, NotFound
from tests.fixtures.api import user_envelope
from tests.agent.test_agent_controller import (  # noqa: F401 (fixtures)
    BOB_EMAIL,
    UNKNOWN_UUID,
    USER_PASSWORD,
    add_image,
    api,
    login,
    sandbox,
    sandbox_template,
)
from tests.fixtures.agent import AGENT

AGENT_ACTOR = f"cloud-agent:{getpass.getuser()}"


@pytest.fixture
def bob(sandbox) -> str:
    return sandbox.rows("SELECT id FROM users WHERE email = ?", (BOB_EMAIL,))[0]["id"]


def agent_rows(sandbox, action: str) -> list[tuple]:
    return [(r["actor"], r["target"], r["result"], r["detail"])
            for r in sandbox.rows("SELECT * FROM audit WHERE action = ? ORDER BY id", (action,))]


# -- every command that looks a user up by email also takes --userid ------------------------
def test_user_grant_and_revoke_by_userid(sandbox, api, bob):
    out = sandbox.ok("user", "grant", "--userid", bob, "view_user")
    assert out == api.user(bob) and out["roles"] == ["view_user"]
    # Upper-case spells the same id (RFC 4122).
    out = sandbox.ok("user", "grant", "view_user_secret", "--userid", bob.upper())
    assert out["roles"] == ["view_user", "view_user_secret"]
    out = sandbox.ok("user", "revoke", "--userid", bob, "view_user")
    assert out == api.user(bob) and out["roles"] == ["view_user_secret"]
    assert json.loads(sandbox.rows("SELECT roles FROM users WHERE id = ?", (bob,))[0]["roles"]) == [
        "view_user_secret"]
    assert agent_rows(sandbox, "cloud-agent user revoke") == [(AGENT_ACTOR, bob, "ok", "role=view_user")]


def test_account_enable_and_disable_by_userid(sandbox, api, bob):
    out = sandbox.ok("account", "enable", "--userid", bob, "--username", "bob")
    [row] = sandbox.rows("SELECT * FROM system_accounts")
    assert row["user_id"] == bob and "bob" in sandbox.entries("passwd")
    assert api.user(bob)["system_accounts"] == [out]
    proc = sandbox.run("account", "enable", "--userid", bob, "--username", "bob2")
    assert proc.returncode == 1 and proc.stderr == f"error: {BOB_EMAIL} already has a system account on this controller\n"

    assert sandbox.ok("account", "disable", "--userid", bob, "--yes") == out
    assert sandbox.rows("SELECT * FROM system_accounts") == []
    assert "bob" not in sandbox.entries("passwd") and "bob" not in sandbox.entries("group")
    assert [r[:3] for r in agent_rows(sandbox, "cloud-agent account enable")] == [
        (AGENT_ACTOR, bob, "ok"), (AGENT_ACTOR, bob, f"error: {BOB_EMAIL} already has a system account on this "
                                                      "controller")]
    assert [r[:3] for r in agent_rows(sandbox, "cloud-agent account disable")] == [(AGENT_ACTOR, bob, "ok")]


def test_image_grant_by_userid(sandbox, api, bob):
    image = add_image(sandbox, "--private")
    out = sandbox.ok("image", "grant", image["id"], "--userid", bob)
    assert out == image
    assert sandbox.rows("SELECT * FROM image_access") == [{"image_id": image["id"], "user_id": bob}]
    bob_headers = login(api.client, {"email": BOB_EMAIL, "password": USER_PASSWORD})
    assert api.get(f"/v1/server-image/{image['id']}", headers=bob_headers)["id"] == image["id"]
    assert agent_rows(sandbox, "cloud-agent image grant") == [(AGENT_ACTOR, bob, "ok", f"image_id={image['id']}")]


def test_commands_by_email_record_the_user_id(sandbox, bob):
    image = add_image(sandbox, "--private")
    sandbox.ok("image", "grant", image["id"], BOB_EMAIL)
    assert agent_rows(sandbox, "cloud-agent image grant") == [
        (AGENT_ACTOR, bob, "ok", f"email={BOB_EMAIL} image_id={image['id']}")]


COMMANDS = [
    ("user", "grant", "{email}", "view_user"),
    ("user", "revoke", "{email}", "view_user"),
    ("account", "enable", "{email}", "--username", "bob"),
    ("account", "disable", "{email}", "--yes"),
    ("image", "grant", "{image}", "{email}"),
]


def _argv(command, image_id: str, email: str | None, *extra: str) -> list[str]:
    out = []
    for word in command:
        if word == "{email}":
            if email is not None:
                out.append(email)
        else:
            out.append(word.format(image=image_id))
    return out + list(extra)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("case", ["both", "neither", "malformed"])
def test_exactly_one_of_email_and_userid_else_a_usage_error(sandbox, bob, command, case):
    image = add_image(sandbox, "--private")
    before = sandbox.snapshot(), sandbox.rows("SELECT roles FROM users ORDER BY id")
    audit_rows = len(sandbox.rows("SELECT * FROM audit"))
    email, extra = {"both": (BOB_EMAIL, ["--userid", bob]), "neither": (None, []),
                    "malformed": (None, ["--userid", "not-a-uuid"])}[case]
    proc = sandbox.run("--json", *_argv(command, image["id"], email, *extra))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error" in json.loads(proc.stdout)
    assert ("not-a-uuid" if case == "malformed" else "--userid") in proc.stderr
    assert (sandbox.snapshot(), sandbox.rows("SELECT roles FROM users ORDER BY id")) == before
    assert len(sandbox.rows("SELECT * FROM audit")) == audit_rows


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_unknown_userid_is_a_clean_error_that_changes_nothing(sandbox, bob, command):
    image = add_image(sandbox, "--private")
    before = sandbox.snapshot(), sandbox.rows("SELECT roles FROM users ORDER BY id")
    message = sandbox.error(*_argv(command, image["id"], None, "--userid", UNKNOWN_UUID))
    assert message == f"error: user {UNKNOWN_UUID} does not exist"
    assert (sandbox.snapshot(), sandbox.rows("SELECT roles FROM users ORDER BY id")) == before
    assert sandbox.rows("SELECT * FROM email_reservations") == []


# -- the reservation ----------------------------------------------------------------------
def _blocking_useradd(tmp_path: Path) -> tuple[dict, Path, Path]:
    """A `useradd` first on PATH that says it started and waits for a go before running the real one."""
    real = shutil.which("useradd")
    assert real, "useradd is needed (the sandbox's local directory uses it)"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started, go = tmp_path / "started", tmp_path / "go"
    wrapper = bin_dir / "useradd"
    wrapper.write_text(f'#!/bin/sh\ntouch "{started}"\nwhile [ ! -e "{go}" ]; do sleep 0.05; done\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, started, go


def _update(api, who_headers: dict, userid: str, email: str):
    return api.client.simulate_post(f"/v1/user/update/{userid}", headers=who_headers, json={"email": email})


def test_an_email_the_agent_resolved_cannot_be_taken_while_it_acts(sandbox, api, bob, tmp_path):
    """`account enable bob@...` has looked bob up and waits in useradd. Meanwhile bob gives the
    address up and mallory asks for it: refused, so the address the admin typed never names
    anyone but bob while the command runs; the account goes to bob."""
    mallory = api.create_user("mallory@example.org")
    mallory_headers = login(api.client, {"email": "mallory@example.org", "password": USER_PASSWORD})
    bob_headers = login(api.client, {"email": BOB_EMAIL, "password": USER_PASSWORD})
    path_env, started, go = _blocking_useradd(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "CLOUD_CONTROLLER_CONFIG"}
    env.update(path_env, CLOUD_CONTROLLER_CONFIG=sandbox.config)
    proc = subprocess.Popen([str(AGENT), "--json", "account", "enable", BOB_EMAIL, "--username", "bob"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent never reached useradd"
            time.sleep(0.02)
        # The agent is between its look-up and its write.
        user_envelope(_update(api, bob_headers, bob, "bob-new@example.org"), 200)  # bob may leave it
        r = _update(api, mallory_headers, mallory, "BOB@example.org")
        user_envelope(r, 409)
        assert "reserved" in r.json["message"]
        r = api.client.simulate_post("/v1/user/create", headers=api.headers,
                                     json={"email": BOB_EMAIL, "password": USER_PASSWORD})
        user_envelope(r, 409)
        assert sandbox.rows("SELECT email FROM users WHERE id = ?", (mallory,)) == [{"email": "mallory@example.org"}]
        assert sandbox.rows("SELECT id FROM users WHERE email = ?", (BOB_EMAIL,)) == []
        [held] = sandbox.rows("SELECT email, user_id, holder FROM email_reservations")
        assert held == {"email": BOB_EMAIL, "user_id": bob, "holder": held["holder"]}
        assert held["holder"].startswith("cloud-agent account enable")
    finally:
        go.touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    [row] = sandbox.rows("SELECT user_id, username, uuid FROM system_accounts")
    assert row["user_id"] == bob and json.loads(out)["uuid"] == row["uuid"]
    assert [r[:3] for r in agent_rows(sandbox, "cloud-agent account enable")] == [(AGENT_ACTOR, bob, "ok")]
    # Released with the command: the address is free again.
    assert sandbox.rows("SELECT * FROM email_reservations") == []
    user_envelope(_update(api, mallory_headers, mallory, BOB_EMAIL), 200)


@pytest.fixture
def ctx(sandbox):
    context = build_context(load_config(sandbox.config))
    yield context
    context.store.close()


def test_a_reservation_binds_the_address_not_the_user(ctx, api, bob):
    carol = api.create_user("carol@example.org")
    with users.admin_target(ctx, holder="test", email="BOB@example.org") as user:
        assert user["id"] == bob
        # The user itself may change its own address, in any case spelling.
        ctx.store.update_user(bob, {"email": "Bob@Example.org"})
        ctx.store.update_user(bob, {"email": "bob2@example.org"})
        with pytest.raises(Conflict, match="reserved"):
            ctx.store.update_user(carol, {"email": "bob@EXAMPLE.org"})
        with pytest.raises(Conflict, match="reserved"):
            users.insert_user(ctx, email=BOB_EMAIL, password=USER_PASSWORD)
    assert ctx.store.get_user(carol)["email"] == "carol@example.org"
    ctx.store.update_user(carol, {"email": BOB_EMAIL})
    assert ctx.store.get_user_by_email(BOB_EMAIL)["id"] == carol


def test_a_reservation_ends_with_the_command_or_its_expiry(ctx, api, bob):
    carol = api.create_user("carol@example.org")
    with pytest.raises(RuntimeError):
        with users.admin_target(ctx, holder="test", userid=bob):
            raise RuntimeError("the command failed")
    assert ctx.store.conn.execute("SELECT COUNT(*) FROM email_reservations").fetchone()[0] == 0
    with pytest.raises(NotFound):
        with users.admin_target(ctx, holder="test", email="nobody@example.org"):
            pass
    # A command killed before it released holds the address only until the expiry.
    ctx.store.reserve_user_email(reservation_id="killed", holder="test", expires_at=int(time.time()) - 1,
                                 user_id=bob)
    ctx.store.update_user(bob, {"email": "bob2@example.org"})
    ctx.store.update_user(carol, {"email": BOB_EMAIL})
    assert ctx.store.get_user(carol)["email"] == BOB_EMAIL
