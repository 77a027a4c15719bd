"""A token's owner is remembered between requests only while nothing was written, here or in
any other process (controller.store.write_mark): revocations still end a token at once."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from controller.store import tokens as store_module
from controller.config import write_config
from controller.security.crypto import token_hash
from controller.store.write_mark import WriteMark
from tests.fixtures.agent import AGENT
from tests.fixtures.api import PASSWORD, make_caller, user_envelope
from tests.security.test_auth_tokens import whoami

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def alice(ctx):
    return make_caller(ctx, "alice@example.org", roles=("create_user",))


def statements(store, call):
    """call()'s result and the SQL statements it ran in this thread."""
    ran = []
    store.conn.set_trace_callback(ran.append)
    try:
        return call(), ran
    finally:
        store.conn.set_trace_callback(None)


def owner(store, caller, *, now=None):
    return store.token_owner(token_hash(caller.token), now=int(time.time()) if now is None else now)


def create_bob(user_client, caller):
    """A request only the create_user role allows."""
    return user_client.simulate_post("/v1/user/create", headers=caller.headers,
                                     json={"email": "bob@example.org", "password": PASSWORD})


def test_a_remembered_owner_costs_no_statement_until_a_write(ctx, alice):
    first, ran = statements(ctx.store, lambda: owner(ctx.store, alice))
    assert first == {"id": alice.id, "roles": ["create_user"]} and len(ran) == 1
    again, ran = statements(ctx.store, lambda: owner(ctx.store, alice))
    assert again == first and ran == []
    ctx.store.purge_expired_tokens(now=0)  # any committed write, even one that changes no row
    again, ran = statements(ctx.store, lambda: owner(ctx.store, alice))
    assert again == first and len(ran) == 1


def test_what_is_remembered_is_not_what_callers_change(ctx, alice):
    owner(ctx.store, alice)["roles"].append("superuser")
    assert owner(ctx.store, alice)["roles"] == ["create_user"]


def test_a_remembered_token_still_expires(ctx, alice):
    expires_at = ctx.store._one("SELECT expires_at FROM tokens WHERE token_hash = ?",
                                (token_hash(alice.token),))["expires_at"]
    assert owner(ctx.store, alice, now=expires_at - 1) is not None
    assert owner(ctx.store, alice, now=expires_at) is None


def test_nothing_is_remembered_longer_than_its_time(ctx, alice, monkeypatch):
    owner(ctx.store, alice)
    later = time.monotonic() + store_module.TOKEN_MEMO_SECONDS + 1
    monkeypatch.setattr(store_module.time, "monotonic", lambda: later)
    _, ran = statements(ctx.store, lambda: owner(ctx.store, alice))
    assert len(ran) == 1


def test_unknown_tokens_are_not_remembered(ctx):
    for i in range(3):
        assert ctx.store.token_owner(f"{i:064x}", now=int(time.time())) is None
    assert ctx.store._token_memo == {}


@pytest.mark.parametrize("change", ["deactivate", "reset secret", "delete tokens", "take role"])
def test_another_process_ends_a_remembered_token_at_once(ctx, user_client, alice, change):
    user_envelope(whoami(user_client, alice.token, alice.id), 200, data=True)  # remembered now
    script = {
        "deactivate": f"s.update_user({alice.id!r}, {{'active': 0}})",
        "reset secret": f"s.set_api_secret({alice.id!r}, None)",
        "delete tokens": "\n".join(["with s.write() as c:", "    c.execute('DELETE FROM tokens')"]),
        "take role": f"s.update_user({alice.id!r}, {{'roles': []}})",
    }[change]
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from controller.store import Store
        s = Store({ctx.store.path!r})
    """) + script], check=True, cwd=ROOT, timeout=60)
    if change == "take role":
        user_envelope(create_bob(user_client, alice), 403)
    else:
        user_envelope(whoami(user_client, alice.token, alice.id), 401)


def test_cloud_agent_revoking_a_role_ends_it_for_the_running_service(ctx, config_values, tmp_path, user_client, alice):
    user_envelope(whoami(user_client, alice.token, alice.id), 200, data=True)  # remembered now
    config = tmp_path / "controller.ini"
    write_config(config_values, str(config))
    subprocess.run([str(AGENT), "--config", str(config), "user", "revoke", "--userid", alice.id, "create_user"],
                   check=True, capture_output=True, timeout=60)
    user_envelope(create_bob(user_client, alice), 403)


def test_write_marks_of_one_database_see_each_others_changes(tmp_path):
    path = str(tmp_path / "controller.db")
    a, b = WriteMark(path), WriteMark(path)
    assert a.usable and b.usable and a.read() == b.read()
    seen = a.read()
    b.change()
    assert a.read() != seen and a.read() == b.read()
    assert os.stat(f"{path}-mark").st_size == 8 and os.stat(f"{path}-mark").st_mode & 0o777 == 0o600


def test_a_mark_belongs_to_whoever_owns_the_database(tmp_path):
    database = tmp_path / "controller.db"
    database.write_bytes(b"")
    database.chmod(0o660)
    if os.geteuid() == 0:
        os.chown(database, 4321, 4322)
    assert WriteMark(str(database)).usable
    mark = os.stat(f"{database}-mark")
    assert mark.st_mode & 0o777 == 0o660  # the database's mode exactly, as SQLite's -wal and -shm
    if os.geteuid() == 0:
        assert (mark.st_uid, mark.st_gid) == (4321, 4322)


def test_a_mark_that_cannot_be_used_makes_every_lookup_read_the_database(ctx, alice, tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"")
    target = Path(f"{ctx.store.path}-mark")
    target.unlink(missing_ok=True)
    target.symlink_to(tmp_path / "elsewhere")  # never followed
    ctx.store._mark = None
    assert not ctx.store.write_mark.usable
    for _ in range(2):
        got, ran = statements(ctx.store, lambda: owner(ctx.store, alice))
        assert got["id"] == alice.id and len(ran) == 1
    assert (tmp_path / "elsewhere").read_bytes() == b""
    ctx.store.update_user(alice.id, {"active": 0})  # a write without a usable mark still works
    assert owner(ctx.store, alice) is None


# -- the mark's mode is the database's (issue 16, finding 15) --------------------------------------
def _init(config: Path, state: Path, *args: str, umask: int = 0o022) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLOUD_CONTROLLER_CONFIG"}
    subprocess.run([str(AGENT), "--config", str(config), "init", *args], check=True, capture_output=True,
                   timeout=120, env=env, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(umask))


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o000], ids=["umask-022", "umask-002", "umask-000"])
def test_init_makes_the_mark_as_private_as_the_database(tmp_path, umask):
    config, state = tmp_path / "c.ini", tmp_path / "state"
    _init(config, state, "--sandbox", str(state), umask=umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in state.iterdir() if p.name.startswith("controller.db")}
    assert modes == {"controller.db": 0o600, "controller.db-mark": 0o600}


def test_init_narrows_a_mark_left_readable_by_an_older_version(tmp_path):
    config, state = tmp_path / "c.ini", tmp_path / "state"
    _init(config, state, "--sandbox", str(state))
    database, mark = state / "controller.db", state / "controller.db-mark"
    database.chmod(0o644)
    mark.chmod(0o644)
    _init(config, state)
    assert (database.stat().st_mode & 0o777, mark.stat().st_mode & 0o777) == (0o600, 0o600)


def test_a_mark_wider_than_its_database_is_narrowed_when_opened(tmp_path):
    database = tmp_path / "controller.db"
    database.write_bytes(b"")
    database.chmod(0o600)
    mark = tmp_path / "controller.db-mark"
    mark.write_bytes(os.urandom(8))
    mark.chmod(0o666)
    assert WriteMark(str(database)).usable
    assert mark.stat().st_mode & 0o777 == 0o600


def test_a_mark_that_cannot_be_narrowed_is_not_used(tmp_path, monkeypatch):
    database = tmp_path / "controller.db"
    database.write_bytes(b"")
    database.chmod(0o600)
    mark = tmp_path / "controller.db-mark"
    mark.write_bytes(os.urandom(8))
    mark.chmod(0o646)  # anyone may write it: a reader's remembered tokens could be kept alive

    def refuse(fd, mode):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refuse)
    assert not WriteMark(str(database)).usable
