"""`cloud-agent controller add | list | disable | enable | rotate-secret | remove` at cloud
auth: the real command on a real database, and the effect on a controller's calls."""

import sqlite3

import pytest
from falcon import testing

from tests.fixtures.agent import agent_call, agent_ok, run_agent
from tests.fixtures.api import config_values_for, make_caller, new_context, user_envelope


@pytest.fixture
def site(tmp_path):
    values = config_values_for(tmp_path)
    config = tmp_path / "controller.ini"
    ctx = new_context(values, path=config)
    yield ctx, config
    ctx.store.close()


def changes(ctx, controller_id, secret):
    from api.app import create_app

    client = testing.TestClient(create_app(ctx, interfaces=("user",)))
    return client.simulate_get("/v1/auth/changes", headers={"Authorization": f"Controller {controller_id}:{secret}"})


def test_add_list_disable_enable_rotate_remove(site):
    ctx, config = site
    made = agent_ok(config, "controller", "add", "hpc1", "--id", "2", "--url", "https://hpc1.example.org:8080/")
    assert set(made) == {"id", "name", "url", "secret"}
    assert (made["id"], made["name"], made["url"]) == (2, "hpc1", "https://hpc1.example.org:8080")
    assert made["secret"].startswith("ccs_") and len(made["secret"]) == 68
    # Only a hash is kept: the secret is nowhere in the database's files.
    ctx.store.close()
    for path in config.parent.glob("controller.db*"):
        assert made["secret"].encode() not in path.read_bytes()
    listed = agent_ok(config, "controller", "list")
    assert listed == {"controllers": [{"id": 2, "name": "hpc1", "url": "https://hpc1.example.org:8080",
                                       "enabled": True, "accounts": 0, "last_seen": None}]}
    user_envelope(changes(ctx, 2, made["secret"]), 200, data=True)
    assert agent_ok(config, "controller", "list")["controllers"][0]["last_seen"].endswith("Z")

    assert agent_ok(config, "controller", "disable", "2")["enabled"] is False
    user_envelope(changes(ctx, 2, made["secret"]), 403)
    assert agent_ok(config, "controller", "enable", "2")["enabled"] is True
    user_envelope(changes(ctx, 2, made["secret"]), 200, data=True)

    rotated = agent_ok(config, "controller", "rotate-secret", "2")
    assert set(rotated) == {"id", "secret"} and rotated["id"] == 2 and rotated["secret"] != made["secret"]
    user_envelope(changes(ctx, 2, made["secret"]), 401)
    user_envelope(changes(ctx, 2, rotated["secret"]), 200, data=True)

    # Refused while an account is registered for it; removed once none is.
    alice = make_caller(ctx, "alice@example.org")
    ctx.store.register_account(controller_id=2, username="alice", user_id=alice.id,
                               uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11", uid=20001, now="x")
    assert agent_ok(config, "controller", "list")["controllers"][0]["accounts"] == 1
    code, out = agent_call(config, "controller", "remove", "2", "--yes")
    assert code == 1 and "registered account" in out["error"]
    ctx.store.unregister_account(controller_id=2, username="alice")
    assert agent_ok(config, "controller", "remove", "2", "--yes")["id"] == 2
    assert agent_ok(config, "controller", "list") == {"controllers": []}
    user_envelope(changes(ctx, 2, rotated["secret"]), 401)
    # Each change is in the audit, never the secret.
    rows = ctx.store._all("SELECT action, target, detail FROM audit WHERE action LIKE 'cloud-agent controller%'")
    assert [r["action"] for r in rows] == [f"cloud-agent controller {c}" for c in (
        "add", "disable", "enable", "rotate-secret", "remove", "remove")]
    assert all(r["target"] == "2" for r in rows)
    assert made["secret"] not in str(rows) and rotated["secret"] not in str(rows)


def test_the_secret_is_printed_once_for_a_person(site):
    _, config = site
    proc = run_agent("--config", str(config), "controller", "add", "hpc1", "--id", "2", "--url", "https://h.example.org")
    assert proc.returncode == 0 and "shown once" in proc.stdout and "ccs_" in proc.stdout
    proc = run_agent("--config", str(config), "controller", "list")
    assert "hpc1" in proc.stdout and "ccs_" not in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["Bad_Name", "--id", "2", "--url", "https://h.example.org"], "controller names are"),
    (["hpc1", "--id", "0", "--url", "https://h.example.org"], "controller id"),
    (["hpc1", "--id", "2", "--url", "ftp://h.example.org"], "http"),
    (["hpc1", "--id", "2", "--url", "https://user:pw@h.example.org"], "no user"),
    (["hpc1", "--id", "2", "--url", "https://h.example.org/?x=1"], "query"),
    (["hpc1", "--id", "1", "--url", "https://h.example.org"], "this service's own"),
])
def test_bad_controllers_are_refused_and_nothing_is_made(site, args, message):
    ctx, config = site
    code, out = agent_call(config, "controller", "add", *args)
    assert code == 1 and message in out["error"], out
    assert ctx.store.list_controllers() == []


def test_a_second_controller_with_the_same_id_or_name(site):
    ctx, config = site
    agent_ok(config, "controller", "add", "hpc1", "--id", "2", "--url", "https://h.example.org")
    for args in (["hpc2", "--id", "2"], ["hpc1", "--id", "3"]):
        code, out = agent_call(config, "controller", "add", *args, "--url", "https://h2.example.org")
        assert code == 1 and "already" in out["error"]
    assert [c["id"] for c in agent_ok(config, "controller", "list")["controllers"]] == [2]


@pytest.mark.parametrize("command", ["disable", "enable", "rotate-secret", "remove"])
def test_an_unknown_controller(site, command):
    _, config = site
    code, out = agent_call(config, "controller", command, "7", *(["--yes"] if command == "remove" else []))
    assert code == 1 and "no controller 7" in out["error"]


def test_a_database_of_the_previous_version_is_migrated_and_its_users_are_in_the_snapshot(tmp_path):
    """The feed starts empty on an upgraded database: a controller's first read is a snapshot,
    which holds the users made before the upgrade."""
    from controller.cloud_auth import feed
    from controller.cloud_auth.callers import ControllerCaller
    from controller.store import migrations

    values = config_values_for(tmp_path)
    path = values["database"]["path"]
    conn = sqlite3.connect(path)
    before_cloud_auth = migrations.MIGRATIONS.index(migrations._M_CLOUD_AUTH)
    for version, script in enumerate(migrations.MIGRATIONS[:before_cloud_auth]):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version + 1};\nCOMMIT;")
    conn.execute("INSERT INTO users (id, email, password_hash, api_key, created_at_utc) "
                 "VALUES ('6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11', 'old@example.org', 'h', 'ak_x', 'then')")
    conn.commit()
    conn.close()
    ctx = new_context(values)  # migrates
    page = feed.changes(ctx, ControllerCaller(2, "hpc1"), since="0")
    assert page["reset"] is True and [u["email"] for u in page["users"]] == ["old@example.org"]
    assert page["seq"] == 0
    ctx.store.update_user("6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11", {"active": 0})
    after = feed.changes(ctx, ControllerCaller(2, "hpc1"), since="0", epoch=page["epoch"])
    assert after["reset"] is False and after["users"][0]["active"] == 0
    ctx.store.close()
