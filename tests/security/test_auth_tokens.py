"""POST /v1/auth/token, the header check, token revocation, throttling, secrets at rest (authentication, docs/api.md)."""

import glob
import time
import types
from datetime import datetime, timezone

import pytest
from argon2 import PasswordHasher
from cryptography.fernet import Fernet

from controller.auth import tokens as auth
from controller.security.crypto import token_hash
from controller.security.throttle import FailureThrottle
from tests.fixtures.api import PASSWORD, make_caller, user_envelope

NEW_PASSWORD = "Another-pass-77"


@pytest.fixture
def alice(ctx):
    return make_caller(ctx, "alice@example.org")


def token_by_key(client, caller, secret=None):
    return client.simulate_post(
        "/v1/auth/token", json={"api_key": caller.api_key, "api_secret": secret or caller.api_secret}
    )


def token_by_password(client, email, password=PASSWORD):
    return client.simulate_post("/v1/auth/token", json={"email": email, "password": password})


def headers(token: str, user_id: str) -> dict:
    return {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": user_id}


def whoami(client, token: str, user_id: str):
    return client.simulate_get(f"/v1/user/view/{user_id}", headers=headers(token, user_id))


def issued(resp) -> dict:
    return user_envelope(resp, 200, data=True)


# -- issuance -----------------------------------------------------------------
@pytest.mark.parametrize("how", ["key", "password", "password-form", "key-form"])
def test_token_issued(ctx, user_client, alice, how):
    before = int(time.time())
    if how == "key":
        resp = token_by_key(user_client, alice)
    elif how == "password":
        resp = token_by_password(user_client, "ALICE@example.org")
    elif how == "password-form":
        resp = user_client.simulate_post(
            "/v1/auth/token", body=f"email=alice%40example.org&password={PASSWORD}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    else:
        resp = user_client.simulate_post(
            "/v1/auth/token", body=f"api_key={alice.api_key}&api_secret={alice.api_secret}",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    data = issued(resp)
    assert set(data) == {"token", "expires_at", "userid"}
    assert data["userid"] == alice.id
    expires = datetime.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    ttl = ctx.config.auth.token_ttl_seconds
    assert before + ttl <= expires.timestamp() <= time.time() + ttl
    # Only a hash of the token is stored, tagged with how it was obtained.
    row = ctx.store.conn.execute(
        "SELECT user_id, source, expires_at FROM tokens WHERE token_hash = ?", (token_hash(data["token"]),)
    ).fetchone()
    assert tuple(row) == (alice.id, "api_key" if how.startswith("key") else "password", int(expires.timestamp()))
    plain = ctx.store.conn.execute("SELECT COUNT(*) FROM tokens WHERE token_hash = ?", (data["token"],))
    assert plain.fetchone()[0] == 0
    user_envelope(whoami(user_client, data["token"], alice.id), 200, data=True)


def test_each_token_is_new(user_client, alice):
    first = issued(token_by_key(user_client, alice))["token"]
    second = issued(token_by_key(user_client, alice))["token"]
    assert first != second
    for token in (first, second):
        user_envelope(whoami(user_client, token, alice.id), 200, data=True)


def test_wrong_secret_is_401(user_client, alice):
    resp = token_by_key(user_client, alice, secret=alice.api_secret[:-1] + "x")
    user_envelope(resp, 401)
    assert resp.headers.get("WWW-Authenticate")


def test_unknown_api_key_is_401(user_client, alice):
    resp = user_client.simulate_post("/v1/auth/token", json={"api_key": "ak_nope", "api_secret": alice.api_secret})
    user_envelope(resp, 401)


def test_another_users_secret_is_401(ctx, user_client, alice):
    bob = make_caller(ctx, "bob@example.org")
    user_envelope(token_by_key(user_client, alice, secret=bob.api_secret), 401)


@pytest.mark.parametrize("email, password", [
    ("alice@example.org", "Wrong-password-1"),
    ("alice@example.org", PASSWORD + "x"),
    ("nobody@example.org", PASSWORD),
])
def test_wrong_password_or_email_is_401(user_client, alice, email, password):
    resp = token_by_password(user_client, email, password)
    user_envelope(resp, 401)
    # The same message whichever part was wrong: no hint which emails exist.
    assert resp.json["message"] == "invalid credentials"


@pytest.mark.parametrize("how", ["key", "password"])
def test_inactive_user_gets_no_token(ctx, user_client, alice, how):
    ctx.store.update_user(alice.id, {"active": 0})
    resp = token_by_key(user_client, alice) if how == "key" else token_by_password(user_client, alice.email)
    user_envelope(resp, 401)


def test_null_secret_after_reset_with_set_to_null(ctx, user_client, admin, alice):
    resp = user_client.simulate_post(
        f"/v1/user/reset_api_secret/{alice.id}", headers=admin.headers, json={"set_to_null": True}
    )
    user_envelope(resp, 200, data=True)
    user_envelope(token_by_key(user_client, alice), 401)
    # Neither an empty nor a guessed secret matches a null one.
    guess = {"api_key": alice.api_key, "api_secret": "null"}
    user_envelope(user_client.simulate_post("/v1/auth/token", json=guess), 401)
    # A null secret shuts the user out of the cloud APIs altogether (spec 4.6): password
    # logins and tokens issued from the password stop too.
    user_envelope(token_by_password(user_client, alice.email), 401)
    user_envelope(user_client.simulate_get("/v1/user/list", headers=alice.headers), 401)
    # A new secret lets the user back in.
    user_envelope(user_client.simulate_post(f"/v1/user/reset_api_secret/{alice.id}", headers=admin.headers), 200,
                  data=True)
    issued(token_by_password(user_client, alice.email))


@pytest.mark.parametrize("body", [
    {},
    {"api_key": "ak_x"},
    {"api_secret": "s"},
    {"email": "alice@example.org"},
    {"password": PASSWORD},
    {"api_key": "ak_x", "api_secret": "s", "email": "alice@example.org", "password": PASSWORD},
    {"api_key": "", "api_secret": ""},
    {"email": 5, "password": PASSWORD},
    {"api_key": ["ak_x"], "api_secret": "s"},
])
def test_incomplete_or_mixed_credentials_are_400(ctx, user_client, alice, body):
    user_envelope(user_client.simulate_post("/v1/auth/token", json=body), 400)
    assert ctx.store.conn.execute("SELECT COUNT(*) FROM tokens WHERE source = 'password'").fetchone()[0] == 0


def test_token_endpoint_is_post_only(user_client):
    resp = user_client.simulate_get("/v1/auth/token")
    user_envelope(resp, 405)
    assert "POST" in resp.headers["Allow"]


# -- the header check ---------------------------------------------------------
@pytest.mark.parametrize("sent", [
    {},
    {"X-Auth-Token": "TOKEN"},
    {"X-Auth-Cloudauth-Id": "ID"},
    {"X-Auth-Token": "", "X-Auth-Cloudauth-Id": "ID"},
    {"X-Auth-Token": "TOKEN", "X-Auth-Cloudauth-Id": ""},
    {"X-Auth-Token": "TOKEN", "X-Auth-Cloudauth-Id": "not-a-uuid"},
    {"X-Auth-Token": "TOKENx", "X-Auth-Cloudauth-Id": "ID"},
    {"X-Auth-Token": "garbage", "X-Auth-Cloudauth-Id": "ID"},
])
@pytest.mark.parametrize("path", ["/v1/user/list", "/v1/user/view/{id}"])
def test_missing_or_bad_headers_are_401(user_client, alice, sent, path):
    values = {"TOKEN": alice.token, "TOKENx": alice.token + "x", "ID": alice.id, "UPPER": alice.id.upper()}
    sent = {k: values.get(v, v) for k, v in sent.items()}
    resp = user_client.simulate_get(path.format(id=alice.id), headers=sent)
    user_envelope(resp, 401)
    assert resp.headers.get("WWW-Authenticate")


def test_token_of_another_user_id_is_401(ctx, user_client, admin, alice):
    # alice's valid token presented as the superuser's id must not grant the superuser's rights.
    resp = user_client.simulate_get("/v1/user/list", headers=headers(alice.token, admin.id))
    user_envelope(resp, 401)
    resp = user_client.simulate_get("/v1/user/list", headers=headers(admin.token, alice.id))
    user_envelope(resp, 401)


def test_expired_token_is_401(ctx, user_client, alice, monkeypatch):
    data = issued(token_by_password(user_client, alice.email))
    expires_at = ctx.store.conn.execute(
        "SELECT expires_at FROM tokens WHERE token_hash = ?", (token_hash(data["token"]),)
    ).fetchone()[0]
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(time=lambda: expires_at - 1))
    user_envelope(whoami(user_client, data["token"], alice.id), 200, data=True)
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(time=lambda: expires_at))
    user_envelope(whoami(user_client, data["token"], alice.id), 401)
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(time=lambda: expires_at + 86400))
    user_envelope(whoami(user_client, alice.token, alice.id), 401)


def test_token_ttl_comes_from_config(ctx, user_client, alice, monkeypatch):
    ctx.config = ctx.config.with_values({"auth": {"token_ttl_seconds": "60"}})
    now = int(time.time())
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(time=lambda: now))
    token = issued(token_by_key(user_client, alice))["token"]
    monkeypatch.setattr(auth, "time", types.SimpleNamespace(time=lambda: now + 60))
    user_envelope(whoami(user_client, token, alice.id), 401)


def test_deactivated_user_is_401_and_stays_out_after_reactivation(ctx, user_client, admin, alice):
    password_token = issued(token_by_password(user_client, alice.email))["token"]
    resp = user_client.simulate_post(f"/v1/user/update/{alice.id}", headers=admin.headers, json={"active": 0})
    user_envelope(resp, 200)
    for token in (alice.token, password_token):
        user_envelope(whoami(user_client, token, alice.id), 401)
    assert ctx.store.conn.execute("SELECT COUNT(*) FROM tokens WHERE user_id = ?", (alice.id,)).fetchone()[0] == 0
    user_envelope(user_client.simulate_post(f"/v1/user/update/{alice.id}", headers=admin.headers,
                                            json={"active": 1}), 200)
    for token in (alice.token, password_token):
        user_envelope(whoami(user_client, token, alice.id), 401)
    issued(token_by_key(user_client, alice))


def test_inactive_user_token_refused_even_if_still_stored(ctx, user_client, alice):
    # Belt and braces: the check itself looks at `active`, not only at token deletion.
    ctx.store.conn.execute("UPDATE users SET active = 0 WHERE id = ?", (alice.id,))
    user_envelope(whoami(user_client, alice.token, alice.id), 401)


def test_deleted_user_tokens_die(ctx, user_client, admin, alice):
    user_envelope(user_client.simulate_post(f"/v1/user/delete/{alice.email}", headers=admin.headers), 200)
    user_envelope(whoami(user_client, alice.token, alice.id), 401)
    assert ctx.store.conn.execute("SELECT COUNT(*) FROM tokens WHERE user_id = ?", (alice.id,)).fetchone()[0] == 0


def test_roles_are_read_on_every_request(ctx, user_client, alice):
    resp = user_client.simulate_post("/v1/user/create", headers=alice.headers,
                                     json={"email": "b@example.org", "password": PASSWORD})
    user_envelope(resp, 403)
    ctx.store.update_user(alice.id, {"roles": ["create_user"]})
    resp = user_client.simulate_post("/v1/user/create", headers=alice.headers,
                                     json={"email": "b@example.org", "password": PASSWORD})
    user_envelope(resp, 200, data=True)


# -- revocation ---------------------------------------------------------------
def test_reset_api_secret_kills_key_tokens_only(ctx, user_client, admin, alice):
    password_token = issued(token_by_password(user_client, alice.email))["token"]
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{alice.id}", headers=admin.headers)
    new_secret = user_envelope(resp, 200, data=True)["api_secret"]
    user_envelope(whoami(user_client, alice.token, alice.id), 401)
    user_envelope(whoami(user_client, password_token, alice.id), 200, data=True)
    user_envelope(token_by_key(user_client, alice), 401)
    fresh = issued(token_by_key(user_client, alice, secret=new_secret))["token"]
    user_envelope(whoami(user_client, fresh, alice.id), 200, data=True)


def test_set_password_kills_password_tokens_only(ctx, user_client, admin, alice):
    password_token = issued(token_by_password(user_client, alice.email))["token"]
    resp = user_client.simulate_post(f"/v1/user/set_password/{alice.id}", headers=admin.headers,
                                     json={"password": NEW_PASSWORD})
    user_envelope(resp, 200)
    user_envelope(whoami(user_client, password_token, alice.id), 401)
    user_envelope(whoami(user_client, alice.token, alice.id), 200, data=True)
    user_envelope(token_by_password(user_client, alice.email), 401)
    issued(token_by_password(user_client, alice.email, NEW_PASSWORD))


def test_revocation_touches_only_that_user(ctx, user_client, admin, alice):
    bob = make_caller(ctx, "bob@example.org")
    for call, body in (("reset_api_secret", None), ("set_password", {"password": NEW_PASSWORD})):
        user_envelope(user_client.simulate_post(f"/v1/user/{call}/{alice.id}", headers=admin.headers, json=body),
                      200, data=call == "reset_api_secret")
    user_envelope(user_client.simulate_post(f"/v1/user/update/{alice.id}", headers=admin.headers,
                                            json={"active": 0}), 200)
    user_envelope(whoami(user_client, bob.token, bob.id), 200, data=True)
    user_envelope(whoami(user_client, admin.token, admin.id), 200, data=True)


# -- throttling ---------------------------------------------------------------
def test_repeated_password_failures_give_429_with_retry_after(ctx, user_client, alice):
    limit = ctx.config.auth.max_failures
    for _ in range(limit):
        user_envelope(token_by_password(user_client, alice.email, "Wrong-password-1"), 401)
    resp = token_by_password(user_client, alice.email, "Wrong-password-1")
    user_envelope(resp, 429)
    assert 0 < int(resp.headers["Retry-After"]) <= ctx.config.auth.lockout_seconds + 1
    # Locked out means locked out: the right password (in any letter case) waits too.
    user_envelope(token_by_password(user_client, alice.email.upper()), 429)
    # Another user, and alice's API key, are not affected.
    bob = make_caller(ctx, "bob@example.org")
    issued(token_by_password(user_client, bob.email))
    issued(token_by_key(user_client, alice))


def test_repeated_secret_failures_give_429(ctx, user_client, alice):
    limit = ctx.config.auth.max_failures
    for _ in range(limit):
        user_envelope(token_by_key(user_client, alice, secret="wrong"), 401)
    resp = token_by_key(user_client, alice)
    user_envelope(resp, 429)
    assert int(resp.headers["Retry-After"]) > 0
    issued(token_by_password(user_client, alice.email))


def test_lockout_ends_and_success_resets_the_count(ctx, user_client, alice):
    now = [1000.0]
    ctx.throttle = FailureThrottle(max_failures=3, window_seconds=60, lockout_seconds=30, clock=lambda: now[0])
    wrong = lambda: token_by_password(user_client, alice.email, "Wrong-password-1")  # noqa: E731
    for _ in range(2):
        user_envelope(wrong(), 401)
    issued(token_by_password(user_client, alice.email))
    for _ in range(2):
        user_envelope(wrong(), 401)
    issued(token_by_password(user_client, alice.email))  # the success reset the count
    for _ in range(3):
        user_envelope(wrong(), 401)
    resp = token_by_password(user_client, alice.email)
    user_envelope(resp, 429)
    assert resp.headers["Retry-After"] == "31"
    now[0] += 29
    user_envelope(token_by_password(user_client, alice.email), 429)
    now[0] += 2
    issued(token_by_password(user_client, alice.email))
    # Failures spread wider than the window never lock.
    for _ in range(5):
        user_envelope(wrong(), 401)
        now[0] += 31
    issued(token_by_password(user_client, alice.email))


# -- secrets at rest ----------------------------------------------------------
def _database_bytes(ctx) -> bytes:
    ctx.store.conn.execute("PRAGMA wal_checkpoint(FULL)")
    return b"".join(open(p, "rb").read() for p in glob.glob(ctx.config.database_path + "*"))


def test_passwords_stored_only_as_argon2_hashes(ctx, user_client, admin, alice):
    user_envelope(user_client.simulate_post("/v1/user/create", headers=admin.headers,
                                            json={"email": "c@example.org", "password": "Created-by-api-1"}), 200,
                  data=True)
    user_envelope(user_client.simulate_post(f"/v1/user/set_password/{alice.id}", headers=admin.headers,
                                            json={"password": NEW_PASSWORD}), 200)
    hasher = PasswordHasher()
    for email, password in (("alice@example.org", NEW_PASSWORD), ("c@example.org", "Created-by-api-1")):
        row = ctx.store.get_user_by_email(email)
        assert row["password_hash"].startswith("$argon2id$")
        assert hasher.verify(row["password_hash"], password)
    # Salted: the same password gives different hashes.
    assert ctx.store.get_user(admin.id)["password_hash"] != ctx.passwords.hash(PASSWORD)
    data = _database_bytes(ctx)
    for password in (PASSWORD, NEW_PASSWORD, "Created-by-api-1"):
        assert password.encode() not in data


def test_api_secret_encrypted_at_rest(ctx, user_client, admin, alice):
    resp = user_client.simulate_post(f"/v1/user/reset_api_secret/{admin.id}", headers=admin.headers)
    new_secret = user_envelope(resp, 200, data=True)["api_secret"]
    data = _database_bytes(ctx)
    for secret in (alice.api_secret, new_secret):
        assert secret.encode() not in data
    key_file = ctx.config.auth.secret_key_file
    assert key_file != ctx.config.database_path
    key = open(key_file, "rb").read().strip()
    assert key not in data
    fernet = Fernet(key)
    assert fernet.decrypt(ctx.store.get_user(alice.id)["api_secret_enc"].encode()).decode() == alice.api_secret
    assert fernet.decrypt(ctx.store.get_user(admin.id)["api_secret_enc"].encode()).decode() == new_secret
    # Tokens are kept as hashes only.
    assert alice.token.encode() not in data

