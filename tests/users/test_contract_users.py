"""Black-box tests of the published contract (the API spec, the README and docs/): the user interface:
create, view, update, list, search, passwords, API secrets, delete (spec 4.6, docs/api.md).

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import configparser
import json
import uuid

from tests.fixtures.blackbox import (
    DATE_TIME, PASSWORD, SUPERUSER_FIELDS, User, cc_ok, ids, is_uuid, ui_err, ui_ok, unique, user_obj,
)


# ===========================================================================
# User interface: create (spec 4.6, docs/api.md)
# ===========================================================================

def test_create_by_json_and_by_form(env):
    email = f"{unique('bb-')}@example.org"
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       json_body={"email": email, "password": PASSWORD, "name": "Jay Son"}))
    assert set(d) == {"userid"} and is_uuid(d["userid"])
    obj = ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]
    assert obj["email"] == email and obj["name"] == "Jay Son"
    assert type(obj["active"]) is int and obj["active"] == 1  # default 1
    assert obj["system_accounts"] == [] and DATE_TIME.match(obj["created_at_utc"])

    email2 = f"{unique('bb-')}@example.org"
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       form={"email": email2, "password": PASSWORD, "owner_userid": env.admin.id,
                             "active": "0", "registration_source": "form"}))
    obj = ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]
    assert obj["email"] == email2 and obj["active"] == 0
    assert obj["owner_userid"] == env.admin.id and obj["registration_source"] == "form"


def test_create_bad_input_and_duplicate_email(env):
    def create(**body):
        return env.call("POST", "/v1/user/create", who=env.admin, json_body=body)

    ui_err(create(password=PASSWORD), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org"), 400)
    for bad in ("not-an-address", "a@", "@example.org", "a b@example.org", ""):
        ui_err(create(email=bad, password=PASSWORD), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org", password=PASSWORD, active="yes"), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org", password=PASSWORD, owner_userid="not-a-uuid"), 400)

    email = f"{unique('Dup-')}@Example.org"
    ui_ok(create(email=email, password=PASSWORD))
    ui_err(create(email=email, password=PASSWORD), 409)
    ui_err(create(email=email.lower(), password=PASSWORD), 409)
    ui_err(env.call("POST", "/v1/user/create", who=env.admin, data=b"{not json",
                    content_type="application/json"), 400)


def test_create_permission_and_ownership(env):
    plain = env.user()
    ui_err(env.call("POST", "/v1/user/create", who=plain,
                    json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD}), 403)

    creator, other = env.users({"roles": ["create_user"]}, {})
    d = ui_ok(env.call("POST", "/v1/user/create", who=creator,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD}))
    assert ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]["owner_userid"] == creator.id
    d = ui_ok(env.call("POST", "/v1/user/create", who=creator,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                                  "owner_userid": creator.id}))
    assert ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=creator))["user"]["owner_userid"] == creator.id
    ui_err(env.call("POST", "/v1/user/create", who=creator,
                    json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                               "owner_userid": other.id}), 403)
    # the superuser may name any owner
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                                  "owner_userid": other.id}))
    assert user_obj(env, other, User(id=d["userid"], email="", password=""))["owner_userid"] == other.id


# ===========================================================================
# User interface: view, fields, superuser-only fields
# ===========================================================================

def test_view_permissions(env):
    owner = env.user()
    managed, stranger, viewer = env.users({"owner": owner}, {"login": False}, {"roles": ["view_user"]})
    grandchild = env.user(owner=managed, login=False)
    for path in (f"/v1/user/view/{owner.id}",):
        assert ui_ok(env.call("GET", path, who=owner))["user"]["id"] == owner.id
        assert ui_ok(env.call("POST", path, who=owner))["user"]["id"] == owner.id
    assert user_obj(env, owner, managed)["owner_userid"] == owner.id
    ui_err(env.call("GET", f"/v1/user/view/{stranger.id}", who=owner), 403)
    ui_err(env.call("GET", f"/v1/user/view/{owner.id}", who=managed), 403)  # not upward
    ui_err(env.call("GET", f"/v1/user/view/{stranger.id}", who=viewer), 403)  # role does not widen
    ui_err(env.call("GET", f"/v1/user/view/{grandchild.id}", who=owner), 403)  # only direct ownership
    ui_err(env.call("GET", f"/v1/user/view/{uuid.uuid4()}", who=env.admin), 404)
    ui_err(env.call("GET", "/v1/user/view/not-a-uuid", who=env.admin), 404)
    assert user_obj(env, env.admin, stranger)["id"] == stranger.id


def test_user_object_fields_and_superuser_only_fields(env):
    owner = env.user()
    managed, _ = env.users({"owner": owner, "name": "Managed One", "login": False}, {"owner": owner, "login": False})

    as_owner = user_obj(env, owner, managed)
    assert not (set(as_owner) & SUPERUSER_FIELDS), as_owner
    assert {"id", "email", "name", "active", "owner_userid", "system_accounts", "created_at_utc"} <= set(as_owner)
    assert as_owner["name"] == "Managed One" and isinstance(as_owner["active"], int)
    assert DATE_TIME.match(as_owner["created_at_utc"])
    assert not (set(user_obj(env, owner, owner)) & SUPERUSER_FIELDS)

    as_admin = user_obj(env, env.admin, owner)
    assert SUPERUSER_FIELDS <= set(as_admin)
    assert as_admin["num_owned_accounts"] == 2
    assert isinstance(as_admin["roles"], list) and isinstance(as_admin["api_key"], str) and as_admin["api_key"]

    for u in ui_ok(env.call("GET", "/v1/user/list", who=owner))["users"]:
        assert not (set(u) & SUPERUSER_FIELDS), u


def test_system_accounts_in_user_object(env):
    u = env.user()
    acct = env.enable(u)
    assert set(acct) == {"id", "username", "uuid", "cloud_controller_id"}
    assert type(acct["id"]) is int and is_uuid(acct["uuid"]) and acct["username"] == u.username
    cp = configparser.ConfigParser()
    cp.read(env.config)
    assert acct["cloud_controller_id"] == cp.getint("controller", "id")
    assert user_obj(env, u, u)["system_accounts"] == [acct]
    assert user_obj(env, env.admin, u)["system_accounts"] == [acct]


# ===========================================================================
# User interface: update
# ===========================================================================

def test_update(env):
    owner = env.user()
    managed, stranger = env.users({"owner": owner}, {"login": False})

    new_email = f"{unique('upd-')}@example.org"
    ui_ok(env.call("POST", f"/v1/user/update/{owner.id}", who=owner,
                   json_body={"email": new_email, "name": "New Name"}), data=False)
    obj = user_obj(env, owner, owner)
    assert obj["email"] == new_email and obj["name"] == "New Name"

    ui_ok(env.call("POST", f"/v1/user/update/{managed.id}", who=owner, form={"name": "Form Name"}), data=False)
    obj = user_obj(env, owner, managed)
    assert obj["name"] == "Form Name" and obj["email"] == managed.email  # only given properties change

    ui_err(env.call("POST", f"/v1/user/update/{stranger.id}", who=owner, json_body={"name": "x"}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=managed, json_body={"name": "x"}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"active": 1}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{managed.id}", who=owner, json_body={"active": 0}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{uuid.uuid4()}", who=env.admin, json_body={"name": "x"}), 404)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"email": "nope"}), 400)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"email": stranger.email}), 409)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner,
                    json_body={"email": stranger.email.upper()}), 409)
    r = env.call("GET", f"/v1/user/update/{owner.id}", who=owner)
    ui_err(r, 405)
    assert "POST" in r.allow() and "GET" not in r.allow()


def test_active_by_superuser_json_and_form(env):
    u = env.user(login=False)
    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, form={"active": "0"}), data=False)
    assert user_obj(env, env.admin, u)["active"] == 0
    ui_err(env.token(email=u.email, password=u.password), 401)
    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, json_body={"active": 2}), data=False)
    assert user_obj(env, env.admin, u)["active"] > 0
    ui_ok(env.token(email=u.email, password=u.password))


# ===========================================================================
# User interface: list and show_inactive
# ===========================================================================

def test_list_for_non_superuser_is_self_and_owned(env):
    owner = env.user()
    m1, m2, _ = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False}, {"login": False})
    env.user(owner=m1, login=False)  # owned by a managed user, not by owner
    for r in (env.call("GET", "/v1/user/list", who=owner), env.call("POST", "/v1/user/list", who=owner),
              env.call("POST", "/v1/user/list", who=owner, json_body={})):
        d = ui_ok(r)
        assert d["total"] == len(d["users"])
        assert ids(d["users"]) == {owner.id, m1.id, m2.id}


def test_list_inactive_and_show_inactive(env):
    owner = env.user()
    active_m, inactive_m = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False, "active": 0})

    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin))
    assert d["total"] == len(d["users"])
    assert {owner.id, active_m.id} <= ids(d["users"]) and inactive_m.id not in ids(d["users"])

    for value in ("1", "true", "yes", ""):
        d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"show_inactive": value}))
        assert inactive_m.id in ids(d["users"]), value
    for value in ("0", "false"):
        d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"show_inactive": value}))
        assert inactive_m.id not in ids(d["users"]), value
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, form={"show_inactive": "1"}))
    assert inactive_m.id in ids(d["users"])
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"show_inactive": True}))
    assert inactive_m.id in ids(d["users"])
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"show_inactive": False}))
    assert inactive_m.id not in ids(d["users"])

    # the owner never gets the inactive managed user; it may not ask
    assert inactive_m.id not in ids(ui_ok(env.call("GET", "/v1/user/list", who=owner))["users"])
    ui_err(env.call("GET", "/v1/user/list", who=owner, query={"show_inactive": "1"}), 403)


def test_list_superuser_filters(env):
    owner = env.user()
    m1, m2 = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False, "active": 0})
    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"owner_userid": owner.id}))
    assert ids(d["users"]) == {m1.id} and d["total"] == 1
    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin,
                       query={"owner_userid": owner.id, "show_inactive": "1"}))
    assert ids(d["users"]) == {m1.id, m2.id} and d["total"] == 2

    source = unique("src-")
    tagged = env.user(registration_source=source, login=False)
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"registration_source": source}))
    assert ids(d["users"]) == {tagged.id}
    for u in d["users"]:
        assert DATE_TIME.match(u["created_at_utc"]) and SUPERUSER_FIELDS <= set(u)

    for q in ({"owner_userid": owner.id}, {"registration_source": source}, {"show_inactive": "1"},
              {"owner_userid": m1.id}):
        ui_err(env.call("GET", "/v1/user/list", who=owner, query=q), 403)


# ===========================================================================
# User interface: search
# ===========================================================================

def test_search_by_email_and_by_username(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True, "login": False},
                                  {"account": True, "login": False})

    for r in (env.call("GET", "/v1/user/search", who=owner, query={"email": managed.email}),
              env.call("POST", "/v1/user/search", who=owner, form={"email": managed.email}),
              env.call("POST", "/v1/user/search", who=owner, json_body={"email": managed.email})):
        d = ui_ok(r)
        assert ids(d["users"]) == {managed.id} and d["total"] == 1
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"username": managed.username}))
    assert ids(d["users"]) == {managed.id} and d["total"] == 1
    assert d["users"][0]["system_accounts"][0]["username"] == managed.username

    d = ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"username": stranger.username}))
    assert ids(d["users"]) == {stranger.id}
    assert SUPERUSER_FIELDS <= set(d["users"][0])
    d = ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"email": f"nobody-{uuid.uuid4().hex}@x.org"}))
    assert d["users"] == [] and d["total"] == 0

    # a user the requester may not view is not returned
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"email": stranger.email}))
    assert d["users"] == [] and d["total"] == 0
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"username": stranger.username}))
    assert d["users"] == []

    ui_err(env.call("GET", "/v1/user/search", who=owner), 400)
    ui_err(env.call("POST", "/v1/user/search", who=owner, json_body={}), 400)


# ===========================================================================
# User interface: set_password, view/reset api secret, delete
# ===========================================================================

def test_set_password(env):
    u, owner = env.user(login=False), env.user()
    managed = env.user(owner=owner, login=False)
    ui_ok(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin,
                   form={"password": "Form-password-9"}), data=False)
    ui_err(env.token(email=u.email, password=PASSWORD), 401)
    ui_ok(env.token(email=u.email, password="Form-password-9"))

    ui_err(env.call("POST", f"/v1/user/set_password/{managed.id}", who=owner,
                    json_body={"password": "Owner-password-9"}), 403)
    ui_err(env.call("POST", f"/v1/user/set_password/{owner.id}", who=owner,
                    json_body={"password": "Owner-password-9"}), 403)
    ui_err(env.call("POST", f"/v1/user/set_password/{uuid.uuid4()}", who=env.admin,
                    json_body={"password": "Owner-password-9"}), 404)
    ui_err(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin, json_body={"password": "short1!"}), 400)
    ui_err(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin, json_body={}), 400)
    r = env.call("GET", f"/v1/user/set_password/{u.id}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()


def test_view_api_secret(env):
    owner, stranger, keeper = env.users({}, {"login": False}, {"roles": ["view_user_secret"]})
    managed, kept = env.users({"owner": owner, "login": False}, {"owner": keeper, "login": False})

    s1 = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{managed.id}", who=env.admin))
    s2 = ui_ok(env.call("POST", f"/v1/user/view_api_secret/{managed.id}", who=env.admin))
    assert set(s1) == {"api_secret"} and isinstance(s1["api_secret"], str) and s1 == s2

    ui_err(env.call("GET", f"/v1/user/view_api_secret/{managed.id}", who=owner), 403)
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{owner.id}", who=owner), 403)
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{kept.id}", who=keeper))["api_secret"]
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{keeper.id}", who=keeper))["api_secret"]
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{stranger.id}", who=keeper), 403)
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{uuid.uuid4()}", who=env.admin), 404)


def test_reset_api_secret(env):
    u, owner = env.user(login=False), env.user()
    managed = env.user(owner=owner, login=False)
    old = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    new = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, form={}))["api_secret"]
    assert isinstance(new, str) and new != old
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"] == new

    d = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, form={"set_to_null": "1"}))
    assert d["api_secret"] is None
    key = user_obj(env, env.admin, u)["api_key"]
    ui_err(env.token(api_key=key, api_secret=new), 401)

    ui_err(env.call("POST", f"/v1/user/reset_api_secret/{managed.id}", who=owner), 403)
    ui_err(env.call("POST", f"/v1/user/reset_api_secret/{uuid.uuid4()}", who=env.admin), 404)
    r = env.call("GET", f"/v1/user/reset_api_secret/{u.id}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()


def test_delete_user(env):
    owner = env.user()
    managed = env.user(owner=owner, login=False)
    victim = env.user()
    ui_err(env.call("POST", f"/v1/user/delete/{managed.email}", who=owner), 403)
    ui_err(env.call("POST", f"/v1/user/delete/{unique('gone-')}@example.org", who=env.admin), 404)
    r = env.call("GET", f"/v1/user/delete/{victim.email}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()

    ui_ok(env.call("POST", f"/v1/user/delete/{victim.email}", who=env.admin), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{victim.id}", who=env.admin), 404)
    ui_err(env.call("GET", f"/v1/user/view/{victim.id}", who=victim), 401)  # its token died
    ui_err(env.call("POST", f"/v1/user/delete/{victim.email}", who=env.admin), 404)


def test_delete_user_409_while_volume_or_account(env):
    u = env.user(account=True)
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # system account
    vol = env.volume(u)
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # volume (and account)
    cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=u))
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # still an account
    cp = env.agent_raw("account", "disable", u.email, "--yes")
    assert cp.returncode == 0, cp.stderr
    json.loads(cp.stdout)
    ui_ok(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), data=False)


def test_user_interface_405_and_bad_bodies(env):
    u = env.user()
    r = env.call("PUT", "/v1/user/list", who=u)
    ui_err(r, 405)
    assert {"GET", "POST"} <= r.allow()
    r = env.call("GET", "/v1/user/create", who=u)
    ui_err(r, 405)
    assert "POST" in r.allow() and "GET" not in r.allow()
    ui_err(env.call("POST", "/v1/user/list", who=u, data=b"{oops", content_type="application/json"), 400)
