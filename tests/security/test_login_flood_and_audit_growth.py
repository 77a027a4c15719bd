"""Unauthenticated stall and audit growth (issue 8, finding 4).

A saturated password-hash pool answers 429 at once instead of parking a
server thread; failed requests without an identity are counted and written as
one row per interval, not one row each; old audit rows are pruned by
`cloud-agent audit --prune` and by the server under `[audit] retention_days`.
"""

import configparser
import json
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from controller.audit import trail as audit
from controller.config import config_from_dict
from controller.errors import InvalidInput
from tests.fixtures.api import PASSWORD, make_caller, user_envelope
from tests.agent.test_agent_controller import sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.fixtures.server import Server


class SlowHasher:
    """Stands in for argon2: every verify waits until the test lets it go."""

    def __init__(self, real):
        self.real = real
        self.inside = threading.Semaphore(0)
        self.go = threading.Event()

    def hash(self, password):
        return self.real.hash(password)

    def verify(self, password_hash, password):
        self.inside.release()
        assert self.go.wait(30), "the test never let the hash finish"
        return self.real.verify(password_hash, password)


def password_login(client, email=None, password=PASSWORD, address="127.0.0.1"):
    return client.simulate_post("/v1/auth/token", json={"email": email, "password": password},
                                remote_addr=address)


# -- the hash pool --------------------------------------------------------------------------
def test_a_saturated_hash_pool_answers_429_at_once(ctx, user_client, monkeypatch):
    alice = make_caller(ctx, "alice@example.org")
    slow = SlowHasher(ctx.passwords._hasher)
    monkeypatch.setattr(ctx.passwords, "_hasher", slow)
    results = []
    # One address per slot: an address holds at most half of them (tests/security/test_login_sources.py).
    addresses = [f"192.0.2.{n}" for n in range(10, 10 + ctx.config.auth.max_password_checks)]
    hashing = [threading.Thread(target=lambda a=address: results.append(
        password_login(user_client, "alice@example.org", address=a))) for address in addresses]
    for t in hashing:
        t.start()
    try:
        for _ in hashing:
            assert slow.inside.acquire(timeout=10), "a login never reached the hash"
        # Every slot hashes (and waits): one more login is answered without waiting for any.
        started = time.monotonic()
        r = password_login(user_client, "alice@example.org", address="192.0.2.3")
        elapsed = time.monotonic() - started
        user_envelope(r, 429)
        assert elapsed < 1.0, f"the login waited {elapsed:.1f} s for a hash slot"
        assert int(r.headers["retry-after"]) >= 1
        assert not slow.go.is_set() and all(t.is_alive() for t in hashing)
        # It was not a failure of alice's: the pool, not her password, refused it.
        assert ctx.throttle._failures == {} and ctx.throttle._locked_until == {}
        # A login by API key needs no hash and is served meanwhile.
        r = user_client.simulate_post("/v1/auth/token", json={"api_key": alice.api_key,
                                                               "api_secret": alice.api_secret})
        user_envelope(r, 200, data=True)
    finally:
        slow.go.set()
        for t in hashing:
            t.join(30)
    assert [r.status_code for r in results] == [200] * len(addresses)
    # The slots are free again.
    user_envelope(password_login(user_client, "alice@example.org"), 200, data=True)


def test_the_pool_size_comes_from_the_config(config_values):
    values = dict(config_values, auth=dict(config_values["auth"], max_password_checks=0))
    with pytest.raises(InvalidInput, match="max_password_checks"):
        config_from_dict(values)


# -- anonymous failures -------------------------------------------------------------------------
def test_anonymous_failures_are_counted_not_written_one_row_each(cctx, client):
    known = make_caller(cctx, "known@example.org")
    for i in range(100):
        r = client.simulate_post("/v1/auth/token", json={"api_key": f"ak_{i:032x}", "api_secret": "guess"})
        assert r.status_code == 401
    for _ in range(20):
        r = client.simulate_post("/v1/group", json={"group-name": "g"})
        assert r.status_code == 401
    # An identified caller's failure keeps its own row.
    r = client.simulate_delete("/v1/group/00000000-0000-4000-8000-000000000000", headers=known.headers)
    assert r.status_code == 404

    rows = audit.list_entries(cctx.store)
    assert [(e["actor"], e["action"], e["result"]) for e in rows] == [(known.id, "DELETE /v1/group/{id}",
                                                                       "404")]
    assert cctx.anonymous_failures.pending() == 120

    assert cctx.anonymous_failures.flush() is True
    [_, counted] = audit.list_entries(cctx.store)
    assert (counted["actor"], counted["action"], counted["target"], counted["result"]) == (
        "anonymous", "anonymous failed requests", "", "120")
    assert counted["detail"].endswith(": POST /v1/auth/token 401 x100, POST /v1/group 401 x20")
    assert cctx.anonymous_failures.pending() == 0
    assert cctx.anonymous_failures.flush() is False
    assert len(audit.list_entries(cctx.store)) == 2


def test_the_counts_are_written_when_their_window_ends(ctx):
    from controller.audit.trail import AnonymousFailures

    now = [1000.0]
    counter = AnonymousFailures(ctx.store, interval_seconds=300, clock=lambda: now[0])
    counter.count("POST /v1/auth/token", "401")
    now[0] += 299
    counter.count("POST /v1/auth/token", "429")
    assert counter.flush_if_due() is False and audit.list_entries(ctx.store) == []
    now[0] += 2
    counter.count("POST /v1/user/create", "401")  # the first count after the window writes it
    [row] = audit.list_entries(ctx.store)
    assert row["result"] == "3"
    assert row["detail"].endswith(": POST /v1/auth/token 401 x1, POST /v1/auth/token 429 x1, "
                                  "POST /v1/user/create 401 x1")
    assert counter.pending() == 0
    now[0] += 301
    assert counter.flush_if_due() is False  # nothing counted: no row
    assert len(audit.list_entries(ctx.store)) == 1


def test_distinct_kinds_are_bounded(ctx):
    from controller.audit.trail import AnonymousFailures

    counter = AnonymousFailures(ctx.store, interval_seconds=300)
    for i in range(1000):
        counter.count(f"POST /v1/x{i}", "401")
    assert counter.pending() == 1000 and len(counter._counts) <= 201


# -- retention ------------------------------------------------------------------------------
def add_rows(db_path, *stamps: str) -> None:
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany("INSERT INTO audit (at_utc, actor, action, target, result, detail) "
                         "VALUES (?, 'filler', 'POST /v1/group', '', '201', '')", [(s,) for s in stamps])
    conn.close()


def actors_and_times(sandbox) -> list[tuple]:
    return [(r["actor"], r["at_utc"]) for r in sandbox.rows("SELECT actor, at_utc FROM audit ORDER BY id")]


def recent(days: int) -> str:
    return (datetime.now(timezone.utc) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_prune_removes_old_rows_and_keeps_recent_ones(sandbox):
    d200, d91, d89, d2, d1 = recent(200), recent(91), recent(89), recent(2), recent(1)
    add_rows(sandbox.db_path, "2020-01-01T00:00:00Z", d200, d91, d89, d1)
    kept_before = [row for row in actors_and_times(sandbox) if row[0] != "filler"]

    proc = sandbox.run("--json", "audit", "--prune", "--before", "90d")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"pruned": 3}
    rows = actors_and_times(sandbox)
    assert [t for a, t in rows if a == "filler"] == [d89, d1]
    # What was there besides (the admin's creation) stays, and the prune is itself on record.
    assert rows[:len(kept_before)] == kept_before
    [pruned] = sandbox.rows("SELECT * FROM audit WHERE action = 'cloud-agent audit'")
    assert pruned["result"] == "ok" and "before=90d" in pruned["detail"]

    proc = sandbox.run("--json", "audit", "--prune", "--before", d2)
    assert json.loads(proc.stdout) == {"pruned": 1}
    assert [t for a, t in actors_and_times(sandbox) if a == "filler"] == [d1]
    proc = sandbox.run("audit", "--prune", "--before", "2000-01-01T00:00:00Z")
    assert proc.returncode == 0 and proc.stdout == "pruned 0 audit rows older than 2000-01-01T00:00:00Z\n"


def set_retention(sandbox, days: int) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(sandbox.config)
    parser["audit"] = {"retention_days": str(days)}
    with open(sandbox.config, "w") as f:
        parser.write(f)


def test_prune_without_before_applies_the_configured_retention(sandbox):
    d40, d20 = recent(40), recent(20)
    add_rows(sandbox.db_path, d40, d20)
    # The default retention is finite (365 days): nothing that young goes.
    assert sandbox.ok("audit", "--prune") == {"pruned": 0}
    set_retention(sandbox, 0)  # kept forever: --prune needs --before
    proc = sandbox.run("--json", "audit", "--prune")
    assert proc.returncode == 2 and "retention_days" in json.loads(proc.stdout)["error"]
    assert len([a for a, _ in actors_and_times(sandbox) if a == "filler"]) == 2
    set_retention(sandbox, 30)
    assert sandbox.ok("audit", "--prune") == {"pruned": 1}
    assert [t for a, t in actors_and_times(sandbox) if a == "filler"] == [d20]


@pytest.mark.parametrize("args, code, message", [
    (["--before", "90d"], 2, "--before goes with --prune"),
    (["--prune", "--since", "1d", "--before", "90d"], 2, "--prune takes --before"),
    (["--prune", "--user", "x@example.org", "--before", "90d"], 2, "--prune takes --before"),
    (["--prune", "--before", "last-year"], 1, "--before wants a time"),
])
def test_prune_usage_errors_change_nothing(sandbox, args, code, message):
    add_rows(sandbox.db_path, "2020-01-01T00:00:00Z")
    before = actors_and_times(sandbox)
    proc = sandbox.run("--json", "audit", *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert message in json.loads(proc.stdout)["error"]
    assert actors_and_times(sandbox)[:len(before)] == before


def test_the_server_applies_the_retention(sandbox, tmp_path):
    set_retention(sandbox, 30)
    d31, d29 = recent(31), recent(29)
    add_rows(sandbox.db_path, d31, d29)
    server = Server(sandbox, tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 20
        while d31 in [t for a, t in actors_and_times(sandbox) if a == "filler"]:
            assert time.monotonic() < deadline, "the server never pruned"
            time.sleep(0.1)
    finally:
        log = server.stop()
    assert [t for a, t in actors_and_times(sandbox) if a == "filler"] == [d29]
    assert "audit retention: pruned 1 rows older than 30 days" in log


def test_housekeeping_prunes_once_an_hour_and_flushes_when_due(ctx):
    from controller.audit.trail import AnonymousFailures, Housekeeper

    now = [0.0]
    counter = AnonymousFailures(ctx.store, interval_seconds=3000, clock=lambda: now[0])
    keeper = Housekeeper(store=ctx.store, anonymous=counter, retention_days=30, clock=lambda: now[0])
    add_rows(ctx.config.database_path, recent(31))
    assert keeper.run_once() == 1
    add_rows(ctx.config.database_path, recent(32))
    counter.count("POST /v1/auth/token", "401")
    now[0] += 1800
    assert keeper.run_once() == 0  # within the hour: no prune; within the window: no row
    assert [e["actor"] for e in audit.list_entries(ctx.store)] == ["filler"]
    now[0] += 1800
    assert keeper.run_once() == 1
    assert [e["actor"] for e in audit.list_entries(ctx.store)] == ["anonymous"]
    idle = Housekeeper(store=ctx.store, anonymous=counter, retention_days=0, clock=lambda: now[0])
    add_rows(ctx.config.database_path, "2000-01-01T00:00:00Z")
    assert idle.run_once() == 0 and len(audit.list_entries(ctx.store)) == 2
