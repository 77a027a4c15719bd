"""Defences found by review: cheap refusals before expensive work, no secrets in URLs or caches."""

import pytest

from controller.audit import trail as audit
from tests.fixtures.api import make_caller


@pytest.mark.parametrize("body", [
    {"api_key": "x" * 1_000_000, "api_secret": "s"},
    {"api_key": "not-a-key", "api_secret": "s"},
    {"api_key": "ak_" + "0" * 32, "api_secret": "s" * 10_000},
    {"email": "x" * 10_000 + "@example.org", "password": "p"},
    {"email": "no-at-sign", "password": "p"},
])
def test_impossible_credentials_fail_before_any_throttle_state(user_client, ctx, body):
    r = user_client.simulate_post("/v1/auth/token", json=body)
    assert r.status_code == 401 and r.json["success"] is False
    assert ctx.throttle._failures == {} and ctx.throttle._locked_until == {}


def test_throttle_memory_does_not_grow_with_key_length(ctx):
    ctx.throttle.failed("email:" + "y" * 1_000_000)
    [slot] = ctx.throttle._failures
    assert len(slot) == 64


@pytest.mark.parametrize("query", ["password=Secret-pass-2026", "api_secret=abc"])
def test_secrets_in_the_url_are_refused(user_client, admin, query):
    r = user_client.simulate_post(f"/v1/auth/token?{query}", json={"email": admin.email, "password": "x"})
    assert r.status_code == 400 and "body" in r.json["message"]
    r = user_client.simulate_post(f"/v1/user/set_password/{admin.id}?{query}", headers=admin.headers)
    assert r.status_code == 400


def test_user_interface_answers_are_not_cached(user_client, admin):
    r = user_client.simulate_post("/v1/auth/token", json={"api_key": admin.api_key, "api_secret": admin.api_secret})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    r = user_client.simulate_get(f"/v1/user/view_api_secret/{admin.id}", headers=admin.headers)
    assert r.headers["cache-control"] == "no-store"


def test_audit_target_is_bounded(client, cctx):
    caller = make_caller(cctx, "long@example.org")
    r = client.simulate_delete("/v1/group/" + "A" * 200_000, headers=caller.headers)
    assert r.status_code == 404
    [row] = audit.list_entries(cctx.store)
    assert row["actor"] == caller.id and len(row["target"]) <= 100


def test_healthz_runs_the_checks_once_per_interval(client, adapters, monkeypatch):
    calls = []
    original = adapters.hypervisor.check
    monkeypatch.setattr(adapters.hypervisor, "check", lambda: calls.append(1) or original())
    for _ in range(5):
        assert client.simulate_get("/healthz").status_code == 200
    assert len(calls) == 1


def test_expired_tokens_are_purged(ctx, admin):
    import time

    ctx.store.insert_token(token_hash="old", user_id=admin.id, source="password", expires_at=int(time.time()) - 10)
    assert ctx.store.purge_expired_tokens(now=int(time.time())) == 1
    assert ctx.store.token_owner("old", now=0) is None
    make_caller(ctx, "still@example.org")  # a live token is not purged
    assert ctx.store.purge_expired_tokens(now=int(time.time())) == 0
