"""Black-box tests of the published contract (the API spec, the README and docs/): tokens and the header
check (authentication, docs/api.md).

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import uuid

from tests.fixtures.blackbox import DATE_TIME, PASSWORD, User, cc_err, ui_err, ui_ok, unique, user_obj


# ===========================================================================
# Tokens and the header check (authentication, docs/api.md)
# ===========================================================================

def test_token_by_api_key_and_by_password(env):
    r = env.token(api_key=env.admin.api_key, api_secret=env.admin.api_secret)
    d = ui_ok(r)
    assert set(d) == {"token", "expires_at", "userid"}
    assert d["userid"] == env.admin.id and d["token"]
    assert DATE_TIME.match(d["expires_at"]), d["expires_at"]

    u = env.user(login=False)
    d = ui_ok(env.token(email=u.email, password=u.password))
    assert d["userid"] == u.id and DATE_TIME.match(d["expires_at"])
    u.token = d["token"]
    assert ui_ok(env.call("GET", f"/v1/user/view/{u.id}", who=u))["user"]["id"] == u.id


def test_token_by_key_of_a_managed_user(env):
    u = env.user()
    api_key = user_obj(env, env.admin, u)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    d = ui_ok(env.token(api_key=api_key, api_secret=secret))
    assert d["userid"] == u.id


def test_token_401_cases(env):
    u = env.user()
    ui_err(env.token(email=u.email, password="Wrong-password-1"), 401)
    ui_err(env.token(email=f"{unique('nobody-')}@example.org", password=PASSWORD), 401)
    api_key = user_obj(env, env.admin, u)["api_key"]
    ui_err(env.token(api_key=api_key, api_secret="not-the-secret"), 401)
    ui_err(env.token(api_key="ak_" + uuid.uuid4().hex, api_secret="x"), 401)

    inactive = env.user(login=False, active=0)
    ui_err(env.token(email=inactive.email, password=PASSWORD), 401)

    nulled = env.user(login=False)
    key = user_obj(env, env.admin, nulled)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{nulled.id}", who=env.admin))["api_secret"]
    assert env.token(api_key=key, api_secret=secret).status == 200
    env.call("POST", f"/v1/user/reset_api_secret/{nulled.id}", who=env.admin, json_body={"set_to_null": True})
    ui_err(env.token(api_key=key, api_secret=secret), 401)


def test_header_check_on_both_interfaces(env):
    a, b = env.users({}, {"login": False})
    for path, err in (("/v1/user/list", ui_err), ("/v1/server-image", cc_err)):
        err(env.call("GET", path), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": a.token}), 401)
        err(env.call("GET", path, headers={"X-Auth-Cloudauth-Id": a.id}), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": "garbage", "X-Auth-Cloudauth-Id": a.id}), 401)
        # a real token presented under someone else's id
        err(env.call("GET", path, headers={"X-Auth-Token": a.token, "X-Auth-Cloudauth-Id": b.id}), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": a.token, "X-Auth-Cloudauth-Id": "not-a-uuid"}), 401)
        assert env.call("GET", path, who=a).status == 200


def test_null_api_secret_locks_the_user_out(env):
    u = env.user(login="password")
    ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, json_body={"set_to_null": True}))
    ui_err(env.token(email=u.email, password=u.password), 401)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=u), 401)
    cc_err(env.call("GET", "/v1/server-image", who=u), 401)


def test_tokens_die_on_password_set_secret_reset_and_deactivation(env):
    u = env.user(login="password")
    pw_token = u.token
    key = user_obj(env, env.admin, u)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    key_token = ui_ok(env.token(api_key=key, api_secret=secret))["token"]
    as_key = User(id=u.id, email=u.email, password="", token=key_token)

    ui_ok(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin,
                   json_body={"password": "Another-pass-22"}), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=u), 401)  # password token died
    assert env.call("GET", f"/v1/user/view/{u.id}", who=as_key).status == 200  # key token lives

    pw_token = ui_ok(env.token(email=u.email, password="Another-pass-22"))["token"]
    as_pw = User(id=u.id, email=u.email, password="", token=pw_token)
    new = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin))["api_secret"]
    assert isinstance(new, str) and new and new != secret
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=as_key), 401)
    assert env.call("GET", f"/v1/user/view/{u.id}", who=as_pw).status == 200  # a reset kills key tokens only
    ui_err(env.token(api_key=key, api_secret=secret), 401)
    key_token = ui_ok(env.token(api_key=key, api_secret=new))["token"]
    as_key.token = key_token

    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, json_body={"active": 0}), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=as_key), 401)
