"""Ownership gives no authority over a managed user holding roles its owner lacks (issue 8,
finding 3): a role grant that would give the owner such authority detaches the user, a revoke
detaches the owner's managed users that keep the role, and the checks in permissions.py refuse a
link that breaks the rule anyway (one made before it).
"""

import json
import sqlite3

import pytest
from click.testing import CliRunner

from agent.cli import cli
from controller.store import migrations
from controller.users import users
from controller.config import write_config
from controller.errors import InvalidInput
from tests.fixtures.api import PASSWORD, enable, give_volume, make_caller, user_envelope


def agent(config_values, tmp_path, *args):
    """cloud-agent in process, on the database of the test's context."""
    path = tmp_path / "controller.ini"
    if not path.exists():
        write_config(config_values, str(path))
    result = CliRunner().invoke(cli, ["--config", str(path), *args], prog_name="cloud-agent")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def grant(config_values, tmp_path, email, role, *, revoke=False):
    result = agent(config_values, tmp_path, "--json", "user", "revoke" if revoke else "grant", email, role)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def owner(ctx):
    """A user that may create users and read its managed users' API secrets."""
    return make_caller(ctx, "owner@example.org", roles=("create_user", "view_user_secret"))


def create_managed(client, owner, email="managed@example.org") -> str:
    r = client.simulate_post("/v1/user/create", headers=owner.headers,
                             json={"email": email, "password": PASSWORD, "owner_userid": owner.id})
    return user_envelope(r, 200, data=True)["userid"]


def listed(client, who) -> list[str]:
    return [u["id"] for u in user_envelope(client.simulate_get("/v1/user/list", headers=who.headers), 200,
                                           data=True)["users"]]


# -- the user interface -----------------------------------------------------------------
def test_owner_reads_no_secret_of_its_managed_user_once_that_user_is_superuser(
        ctx, config_values, tmp_path, user_client, owner):
    managed = create_managed(user_client, owner)
    secret_path = f"/v1/user/view_api_secret/{managed}"
    assert user_envelope(user_client.simulate_get(secret_path, headers=owner.headers), 200, data=True)["api_secret"]

    grant(config_values, tmp_path, "managed@example.org", "superuser")

    # Before the fix: 200 and the superuser's secret, then its email and a takeover.
    user_envelope(user_client.simulate_get(secret_path, headers=owner.headers), 403)
    user_envelope(user_client.simulate_get(f"/v1/user/view/{managed}", headers=owner.headers), 403)
    r = user_client.simulate_post(f"/v1/user/update/{managed}", headers=owner.headers,
                                  json={"email": "owner-controls@example.org"})
    user_envelope(r, 403)
    assert listed(user_client, owner) == [owner.id]
    found = user_client.simulate_get("/v1/user/search", headers=owner.headers,
                                     params={"email": "managed@example.org"})
    assert user_envelope(found, 200, data=True)["users"] == []
    stored = ctx.store.get_user(managed)
    assert stored["email"] == "managed@example.org" and stored["owner_userid"] is None
    assert stored["roles"] == ["superuser"]


def test_a_link_that_breaks_the_rule_gives_no_authority(ctx, user_client, owner):
    """A link made before the rule (or by any path that forgot to cut it) is refused by the checks
    themselves, not only by the grant that cuts links."""
    managed = create_managed(user_client, owner)
    plain = create_managed(user_client, owner, "plain@example.org")
    ctx.store.update_user(managed, {"roles": ["view_user_secret", "update_user"]})  # update_user: owner lacks it
    assert ctx.store.get_user(managed)["owner_userid"] == owner.id

    user_envelope(user_client.simulate_get(f"/v1/user/view_api_secret/{managed}", headers=owner.headers), 403)
    user_envelope(user_client.simulate_get(f"/v1/user/view/{managed}", headers=owner.headers), 403)
    user_envelope(user_client.simulate_post(f"/v1/user/update/{managed}", headers=owner.headers,
                                            json={"name": "renamed"}), 403)
    assert ctx.store.get_user(managed)["name"] == ""
    assert listed(user_client, owner) == [owner.id, plain]
    # Roles the owner holds too leave its authority as it was.
    ctx.store.update_user(managed, {"roles": ["view_user_secret"]})
    user_envelope(user_client.simulate_get(f"/v1/user/view_api_secret/{managed}", headers=owner.headers), 200,
                  data=True)
    assert listed(user_client, owner) == [owner.id, managed, plain]


def test_a_superuser_owner_keeps_its_managed_users_whatever_their_roles(ctx, config_values, tmp_path, user_client):
    boss = make_caller(ctx, "boss@example.org", roles=("superuser",))
    managed = create_managed(user_client, boss)
    out = grant(config_values, tmp_path, "managed@example.org", "superuser")
    assert out["owner_userid"] == boss.id and out["roles"] == ["superuser"]
    assert ctx.store.get_user(managed)["owner_userid"] == boss.id


def test_a_role_the_owner_holds_keeps_the_link(ctx, config_values, tmp_path, user_client, owner):
    managed = create_managed(user_client, owner)
    out = grant(config_values, tmp_path, "managed@example.org", "view_user_secret")
    assert out["owner_userid"] == owner.id
    user_envelope(user_client.simulate_get(f"/v1/user/view/{managed}", headers=owner.headers), 200, data=True)


def test_new_managed_users_cannot_start_with_a_role_their_owner_lacks(ctx, owner):
    with pytest.raises(InvalidInput, match="role its owner lacks"):
        users.insert_user(ctx, email="x@example.org", password=PASSWORD, owner_userid=owner.id,
                          roles=("superuser",))
    assert ctx.store.get_user_by_email("x@example.org") is None
    row, _ = users.insert_user(ctx, email="y@example.org", password=PASSWORD, owner_userid=owner.id,
                               roles=("view_user_secret",))
    assert row["owner_userid"] == owner.id


# -- what the agent prints ---------------------------------------------------------------
def test_grant_prints_the_detachment(ctx, config_values, tmp_path, user_client, owner):
    managed = create_managed(user_client, owner)
    result = agent(config_values, tmp_path, "--json", "user", "grant", "managed@example.org", "superuser")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    # The user object, as the API gives it to a superuser: no owner any more.
    assert obj["id"] == managed and "owner_userid" not in obj and obj["roles"] == ["superuser"]
    assert result.stderr == ("note: managed@example.org is detached from its owner owner@example.org, "
                             "which lacks a role it now holds\n")

    create_managed(user_client, owner, "second@example.org")
    result = agent(config_values, tmp_path, "user", "grant", "second@example.org", "update_user")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("second@example.org: roles update_user\n"
                             "note: second@example.org is detached from its owner owner@example.org, "
                             "which lacks a role it now holds\n")


def test_revoking_a_role_from_an_owner_detaches_managed_users_that_hold_it(
        ctx, config_values, tmp_path, user_client, owner):
    keeps = create_managed(user_client, owner, "keeps@example.org")
    holds = create_managed(user_client, owner, "holds@example.org")
    assert grant(config_values, tmp_path, "holds@example.org", "view_user_secret")["owner_userid"] == owner.id

    result = agent(config_values, tmp_path, "user", "revoke", "owner@example.org", "view_user_secret")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("owner@example.org: roles create_user\n"
                             "note: holds@example.org is detached from its owner owner@example.org, "
                             "which no longer holds every role it holds\n")
    assert ctx.store.get_user(holds)["owner_userid"] is None
    assert ctx.store.get_user(keeps)["owner_userid"] == owner.id
    assert listed(user_client, owner) == [owner.id, keeps]


# -- the controller: visibility, mutation and grants follow the cut link --------------------
def test_owner_loses_the_resources_and_accounts_of_a_managed_user_made_superuser(
        cctx, config_values, tmp_path, client, catalog):
    owner = make_caller(cctx, "owner@example.org")
    managed = make_caller(cctx, "managed@example.org", owner=owner)
    enable(cctx, owner, username="owner")
    managed_account = enable(cctx, managed, username="managed")
    for caller in (owner, managed):
        give_volume(client, caller)
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]}
    r = client.simulate_post("/v1/server-instance", headers=managed.headers, json=body)
    assert r.status_code == 201, r.json
    theirs = r.json["data"][0]["id"]
    r = client.simulate_post("/v1/server-instance", headers=owner.headers, json=body)
    assert r.status_code == 201, r.json
    mine = r.json["data"][0]["id"]
    assert client.simulate_get(f"/v1/server-instance/{theirs}", headers=owner.headers).status_code == 200

    grant(config_values, tmp_path, "managed@example.org", "superuser")

    assert client.simulate_get(f"/v1/server-instance/{theirs}", headers=owner.headers).status_code == 404
    assert client.simulate_delete(f"/v1/server-instance/{theirs}", headers=owner.headers).status_code == 404
    assert cctx.store.list_instances(visible_to=None, instance_id=theirs)
    assert client.simulate_get("/v1/storage-volume", headers=owner.headers).json["data"][0]["cloudauth-id"] == owner.id
    assert len(client.simulate_get("/v1/storage-volume", headers=owner.headers).json["data"]) == 1
    task = {"task": {"what": "modify-users", "how": "add", "users": [managed_account["uuid"]]}}
    r = client.simulate_put(f"/v1/server-instance/{mine}", headers=owner.headers, json=task)
    assert r.status_code == 403, r.json
    assert cctx.store.list_instances(visible_to=None, instance_id=mine)[0]["users"] == [
        a["uuid"] for a in cctx.store.list_accounts() if a["username"] == "owner"]
    r = client.simulate_post("/v1/group", headers=owner.headers,
                             json={"group-name": "lab", "group-members": ["managed"]})
    assert r.status_code == 403, r.json
    assert cctx.store.list_groups(visible_to=None) == []


# -- databases made before the rule ---------------------------------------------------------
def test_the_migration_cuts_links_made_before_the_rule(tmp_path):
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    mine = migrations.MIGRATIONS.index(migrations._M7_AUTH_HARDENING)
    for version, script in enumerate(migrations.MIGRATIONS[:mine]):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version + 1};\nCOMMIT;")
    rows = [  # id, roles, owner
        ("boss", ["superuser"], None), ("a", ["view_user"], "boss"),
        ("o1", ["view_user"], None), ("a1", ["view_user"], "o1"),
        ("o2", [], None), ("a2", ["superuser"], "o2"),
        ("o3", ["create_user"], None), ("a3", ["create_user", "view_user_secret"], "o3"),
        ("o4", [], None), ("a4", [], "o4"),
    ]
    for user_id, roles, owner in rows:
        conn.execute("INSERT INTO users (id, email, password_hash, owner_userid, roles, api_key, created_at_utc) "
                     "VALUES (?, ?, 'x', ?, ?, ?, '2026-01-01T00:00:00Z')",
                     (user_id, f"{user_id}@example.org", owner, json.dumps(roles), f"ak_{user_id}"))
    migrations.migrate(conn)
    owners = dict(conn.execute("SELECT id, owner_userid FROM users WHERE id LIKE 'a%'").fetchall())
    assert owners == {"a": "boss", "a1": "o1", "a2": None, "a3": None, "a4": "o4"}
    assert conn.execute("SELECT COUNT(*) FROM email_reservations").fetchone()[0] == 0
