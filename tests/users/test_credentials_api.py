"""A user's own credentials through HTTP: GET /v1/user/credentials, POST /v1/user/rotate_api_secret,
POST /v1/user/change_password (the requester only; wrong proofs are failed logins)."""

import logging

import pytest

from tests.fixtures.api import PASSWORD, make_caller, user_envelope

NEW_PASSWORD = "battery-staple-77"


def token_by_password(client, caller, password=PASSWORD):
    return client.simulate_post("/v1/auth/token", json={"email": caller.email, "password": password})


def token_by_key(client, caller, secret):
    return client.simulate_post("/v1/auth/token", json={"api_key": caller.api_key, "api_secret": secret})


def password_headers(client, caller) -> dict:
    data = user_envelope(token_by_password(client, caller), 200, data=True)
    return {"X-Auth-Token": data["token"], "X-Auth-Cloudauth-Id": caller.id}


def works(client, headers) -> bool:
    return client.simulate_get("/v1/user/credentials", headers=headers).status_code == 200


@pytest.fixture
def alice(ctx):
    return make_caller(ctx, "alice@example.org")


@pytest.fixture
def bob(ctx):
    return make_caller(ctx, "bob@example.org")


def test_credentials_shows_the_requesters_key_and_never_a_secret(user_client, alice, bob):
    resp = user_client.simulate_get("/v1/user/credentials", headers=alice.headers)
    data = user_envelope(resp, 200, data=True)
    assert data == {"userid": alice.id, "api_key": alice.api_key, "api_secret_set": True}
    assert alice.api_secret not in resp.text
    assert resp.headers["Cache-Control"] == "no-store"
    data = user_envelope(user_client.simulate_get("/v1/user/credentials", headers=bob.headers), 200, data=True)
    assert data["userid"] == bob.id and data["api_key"] == bob.api_key


@pytest.mark.parametrize("path", ["/v1/user/credentials", "/v1/user/rotate_api_secret",
                                  "/v1/user/change_password"])
def test_every_call_needs_a_token(user_client, alice, path):
    for headers in ({}, {"X-Auth-Token": "nope", "X-Auth-Cloudauth-Id": alice.id}):
        resp = user_client.simulate_request("GET" if path.endswith("credentials") else "POST", path,
                                            headers=headers, json={"password": PASSWORD})
        user_envelope(resp, 401)
    assert token_by_key(user_client, alice, alice.api_secret).status_code == 200


@pytest.mark.parametrize("method, path, allowed", [
    ("POST", "/v1/user/credentials", "GET"),
    ("DELETE", "/v1/user/credentials", "GET"),
    ("GET", "/v1/user/rotate_api_secret", "POST"),
    ("PUT", "/v1/user/rotate_api_secret", "POST"),
    ("GET", "/v1/user/change_password", "POST"),
])
def test_other_methods_are_405(user_client, alice, method, path, allowed):
    resp = user_client.simulate_request(method, path, headers=alice.headers)
    user_envelope(resp, 405)
    assert allowed in resp.headers["Allow"]


@pytest.mark.parametrize("proof", ["password", "api_secret"])
def test_rotate_shows_a_new_secret_once_and_ends_key_tokens(user_client, alice, bob, proof):
    by_password = password_headers(user_client, alice)
    value = PASSWORD if proof == "password" else alice.api_secret
    resp = user_client.simulate_post("/v1/user/rotate_api_secret", headers=alice.headers, json={proof: value})
    data = user_envelope(resp, 200, data=True)
    assert data["api_key"] == alice.api_key and data["api_secret"] not in (alice.api_secret, "")
    assert resp.headers["Cache-Control"] == "no-store" and "Location" not in resp.headers
    # The key-issued token the call came with died; the password-issued one lives.
    user_envelope(user_client.simulate_get("/v1/user/credentials", headers=alice.headers), 401)
    assert works(user_client, by_password)
    user_envelope(token_by_key(user_client, alice, alice.api_secret), 401)
    user_envelope(token_by_key(user_client, alice, data["api_secret"]), 200, data=True)
    # The secret is not shown again, and bob kept his.
    again = user_client.simulate_get("/v1/user/credentials", headers=by_password)
    assert user_envelope(again, 200, data=True)["api_secret_set"] is True
    assert data["api_secret"] not in again.text
    assert works(user_client, bob.headers)
    user_envelope(token_by_key(user_client, bob, bob.api_secret), 200, data=True)


def test_rotate_accepts_a_form_body(user_client, alice):
    resp = user_client.simulate_post("/v1/user/rotate_api_secret", headers=alice.headers,
                                     body=f"password={PASSWORD}",
                                     content_type="application/x-www-form-urlencoded")
    new = user_envelope(resp, 200, data=True)["api_secret"]
    user_envelope(token_by_key(user_client, alice, new), 200, data=True)


@pytest.mark.parametrize("body", [{}, {"password": PASSWORD, "api_secret": "x"}, {"password": ""},
                                  {"password": 12}, {"api_secret": ["x"]}])
def test_rotate_needs_exactly_one_proof_string(user_client, alice, body):
    user_envelope(user_client.simulate_post("/v1/user/rotate_api_secret", headers=alice.headers, json=body), 400)
    user_envelope(token_by_key(user_client, alice, alice.api_secret), 200, data=True)
    assert works(user_client, alice.headers)


@pytest.mark.parametrize("path, body", [
    ("/v1/user/rotate_api_secret?password=" + PASSWORD, {}),
    ("/v1/user/change_password?new_password=" + NEW_PASSWORD, {"password": PASSWORD}),
])
def test_secrets_in_the_url_are_refused(user_client, alice, path, body):
    resp = user_client.simulate_post(path, headers=alice.headers, json=body)
    user_envelope(resp, 400)
    assert "request body, not in the URL" in resp.json["message"]
    user_envelope(token_by_key(user_client, alice, alice.api_secret), 200, data=True)
    user_envelope(token_by_password(user_client, alice), 200, data=True)


def test_wrong_proofs_are_failed_logins_then_429(ctx, user_client, alice, bob):
    for i in range(ctx.config.auth.max_failures):
        body = {"password": "not-the-password-1"} if i % 2 else {"api_secret": "not-the-secret"}
        resp = user_client.simulate_post("/v1/user/rotate_api_secret", headers=alice.headers, json=body)
        user_envelope(resp, 401)
        assert resp.json["message"] == "wrong password or API secret"
    resp = user_client.simulate_post("/v1/user/rotate_api_secret", headers=alice.headers,
                                     json={"password": PASSWORD})
    user_envelope(resp, 429)
    assert int(resp.headers["Retry-After"]) > 0
    resp = user_client.simulate_post("/v1/user/change_password", headers=alice.headers,
                                     json={"password": PASSWORD, "new_password": NEW_PASSWORD})
    user_envelope(resp, 429)
    # alice's password login is locked out too; her token still works (it was no login), nothing
    # changed, and bob logs in.
    user_envelope(token_by_password(user_client, alice), 429)
    assert works(user_client, alice.headers)
    user_envelope(token_by_key(user_client, alice, alice.api_secret), 200, data=True)
    user_envelope(token_by_password(user_client, bob), 200, data=True)


def test_change_password_ends_password_tokens_and_keeps_key_tokens(user_client, alice):
    by_password = password_headers(user_client, alice)
    resp = user_client.simulate_post("/v1/user/change_password", headers=alice.headers,
                                     json={"password": PASSWORD, "new_password": NEW_PASSWORD})
    user_envelope(resp, 200, data=False)
    assert not works(user_client, by_password)
    assert works(user_client, alice.headers)
    user_envelope(token_by_password(user_client, alice), 401)
    user_envelope(token_by_password(user_client, alice, NEW_PASSWORD), 200, data=True)


def test_change_password_from_a_password_token_ends_that_token(user_client, alice):
    by_password = password_headers(user_client, alice)
    resp = user_client.simulate_post("/v1/user/change_password", headers=by_password,
                                     json={"password": PASSWORD, "new_password": NEW_PASSWORD})
    user_envelope(resp, 200, data=False)
    user_envelope(user_client.simulate_get("/v1/user/credentials", headers=by_password), 401)


@pytest.mark.parametrize("body, says", [
    ({"password": PASSWORD, "new_password": "short-1"}, "14 to 24"),
    ({"password": PASSWORD, "new_password": "onlylettersinhere"}, "two of"),
    ({"password": PASSWORD, "new_password": PASSWORD}, "differ"),
    ({"password": PASSWORD}, "new_password"),
    ({"new_password": NEW_PASSWORD}, "password"),
    ({"password": PASSWORD, "new_password": 12345678901234}, "new_password"),
])
def test_change_password_refusals_change_nothing(user_client, alice, body, says):
    by_password = password_headers(user_client, alice)
    resp = user_client.simulate_post("/v1/user/change_password", headers=alice.headers, json=body)
    user_envelope(resp, 400)
    assert says in resp.json["message"]
    assert works(user_client, by_password)
    user_envelope(token_by_password(user_client, alice), 200, data=True)


def test_change_password_with_a_wrong_old_password_is_401(user_client, alice):
    resp = user_client.simulate_post("/v1/user/change_password", headers=alice.headers,
                                     json={"password": "not-the-password-1", "new_password": NEW_PASSWORD})
    user_envelope(resp, 401)
    assert resp.json["message"] == "wrong password"
    user_envelope(token_by_password(user_client, alice, NEW_PASSWORD), 401)
    user_envelope(token_by_password(user_client, alice), 200, data=True)


def test_no_secret_password_or_token_reaches_a_log_line_or_the_audit(ctx, user_client, alice, caplog):
    by_password = password_headers(user_client, alice)
    secrets = [PASSWORD, NEW_PASSWORD, alice.api_secret, alice.token, by_password["X-Auth-Token"], "wrong-proof-99x"]
    with caplog.at_level(logging.DEBUG):
        user_client.simulate_get("/v1/user/credentials", headers=alice.headers)
        user_client.simulate_post("/v1/user/rotate_api_secret", headers=by_password,
                                  json={"api_secret": "wrong-proof-99x"})
        rotated = user_client.simulate_post("/v1/user/rotate_api_secret", headers=by_password,
                                            json={"password": PASSWORD}).json["data"]["api_secret"]
        user_client.simulate_post("/v1/user/change_password", headers=by_password,
                                  json={"password": "wrong-proof-99x", "new_password": NEW_PASSWORD})
        user_client.simulate_post("/v1/user/change_password", headers=by_password,
                                  json={"password": PASSWORD, "new_password": NEW_PASSWORD})
    secrets.append(rotated)
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert "rotate_api_secret" in logged and "change_password" in logged  # the calls were logged
    audit_text = repr(ctx.store.list_audit())
    assert "rotate_api_secret" in audit_text and "change_password" in audit_text
    for secret in secrets:
        assert secret not in logged
        assert secret not in audit_text
