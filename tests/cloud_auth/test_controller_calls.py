"""Cloud auth's calls for the controllers it serves: the one credential (`Authorization:
Controller N:SECRET`) reaches exactly introspection, the feed and its own accounts; a
user's token reaches none of them; a controller's credential reaches nothing else."""

import json
import time

import pytest
from falcon import testing

from controller.auth.tokens import issue_token
from controller.cloud_auth import registry
from tests.fixtures.api import PASSWORD, make_caller, user_envelope


def auth(made: dict, secret: str | None = None) -> dict:
    return {"Authorization": f"Controller {made['id']}:{secret or made['secret']}"}


CALLS = [
    ("POST", "/v1/auth/introspect", {"token": "x" * 43, "userid": "00000000-0000-4000-8000-000000000000"}),
    ("GET", "/v1/auth/changes", None),
    ("PUT", "/v1/auth/accounts/2/alice", {"user_id": "00000000-0000-4000-8000-000000000000",
                                          "uuid": "00000000-0000-4000-8000-000000000001", "uid": 20001}),
    ("DELETE", "/v1/auth/accounts/2/alice", None),
]


def call(client, method, path, body, headers):
    return client.simulate_request(method, path, headers=headers, json=body)


@pytest.mark.parametrize("method,path,body", CALLS)
def test_only_the_controllers_credential_reaches_its_calls(ctx, app_client, hpc, method, path, body):
    user = make_caller(ctx, "alice@example.org", roles=("superuser",))
    other = registry.add_controller(ctx, controller_id=3, name="hpc2", url="https://hpc2.example.org")
    refused = {
        "nothing": {},
        "a superuser's token": user.headers,
        "a superuser's token as the credential": {"Authorization": f"Controller 2:{user.token}", **user.headers},
        "a wrong secret": auth(hpc, registry.new_secret()),
        "another controller's secret": auth({"id": 2, "secret": other["secret"]}),
        "no id": {"Authorization": f"Controller :{hpc['secret']}"},
        "a bearer": {"Authorization": f"Bearer {hpc['secret']}"},
        "an unknown controller": auth({"id": 9, "secret": hpc["secret"]}),
    }
    for why, headers in refused.items():
        r = call(app_client, method, path, body, headers)
        user_envelope(r, 401)
        assert "controller" in r.json["message"], why
    # Disabled: 403, with the right secret; enabled again: through.
    registry.set_enabled(ctx, 2, False)
    user_envelope(call(app_client, method, path, body, auth(hpc)), 403)
    registry.set_enabled(ctx, 2, True)
    r = call(app_client, method, path, body, auth(hpc))
    assert r.status_code in (200, 404), r.text  # 404: the made-up user or account, past authentication


def _routes(app) -> list[tuple[str, str]]:
    """Every (method, path template) the app answers, from its router."""
    found = []

    def walk(nodes):
        for node in nodes:
            if node.resource is not None and node.method_map:
                for method, responder in node.method_map.items():
                    if method in ("GET", "POST", "PUT", "DELETE", "PATCH") and \
                            getattr(responder, "__name__", "") != "method_not_allowed":
                        found.append((method, node.uri_template))
            walk(node.children)

    walk(app._router._roots)
    return found


def test_a_controllers_credential_reaches_nothing_else(ctx, hpc):
    from api.app import create_app

    app = create_app(ctx, interfaces=("controller", "user", "portal"))
    client = testing.TestClient(app)
    own = {("POST", "/v1/auth/introspect"), ("GET", "/v1/auth/changes"),
           ("PUT", "/v1/auth/accounts/{controller_id}/{username}"),
           ("DELETE", "/v1/auth/accounts/{controller_id}/{username}")}
    routes = _routes(app)
    assert own <= set(routes)
    checked = 0
    for method, template in routes:
        # Public: the health check, the API's description, logging in, and `/`, which sends a
        # browser to the portal (checked below with the portal's pages).
        if (method, template) in own or template in ("/healthz", "/v1/openapi.json", "/v1/auth/token", "/") \
                or template.startswith("/portal"):
            continue
        path = template
        for name in ("{instance_id}", "{volume_id}", "{group_id}", "{userid}", "{email}", "{image_id}",
                     "{flavor_id}"):
            path = path.replace(name, "00000000-0000-4000-8000-000000000000")
        r = client.simulate_request(method, path, headers=auth(hpc), json={})
        assert r.status_code == 401, (method, template, r.status_code, r.text)
        checked += 1
    assert checked >= 20
    # The portal's pages do not take it either: they send a browser to the login.
    r = client.simulate_get("/portal/", headers=auth(hpc))
    assert r.status_code in (303, 302) and "/portal/login" in r.headers["location"]
    r = client.simulate_get("/", headers=auth(hpc))
    assert r.status_code == 303 and r.headers["location"] == "/portal/" and r.text == ""


def test_introspection_answers_a_live_token_and_the_feeds_number(ctx, app_client, hpc):
    alice = make_caller(ctx, "alice@example.org")
    r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc),
                                 json={"token": alice.token, "userid": alice.id})
    got = user_envelope(r, 200, data=True)
    _, last = ctx.store.feed_bounds()
    assert got["active"] is True and got["userid"] == alice.id and got["source"] == "api_key"
    assert got["seq"] == last > 0
    assert got["expires_at"].endswith("Z") and got["issued_at"].endswith("Z")
    # Another user's id with this token, a token never issued: inactive.
    bob = make_caller(ctx, "bob@example.org")
    for token, userid in ((alice.token, bob.id), ("y" * 43, alice.id)):
        r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json={"token": token, "userid": userid})
        assert user_envelope(r, 200, data=True) == {"active": False, "seq": ctx.store.feed_bounds()[1]}
    # The token's secret reset: inactive, and the revocation is in the feed after the number given.
    before = got["seq"]
    ctx.store.set_api_secret(alice.id, ctx.secret_box.encrypt("new-secret-" + "x" * 20))
    r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json={"token": alice.token,
                                                                                 "userid": alice.id})
    assert user_envelope(r, 200, data=True)["active"] is False
    page = user_envelope(app_client.simulate_get("/v1/auth/changes", headers=auth(hpc),
                                                 params={"since": str(before)}), 200, data=True)
    from controller.security.crypto import token_hash

    assert {"token_hash": token_hash(alice.token)} in page["revocations"]
    # Bad input: 400 in the envelope; the token never in the URL.
    for body in ({"userid": alice.id}, {"token": alice.token}, {"token": alice.token, "userid": "nope"}):
        user_envelope(app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json=body), 400)
    r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), params={"token": alice.token},
                                 json={"userid": alice.id})
    assert user_envelope(r, 400) is None and "body" in r.json["message"]


def test_an_expired_token_is_not_active(ctx, app_client, hpc, monkeypatch):
    alice = make_caller(ctx, "alice@example.org")
    later = time.time() + ctx.config.auth.token_ttl_seconds + 5
    monkeypatch.setattr(time, "time", lambda: later)
    r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json={"token": alice.token,
                                                                                 "userid": alice.id})
    assert user_envelope(r, 200, data=True)["active"] is False


def test_last_seen_is_kept(ctx, app_client, hpc):
    assert registry.list_controllers(ctx)[0]["last_seen"] is None
    user_envelope(app_client.simulate_get("/v1/auth/changes", headers=auth(hpc)), 200, data=True)
    assert registry.list_controllers(ctx)[0]["last_seen"].endswith("Z")


def test_controller_calls_leave_audit_rows_by_controller(ctx, app_client, hpc):
    alice = make_caller(ctx, "alice@example.org")
    r = app_client.simulate_put("/v1/auth/accounts/2/alice", headers=auth(hpc),
                                json={"user_id": alice.id, "uuid": "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11",
                                      "uid": 20001})
    user_envelope(r, 200, data=True)
    rows = ctx.store._all("SELECT actor, action, result FROM audit WHERE action LIKE 'PUT /v1/auth/accounts%'")
    assert rows == [{"actor": "controller:2", "action": "PUT /v1/auth/accounts/{controller_id}/{username}",
                     "result": "200"}]
    # Introspection and the feed only read: no rows.
    app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json={"token": alice.token, "userid": alice.id})
    assert not ctx.store._all("SELECT 1 FROM audit WHERE action LIKE '%introspect%' OR action LIKE '%changes%'")
    # Nothing of the secret or the token in the audit table.
    dump = json.dumps(ctx.store._all("SELECT * FROM audit"))
    assert hpc["secret"] not in dump and alice.token not in dump and PASSWORD not in dump


def test_a_token_from_a_password_login_is_introspected_with_its_source(ctx, app_client, hpc):
    alice = make_caller(ctx, "alice@example.org")
    token = issue_token(ctx, email="alice@example.org", password=PASSWORD)["token"]
    r = app_client.simulate_post("/v1/auth/introspect", headers=auth(hpc), json={"token": token, "userid": alice.id})
    assert user_envelope(r, 200, data=True)["source"] == "password"
