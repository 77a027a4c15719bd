"""Host work never takes the threads reads need (issue 16, finding 4): api/admission.py.

On fake adapters whose spawn waits until the test lets it go, with one host
worker and a queue of one: a second create waits, a third is answered 503 at
once and makes nothing, and reads answer meanwhile. The burst on the real
libvirtd is tests/instances/test_bursts.py.
"""

import threading
import time

import pytest

from api.admission import Gate, server_threads
from controller.config import config_from_dict
from controller.errors import InvalidInput, ServerBusy
from tests.fixtures.api import PASSWORD, config_values_for, enable, give_volume, make_caller


@pytest.fixture
def config_values(tmp_path):
    values = config_values_for(tmp_path)
    values["server"].update({"threads": 1, "host_workers": 1, "host_queue": 1, "host_queue_seconds": 2,
                             "host_work_per_user": 1})
    return values


@pytest.fixture
def held_spawn(cctx, monkeypatch):
    """Every spawn waits for `go`; `inside` counts the spawns that started."""
    from host_adapters.fake_hypervisor import FakeHypervisor as hv_class

    real = hv_class.spawn
    state = type("Held", (), {})()
    state.go, state.inside = threading.Event(), threading.Semaphore(0)

    def spawn(self, *args, **kwargs):
        state.inside.release()
        assert state.go.wait(30), "the test never let the spawn finish"
        return real(self, *args, **kwargs)

    monkeypatch.setattr(hv_class, "spawn", spawn)
    yield state
    state.go.set()


def users(cctx, client, n):
    callers = []
    for i in range(n):
        caller = make_caller(cctx, f"user{i}@example.org")
        enable(cctx, caller)
        give_volume(client, caller)
        callers.append(caller)
    return callers


def create(client, caller, catalog):
    return client.simulate_post("/v1/server-instance", headers=caller.headers,
                                json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]})


def test_host_work_past_workers_and_queue_is_503_at_once_and_reads_go_on(cctx, client, catalog, held_spawn):
    alice, bob, carol = users(cctx, client, 3)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("alice", create(client, alice, catalog)))
    first.start()
    assert held_spawn.inside.acquire(timeout=10), "the first create never reached the host"
    second = threading.Thread(target=lambda: results.setdefault("bob", create(client, bob, catalog)))
    second.start()
    time.sleep(0.2)  # bob's create waits for the one worker
    try:
        started = time.monotonic()
        r = create(client, carol, catalog)
        assert time.monotonic() - started < 1.0
        assert r.status_code == 503 and r.json["success"] is False, r.json
        assert "too many host operations" in r.json["msg"]
        assert int(r.headers["retry-after"]) >= 1
        # Nothing was made for carol; reads and other host-free requests answer meanwhile.
        assert all(row["owner_id"] != carol.id for row in cctx.store.all_instances())
        assert client.simulate_get("/v1/server-flavor", headers=carol.headers).status_code == 200
        assert client.simulate_get("/v1/server-instance", headers=carol.headers).json["data"] == []
    finally:
        held_spawn.go.set()
        first.join(30)
        second.join(30)
    assert results["alice"].status_code == 201 and results["bob"].status_code == 201
    owners = sorted(row["owner_id"] for row in cctx.store.all_instances())
    assert owners == sorted([alice.id, bob.id])
    # The gate is free again: carol's create goes through.
    assert create(client, carol, catalog).status_code == 201


def test_a_wait_past_host_queue_seconds_is_503_and_makes_nothing(cctx, client, catalog, held_spawn):
    alice, bob = users(cctx, client, 2)
    first = threading.Thread(target=lambda: create(client, alice, catalog))
    first.start()
    assert held_spawn.inside.acquire(timeout=10)
    try:
        started = time.monotonic()
        r = create(client, bob, catalog)
        waited = time.monotonic() - started
        assert r.status_code == 503 and "waited" in r.json["msg"], r.json
        assert 1.5 < waited < 10, waited  # host_queue_seconds = 2: a bounded wait
        assert all(row["owner_id"] != bob.id for row in cctx.store.all_instances())
    finally:
        held_spawn.go.set()
        first.join(30)


def test_one_user_holds_at_most_host_work_per_user_places_and_others_still_queue(cctx, client, catalog,
                                                                                   held_spawn):
    alice, bob = users(cctx, client, 2)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("alice", create(client, alice, catalog)))
    first.start()
    assert held_spawn.inside.acquire(timeout=10)
    try:
        # alice's second operation: 429 at once (her one place is taken), nothing made; the
        # queue's place stays free for bob, who waits in it.
        started = time.monotonic()
        r = create(client, alice, catalog)
        assert time.monotonic() - started < 1.0
        assert r.status_code == 429 and "1 host operations of yours are running or waiting already" in r.json["msg"]
        assert int(r.headers["retry-after"]) >= 1
        assert len([row for row in cctx.store.all_instances() if row["owner_id"] == alice.id]) == 1
        second = threading.Thread(target=lambda: results.setdefault("bob", create(client, bob, catalog)))
        second.start()
    finally:
        held_spawn.go.set()
        first.join(30)
    second.join(30)
    assert results["alice"].status_code == 201 and results["bob"].status_code == 201
    # Her place is given back: the next one goes through.
    assert create(client, alice, catalog).status_code == 201


def test_failed_host_work_gives_its_turn_back(cctx, client, catalog):
    alice, = users(cctx, client, 1)
    for _ in range(5):  # one worker, one place in the queue: a leaked turn would refuse the next
        r = client.simulate_post("/v1/server-instance", headers=alice.headers, json={"server-image": "nope"})
        assert r.status_code == 400
    assert create(client, alice, catalog).status_code == 201
    # Anonymous host work is refused by authentication before it takes a turn.
    assert client.simulate_post("/v1/server-instance", json={}).status_code == 401


def test_serve_runs_a_thread_for_each_read_worker_and_queued_host_operation(config_values):
    config = config_from_dict(config_values)
    # threads, one host worker, one queued, and two per password-hash slot.
    assert server_threads(config) == config.server.threads + 1 + 1 + 2 * config.auth.max_password_checks
    for key, bad in (("host_workers", 0), ("host_queue", -1), ("host_queue_seconds", 0), ("threads", 0),
                     ("host_work_per_user", 0)):
        values = dict(config_values, server=dict(config_values["server"], **{key: bad}))
        with pytest.raises(InvalidInput, match=key):
            config_from_dict(values)


def test_password_logins_take_no_turn_from_reads(cctx, client, catalog, monkeypatch):
    """[server] threads = 1 here: a login waiting on its hash must not hold the reads' one turn."""
    from tests.security.test_login_flood_and_audit_growth import SlowHasher

    alice, = users(cctx, client, 1)
    slow = SlowHasher(cctx.passwords._hasher)
    monkeypatch.setattr(cctx.passwords, "_hasher", slow)
    results = []
    login = threading.Thread(target=lambda: results.append(client.simulate_post(
        "/v1/auth/token", json={"email": alice.email, "password": PASSWORD})))
    login.start()
    try:
        assert slow.inside.acquire(timeout=10), "the login never reached the hash"
        started = time.monotonic()
        r = client.simulate_get("/v1/server-flavor", headers=alice.headers)
        assert r.status_code == 200 and time.monotonic() - started < 1.0
        assert {f["name"] for f in r.json["data"]} == {"small", "tiny"}
    finally:
        slow.go.set()
        login.join(30)
    assert results[0].status_code == 200


def test_the_gate_lets_running_in_queues_waiting_and_refuses_the_rest():
    """The gate's counters (api/admission.Gate): `running` enter at once, `waiting` more wait
    for a turn and get one as soon as a runner leaves, anyone past both is refused at once, a
    wait past its bound is refused, and a refused or finished request leaves no count behind."""
    gate = Gate(running=2, waiting=1, wait_seconds=30, what="requests")
    gate.enter()
    gate.enter()
    entered = threading.Event()
    waiter = threading.Thread(target=lambda: (gate.enter(), entered.set()))
    waiter.start()
    # The third waits (no turn yet); a fourth finds the queue full: refused at once.
    assert not entered.wait(0.2)
    with pytest.raises(ServerBusy, match="too many requests at once"):
        gate.enter()
    gate.leave()  # a runner leaves: the waiter takes its turn
    assert entered.wait(5)
    waiter.join(5)
    # Two running, none waiting: a short-bounded gate refuses a wait past its bound.
    short = Gate(running=1, waiting=1, wait_seconds=0.1, what="requests")
    short.enter()
    with pytest.raises(ServerBusy, match="waited"):
        short.enter()
    short.leave()
    short.enter()  # the refused wait left its place: the gate is whole again
    short.leave()
    gate.leave()
    gate.leave()
    with pytest.raises(ValueError):
        gate.leave()  # more leaves than enters is a bug, as with a BoundedSemaphore
