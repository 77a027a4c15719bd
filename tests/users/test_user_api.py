"""The cloud auth user interface: every endpoint, and who may call it (spec 4.6, docs/api.md)."""

import os
import re
import uuid
from dataclasses import dataclass

import pytest
from falcon import inspect as falcon_inspect
from jsonschema import Draft202012Validator

from tests.fixtures.api import PASSWORD, Caller, make_caller, user_envelope

NEW_PASSWORD = "Another-pass-77"
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
BASE_FIELDS = {"id", "email", "name", "active", "system_accounts", "created_at_utc"}
SUPERUSER_FIELDS = {"api_key", "num_owned_accounts", "roles", "registration_source"}
PERMISSION_ROLES = ("view_user", "create_user", "update_user", "view_user_secret")

# Everyone who calls in the matrix: the target is owned by `owner`; each role
# holder owns nobody, so a role alone must never widen what it may touch.
REQUESTERS = ("superuser", "owner", "self", "stranger", *PERMISSION_ROLES)
MANAGERS = {"superuser", "owner", "self"}


@dataclass
class World:
    callers: dict[str, Caller]

    def __getitem__(self, name: str) -> Caller:
        return self.callers[name]

    @property
    def target(self) -> Caller:
        return self.callers["self"]


@pytest.fixture
def world(ctx, admin) -> World:
    owner = make_caller(ctx, "owner@example.org")
    callers = {
        "superuser": admin,
        "owner": owner,
        "self": make_caller(ctx, "target@example.org", owner=owner),
        "stranger": make_caller(ctx, "stranger@example.org"),
    }
    for role in PERMISSION_ROLES:
        callers[role] = make_caller(ctx, f"{role.replace('_', '-')}@example.org", roles=(role,))
    return World(callers)


def check_user_object(obj: dict, row: dict, *, superuser_view: bool) -> None:
    """A user object as the API shows it matches the stored row and never holds the password."""
    expected = set(BASE_FIELDS)
    if row["owner_userid"]:
        expected.add("owner_userid")
    if superuser_view:
        expected |= SUPERUSER_FIELDS
    assert set(obj) == expected
    assert "password" not in obj and "password_hash" not in obj
    for key in ("id", "email", "name", "active", "created_at_utc"):
        assert obj[key] == row[key]
    assert RFC3339_UTC.match(obj["created_at_utc"])
    assert isinstance(obj["system_accounts"], list)
    if row["owner_userid"]:
        assert obj["owner_userid"] == row["owner_userid"]
    if superuser_view:
        assert obj["api_key"] == row["api_key"]
        assert obj["roles"] == sorted(row["roles"])
        assert obj["registration_source"] == row["registration_source"]


def add_account(ctx, user_id: str, username: str) -> dict:
    return ctx.store.insert_account({
        "user_id": user_id, "username": username, "uuid": str(uuid.uuid4()), "uid": 20001,
        "gid": 20001, "home": f"/home/{username}", "cloud_controller_id": 1,
        "created_at_utc": "2026-01-01T00:00:00Z",
    })


# -- view ---------------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("requester", REQUESTERS)
def test_view_user(ctx, user_client, world, requester, method):
    target = world.target
    resp = user_client.simulate_request(method, f"/v1/user/view/{target.id}", headers=world[requester].headers)
    if requester in MANAGERS:
        data = user_envelope(resp, 200, data=True)
        assert set(data) == {"user"}
        check_user_object(data["user"], ctx.store.get_user(target.id), superuser_view=requester == "superuser")
    else:
        user_envelope(resp, 403)


def test_view_shows_system_accounts_and_owned_count(ctx, user_client, world):
    account = add_account(ctx, world.target.id, "tgt")
    resp = user_client.simulate_get(f"/v1/user/view/{world.target.id}", headers=world["owner"].headers)
    user = user_envelope(resp, 200, data=True)["user"]
    assert user["system_accounts"] == [
        {"id": account["id"], "username": "tgt", "uuid": account["uuid"], "cloud_controller_id": 1}
    ]
    resp = user_client.simulate_get(f"/v1/user/view/{world['owner'].id}", headers=world["superuser"].headers)
    assert user_envelope(resp, 200, data=True)["user"]["num_owned_accounts"] == 1


# -- update -------------------------------------------------------------------
@pytest.mark.parametrize("requester", REQUESTERS)
def test_update_name_and_email(ctx, user_client, world, requester):
    target = world.target
    resp = user_client.simulate_post(
        f"/v1/user/update/{target.id}", headers=world[requester].headers,
        json={"name": "Renamed", "email": "renamed@example.org"},
    )
    row = ctx.store.get_user(target.id)
    if requester in MANAGERS:
        user_envelope(resp, 200)
        assert (row["name"], row["email"]) == ("Renamed", "renamed@example.org")
    else:
        user_envelope(resp, 403)
        assert (row["name"], row["email"]) == ("", "target@example.org")


def test_update_changes_only_what_is_given(ctx, user_client, world):
    target = world.target
    before = ctx.store.get_user(target.id)
    resp = user_client.simulate_post(f"/v1/user/update/{target.id}", headers=target.headers, json={"name": "Only"})
    user_envelope(resp, 200)
    after = ctx.store.get_user(target.id)
    assert after["name"] == "Only"
    assert {k: v for k, v in after.items() if k != "name"} == {k: v for k, v in before.items() if k != "name"}


@pytest.mark.parametrize("requester", REQUESTERS)
def test_update_active_is_superuser_only(ctx, user_client, world, requester):
    target = world.target
    resp = user_client.simulate_post(
        f"/v1/user/update/{target.id}", headers=world[requester].headers, json={"active": 0}
    )
    if requester == "superuser":
        user_envelope(resp, 200)
        assert ctx.store.get_user(target.id)["active"] == 0
    else:
        user_envelope(resp, 403)
        assert ctx.store.get_user(target.id)["active"] == 1


def test_reactivate(ctx, user_client, world):
    target, su = world.target, world["superuser"]
    for value, expected in ((0, 0), (3, 3), ("1", 1)):
        resp = user_client.simulate_post(f"/v1/user/update/{target.id}", headers=su.headers, json={"active": value})
        user_envelope(resp, 200)
        assert ctx.store.get_user(target.id)["active"] == expected


# -- create -------------------------------------------------------------------
@pytest.mark.parametrize("requester", REQUESTERS)
def test_create_user(ctx, user_client, world, requester):
    caller = world[requester]
    resp = user_client.simulate_post(
        "/v1/user/create", headers=caller.headers,
        json={"email": "new@example.org", "password": PASSWORD, "name": "New One"},
    )
    row = ctx.store.get_user_by_email("new@example.org")
    if requester in ("superuser", "create_user"):
        data = user_envelope(resp, 200, data=True)
        assert data == {"userid": row["id"]}
        assert uuid.UUID(data["userid"])
        assert row["name"] == "New One"
        assert row["active"] == 1
        assert row["roles"] == []
        assert row["registration_source"] == "api"
        # A non-superuser's new user is always its own managed user.
        assert row["owner_userid"] == (None if requester == "superuser" else caller.id)
        assert ctx.passwords.verify(row["password_hash"], PASSWORD)
        assert row["api_key"] and row["api_secret_enc"]
    else:
        user_envelope(resp, 403)
        assert row is None


@pytest.mark.parametrize(
    "owner_of_new, status",
    [("requester", 200), ("other", 403), ("absent", 200)],
)
def test_create_owner_userid_for_non_superuser(ctx, user_client, world, owner_of_new, status):
    creator = world["create_user"]
    body = {"email": "managed@example.org", "password": PASSWORD}
    if owner_of_new != "absent":
        body["owner_userid"] = creator.id if owner_of_new == "requester" else world["stranger"].id
    resp = user_client.simulate_post("/v1/user/create", headers=creator.headers, json=body)
    user_envelope(resp, status, data=True)
    row = ctx.store.get_user_by_email("managed@example.org")
    if status == 200:
        assert row["owner_userid"] == creator.id
    else:
        assert row is None


def test_superuser_creates_managed_inactive_user_with_source(ctx, user_client, world):
    owner = world["owner"]
    resp = user_client.simulate_post(
        "/v1/user/create", headers=world["superuser"].headers,
        json={"email": "m@example.org", "password": PASSWORD, "owner_userid": owner.id, "active": 0,
              "registration_source": "portal"},
    )
    userid = user_envelope(resp, 200, data=True)["userid"]
    row = ctx.store.get_user(userid)
    assert (row["owner_userid"], row["active"], row["registration_source"]) == (owner.id, 0, "portal")


def test_superuser_create_with_unknown_owner_is_400(ctx, user_client, world):
    resp = user_client.simulate_post(
        "/v1/user/create", headers=world["superuser"].headers,
        json={"email": "m@example.org", "password": PASSWORD, "owner_userid": str(uuid.uuid4())},
    )
    user_envelope(resp, 400)
    assert ctx.store.get_user_by_email("m@example.org") is None


def test_created_user_can_get_a_token_with_its_password(ctx, user_client, world):
    resp = user_client.simulate_post(
        "/v1/user/create", headers=world["superuser"].headers, json={"email": "n@example.org", "password": PASSWORD}
    )
    userid = user_envelope(resp, 200, data=True)["userid"]
    resp = user_client.simulate_post("/v1/auth/token", json={"email": "n@example.org", "password": PASSWORD})
    assert user_envelope(resp, 200, data=True)["userid"] == userid


# -- list ---------------------------------------------------------------------
def _expected_list(world: World, requester: str) -> set[str]:
    if requester == "superuser":
        return {c.email for c in world.callers.values()}
    if requester == "owner":
        return {world["owner"].email, world.target.email}
    return {world[requester].email}


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("requester", REQUESTERS)
def test_list_users(ctx, user_client, world, requester, method):
    resp = user_client.simulate_request(method, "/v1/user/list", headers=world[requester].headers)
    data = user_envelope(resp, 200, data=True)
    assert set(data) == {"total", "users"}
    assert data["total"] == len(data["users"])
    assert {u["email"] for u in data["users"]} == _expected_list(world, requester)
    for obj in data["users"]:
        check_user_object(obj, ctx.store.get_user(obj["id"]), superuser_view=requester == "superuser")


def test_list_in_creation_order(user_client, world):
    resp = user_client.simulate_get("/v1/user/list", headers=world["superuser"].headers)
    emails = [u["email"] for u in user_envelope(resp, 200, data=True)["users"]]
    assert emails == [c.email for c in world.callers.values()]


@pytest.mark.parametrize("param, value", [
    ("show_inactive", "1"), ("show_inactive", "yes"), ("owner_userid", None), ("registration_source", "api"),
])
@pytest.mark.parametrize("requester", ["owner", "view_user"])
def test_list_superuser_only_parameters(user_client, world, requester, param, value):
    value = value if value is not None else world["owner"].id
    resp = user_client.simulate_get("/v1/user/list", headers=world[requester].headers, params={param: value})
    user_envelope(resp, 403)
    assert param in resp.json["message"]


@pytest.mark.parametrize("value", ["0", "false", "FALSE"])
def test_list_show_inactive_false_counts_as_absent(ctx, user_client, world, value):
    ctx.store.update_user(world.target.id, {"active": 0})
    for requester in ("superuser", "owner"):
        resp = user_client.simulate_get("/v1/user/list", headers=world[requester].headers,
                                        params={"show_inactive": value})
        emails = {u["email"] for u in user_envelope(resp, 200, data=True)["users"]}
        assert world.target.email not in emails


@pytest.mark.parametrize("value", ["", "1", "true", "anything"])
def test_list_show_inactive_includes_inactive(ctx, user_client, world, value):
    ctx.store.update_user(world.target.id, {"active": 0})
    su = world["superuser"].headers
    without = user_envelope(user_client.simulate_get("/v1/user/list", headers=su), 200, data=True)
    assert world.target.email not in {u["email"] for u in without["users"]}
    resp = user_client.simulate_get("/v1/user/list", headers=su, query_string=f"show_inactive={value}")
    data = user_envelope(resp, 200, data=True)
    assert world.target.email in {u["email"] for u in data["users"]}
    assert data["total"] == without["total"] + 1
    # ... and the owner never sees its inactive user.
    owned = user_envelope(user_client.simulate_get("/v1/user/list", headers=world["owner"].headers), 200, data=True)
    assert {u["email"] for u in owned["users"]} == {world["owner"].email}


def test_list_filters_of_superuser(ctx, user_client, world):
    su = world["superuser"].headers
    resp = user_client.simulate_post("/v1/user/list", headers=su, json={"owner_userid": world["owner"].id})
    assert [u["email"] for u in user_envelope(resp, 200, data=True)["users"]] == [world.target.email]
    ctx.store.update_user(world["stranger"].id, {"registration_source": "portal"})
    resp = user_client.simulate_get("/v1/user/list", headers=su, params={"registration_source": "portal"})
    data = user_envelope(resp, 200, data=True)
    assert (data["total"], [u["email"] for u in data["users"]]) == (1, [world["stranger"].email])


# -- search -------------------------------------------------------------------
@pytest.mark.parametrize("by", ["email", "username", "both"])
@pytest.mark.parametrize("requester", REQUESTERS)
def test_search(ctx, user_client, world, requester, by):
    add_account(ctx, world.target.id, "tgt")
    params = {"email": "TARGET@example.org", "username": "tgt"}
    if by != "both":
        params = {by: params[by]}
    resp = user_client.simulate_get("/v1/user/search", headers=world[requester].headers, params=params)
    data = user_envelope(resp, 200, data=True)
    assert data["total"] == len(data["users"])
    if requester in MANAGERS:
        assert [u["id"] for u in data["users"]] == [world.target.id]
        check_user_object(data["users"][0], ctx.store.get_user(world.target.id),
                          superuser_view=requester == "superuser")
    else:
        assert data["users"] == []


def test_search_by_email_and_username_must_both_match(ctx, user_client, world):
    add_account(ctx, world.target.id, "tgt")
    su = world["superuser"].headers
    resp = user_client.simulate_get("/v1/user/search", headers=su,
                                    params={"username": "tgt", "email": world["owner"].email})
    assert user_envelope(resp, 200, data=True) == {"total": 0, "users": []}
    resp = user_client.simulate_get("/v1/user/search", headers=su, params={"username": "nobody"})
    assert user_envelope(resp, 200, data=True) == {"total": 0, "users": []}


def test_search_needs_a_criterion_and_misses_are_empty(user_client, world):
    su = world["superuser"].headers
    user_envelope(user_client.simulate_get("/v1/user/search", headers=su), 400)
    resp = user_client.simulate_get("/v1/user/search", headers=su, params={"email": "nobody@example.org"})
    assert user_envelope(resp, 200, data=True) == {"total": 0, "users": []}


# -- set_password -------------------------------------------------------------
@pytest.mark.parametrize("requester", REQUESTERS)
def test_set_password(ctx, user_client, world, requester):
    target = world.target
    before = ctx.store.get_user(target.id)["password_hash"]
    resp = user_client.simulate_post(
        f"/v1/user/set_password/{target.id}", headers=world[requester].headers, json={"password": NEW_PASSWORD}
    )
    after = ctx.store.get_user(target.id)["password_hash"]
    if requester == "superuser":
        user_envelope(resp, 200)
        assert ctx.passwords.verify(after, NEW_PASSWORD)
        assert not ctx.passwords.verify(after, PASSWORD)
    else:
        user_envelope(resp, 403)
        assert after == before


def test_set_password_applies_the_password_rule(ctx, user_client, world):
    before = ctx.store.get_user(world.target.id)["password_hash"]
    resp = user_client.simulate_post(
        f"/v1/user/set_password/{world.target.id}", headers=world["superuser"].headers, json={"password": "short1!"}
    )
    user_envelope(resp, 400)
    assert ctx.store.get_user(world.target.id)["password_hash"] == before


# -- view_api_secret ----------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("requester", REQUESTERS)
def test_view_api_secret(user_client, world, requester, method):
    resp = user_client.simulate_request(
        method, f"/v1/user/view_api_secret/{world.target.id}", headers=world[requester].headers
    )
    if requester == "superuser":
        assert user_envelope(resp, 200, data=True) == {"api_secret": world.target.api_secret}
    else:
        user_envelope(resp, 403)


@pytest.mark.parametrize("holder", ["owner", "self"])
def test_view_user_secret_role_with_view_permission(ctx, user_client, world, holder):
    """view_user_secret together with view permission on the target: the owner, or the user itself."""
    ctx.store.update_user(world[holder].id, {"roles": ["view_user_secret"]})
    resp = user_client.simulate_get(f"/v1/user/view_api_secret/{world.target.id}", headers=world[holder].headers)
    assert user_envelope(resp, 200, data=True) == {"api_secret": world.target.api_secret}
    # The role does not reach a user the holder cannot view.
    resp = user_client.simulate_get(f"/v1/user/view_api_secret/{world['stranger'].id}", headers=world[holder].headers)
    user_envelope(resp, 403)


# -- reset_api_secret ---------------------------------------------------------
@pytest.mark.parametrize("requester", REQUESTERS)
def test_reset_api_secret(ctx, user_client, world, requester):
    target = world.target
    before = ctx.store.get_user(target.id)["api_secret_enc"]
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{target.id}", headers=world[requester].headers)
    stored = ctx.store.get_user(target.id)["api_secret_enc"]
    if requester == "superuser":
        secret = user_envelope(resp, 200, data=True)["api_secret"]
        assert isinstance(secret, str) and len(secret) >= 32
        assert secret != target.api_secret
        assert ctx.secret_box.decrypt(stored) == secret
    else:
        user_envelope(resp, 403)
        assert stored == before


@pytest.mark.parametrize("body", [{"set_to_null": 1}, {"set_to_null": "true"}, {"set_to_null": ""}])
def test_reset_api_secret_set_to_null(ctx, user_client, world, body):
    su, target = world["superuser"], world.target
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{target.id}", headers=su.headers, json=body)
    assert user_envelope(resp, 200, data=True) == {"api_secret": None}
    assert ctx.store.get_user(target.id)["api_secret_enc"] is None
    resp = user_client.simulate_get(f"/v1/user/view_api_secret/{target.id}", headers=su.headers)
    assert user_envelope(resp, 200, data=True) == {"api_secret": None}
    # A later plain reset gives the user a secret again.
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{target.id}", headers=su.headers)
    secret = user_envelope(resp, 200, data=True)["api_secret"]
    assert ctx.secret_box.decrypt(ctx.store.get_user(target.id)["api_secret_enc"]) == secret


@pytest.mark.parametrize("value", [0, False, "0", "false"])
def test_reset_api_secret_set_to_null_false_is_a_plain_reset(ctx, user_client, world, value):
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{world.target.id}",
                                     headers=world["superuser"].headers, json={"set_to_null": value})
    secret = user_envelope(resp, 200, data=True)["api_secret"]
    assert secret and ctx.secret_box.decrypt(ctx.store.get_user(world.target.id)["api_secret_enc"]) == secret


# -- delete -------------------------------------------------------------------
@pytest.mark.parametrize("requester", REQUESTERS)
def test_delete_user(ctx, user_client, world, requester):
    target = world.target
    resp = user_client.simulate_post(f"/v1/user/delete/{target.email}", headers=world[requester].headers)
    if requester == "superuser":
        user_envelope(resp, 200)
        assert ctx.store.get_user(target.id) is None
    else:
        user_envelope(resp, 403)
        assert ctx.store.get_user(target.id) is not None


def test_delete_matches_email_case_insensitively_and_keeps_owned_users(ctx, user_client, world):
    resp = user_client.simulate_post("/v1/user/delete/OWNER@Example.org", headers=world["superuser"].headers)
    user_envelope(resp, 200)
    assert ctx.store.get_user(world["owner"].id) is None
    assert ctx.store.get_user(world.target.id)["owner_userid"] is None


def test_delete_refused_while_user_has_a_volume(ctx, user_client, world):
    with ctx.store.write() as conn:
        conn.execute(
            "INSERT INTO volumes (id, owner_id, size_gb, mount_point, creation_date) VALUES (?, ?, 1, '/h', 'x')",
            (str(uuid.uuid4()), world.target.id),
        )
    resp = user_client.simulate_post(f"/v1/user/delete/{world.target.email}", headers=world["superuser"].headers)
    user_envelope(resp, 409)
    assert "volume" in resp.json["message"]
    assert ctx.store.get_user(world.target.id) is not None


def test_delete_refused_while_user_has_a_system_account(ctx, user_client, world):
    add_account(ctx, world.target.id, "tgt")
    resp = user_client.simulate_post(f"/v1/user/delete/{world.target.email}", headers=world["superuser"].headers)
    user_envelope(resp, 409)
    assert "account" in resp.json["message"]
    assert ctx.store.get_user(world.target.id) is not None


def test_delete_refused_while_user_owns_a_group(ctx, user_client, world):
    with ctx.store.write() as conn:
        conn.execute("INSERT INTO groups (id, owner_id, name, creation_date) VALUES (?, ?, 'grp', 'x')",
                     (str(uuid.uuid4()), world.target.id))
    resp = user_client.simulate_post(f"/v1/user/delete/{world.target.email}", headers=world["superuser"].headers)
    user_envelope(resp, 409)
    assert ctx.store.get_user(world.target.id) is not None


# -- unknown targets ----------------------------------------------------------
@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/user/view/{id}"),
    ("POST", "/v1/user/update/{id}"),
    ("POST", "/v1/user/set_password/{id}"),
    ("GET", "/v1/user/view_api_secret/{id}"),
    ("POST", "/v1/user/reset_api_secret/{id}"),
    ("POST", "/v1/user/delete/nobody@example.org"),
])
def test_unknown_target_is_404(user_client, world, method, path):
    body = {"password": NEW_PASSWORD, "name": "x"} if method == "POST" else None
    resp = user_client.simulate_request(
        method, path.format(id=uuid.uuid4()), headers=world["superuser"].headers, json=body
    )
    user_envelope(resp, 404)


def test_no_response_ever_holds_a_password(user_client, world):
    su = world["superuser"].headers
    bodies = [
        user_client.simulate_get("/v1/user/list", headers=su, params={"show_inactive": "1"}).text,
        user_client.simulate_get(f"/v1/user/view/{world.target.id}", headers=su).text,
        user_client.simulate_get("/v1/user/search", headers=su, params={"email": world.target.email}).text,
    ]
    for text in bodies:
        assert PASSWORD not in text
        assert '"password' not in text


# -- /healthz and /v1/openapi.json ----------------------------------------------
def test_healthz_ok_without_auth(user_client):
    resp = user_client.simulate_get("/healthz")
    assert resp.status_code == 200
    assert resp.json == {"status": "ok"}


def test_healthz_names_a_missing_secret_key_file(ctx, user_client):
    os.remove(ctx.config.auth.secret_key_file)
    resp = user_client.simulate_get("/healthz")
    assert resp.status_code == 503
    assert resp.json["status"] != "ok"
    assert resp.json["failed"] == [{"check": "secret_key"}]
    # The path of the key file is for the admin (`cloud-agent check`), not for anonymous callers.
    assert ctx.config.auth.secret_key_file not in resp.text


def test_healthz_names_an_unmigrated_database(ctx, user_client):
    ctx.store.conn.execute("PRAGMA user_version = 1")
    resp = user_client.simulate_get("/healthz")
    assert resp.status_code == 503
    assert [f["check"] for f in resp.json["failed"]] == ["database"]


USER_PATHS = {
    "/v1/auth/token": {"post"},
    "/v1/user/list": {"get", "post"},
    "/v1/user/view/{userid}": {"get", "post"},
    "/v1/user/create": {"post"},
    "/v1/user/update/{userid}": {"post"},
    "/v1/user/search": {"get", "post"},
    "/v1/user/set_password/{userid}": {"post"},
    "/v1/user/view_api_secret/{userid}": {"get", "post"},
    "/v1/user/reset_api_secret/{userid}": {"post"},
    "/v1/user/delete/{email}": {"post"},
    "/v1/user/credentials": {"get"},
    "/v1/user/rotate_api_secret": {"post"},
    "/v1/user/change_password": {"post"},
}
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _schemas(node):
    """Every JSON Schema object inside an OpenAPI document node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema":
                yield value
            else:
                yield from _schemas(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schemas(item)


def test_openapi_document_is_valid_openapi_3_1(user_client):
    resp = user_client.simulate_get("/v1/openapi.json")
    assert resp.status_code == 200
    doc = resp.json
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"])
    assert isinstance(doc["info"]["title"], str) and isinstance(doc["info"]["version"], str)
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        templated = set(re.findall(r"{([^}]+)}", path))
        ops = {k: v for k, v in item.items() if k in HTTP_METHODS}
        assert ops and set(item) <= HTTP_METHODS | {"parameters", "summary", "description"}, path
        for method, op in ops.items():
            assert op["responses"], (path, method)
            for code, response in op["responses"].items():
                assert re.fullmatch(r"[1-5](\d\d|XX)|default", code) and response["description"]
            params = op.get("parameters", [])
            in_path = {p["name"] for p in params if p["in"] == "path"}
            assert in_path == templated, (path, method)
            for p in params:
                assert p["in"] in ("query", "header", "path", "cookie")
                assert p["in"] != "path" or p["required"] is True
            seen = [(p["name"], p["in"]) for p in params]
            assert len(seen) == len(set(seen)), (path, method)
            if method == "get":
                assert "requestBody" not in op
    for schema in _schemas(doc["paths"]):
        Draft202012Validator.check_schema(schema)


def test_openapi_lists_every_user_path_with_the_methods_the_app_accepts(user_client):
    doc = user_client.simulate_get("/v1/openapi.json").json
    documented = {p: {m for m in item if m in HTTP_METHODS} for p, item in doc["paths"].items()}
    for path, methods in USER_PATHS.items():
        assert documented.get(path) == methods, path
    routes = {
        r.path: {m.method.lower() for m in r.methods if m.internal is False and m.method != "OPTIONS"}
        for r in falcon_inspect.inspect_routes(user_client.app)
    }
    for path in USER_PATHS:
        assert routes[path] == documented[path], path


def test_openapi_response_schemas_match_real_responses(ctx, user_client, world):
    doc = user_client.simulate_get("/v1/openapi.json").json
    su = world["superuser"].headers
    add_account(ctx, world.target.id, "tgt")
    calls = [
        ("/v1/user/list", "get", user_client.simulate_get("/v1/user/list", headers=su)),
        ("/v1/user/view/{userid}", "get", user_client.simulate_get(f"/v1/user/view/{world.target.id}", headers=su)),
        ("/v1/user/view/{userid}", "get", user_client.simulate_get(f"/v1/user/view/{world.target.id}",
                                                                    headers=world["owner"].headers)),
        ("/v1/user/search", "post", user_client.simulate_post("/v1/user/search", headers=su,
                                                               json={"username": "tgt"})),
        ("/v1/user/create", "post", user_client.simulate_post("/v1/user/create", headers=su,
                                                               json={"email": "z@example.org", "password": PASSWORD})),
        ("/v1/auth/token", "post", user_client.simulate_post("/v1/auth/token", json={
            "api_key": world.target.api_key, "api_secret": world.target.api_secret})),
        ("/v1/user/view/{userid}", "get", user_client.simulate_get(f"/v1/user/view/{world.target.id}",
                                                                    headers=world["stranger"].headers)),
    ]
    for path, method, resp in calls:
        response = doc["paths"][path][method]["responses"][str(resp.status_code)]
        schema = response["content"]["application/json"]["schema"]
        Draft202012Validator(schema).validate(resp.json)
