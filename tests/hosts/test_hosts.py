"""Issue 10, many hypervisor hosts: placement, refusals, disable, remove and a dead host.

On fake hosts (FakeHypervisors behind the controller's HostPool, each with its
own capacity) through the API, and on several libvirt test-driver hosts, each
a node file of its own with its own CPUs and memory. Each case checks the
status and what is stored and on which host it is.
"""

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from controller.hosts import host_records, host_routing, image_copy
from controller.storage import images
from controller.config import config_from_dict
from controller.context import build_context
from controller.errors import Conflict, HostUnavailable, NotFound
from controller.maintenance.reconcile import reconcile
from controller.security.crypto import generate_key_file
from controller.store import Store
from host_adapters.hypervisor import HostCapacity
from tests.fixtures.agent import agent_call
from tests.fixtures.api import config_values_for, enable, give_volume, make_caller, ready_to_create
from tests.fixtures.concurrency import together

BASE = "/v1/server-instance"


def ok(r, status=201):
    assert r.status_code == status, r.json
    assert r.json["success"] is True
    return r.json["data"]


def refused(r, status):
    assert r.status_code == status, r.json
    assert r.json == {"data": [], "msg": r.json["msg"], "success": False}
    return r.json["msg"]


def capacity(cctx, ram_ratio=1.0, cpu_ratio=1.0):
    cctx.config = cctx.config.with_values({"capacity": {
        "cpu_allocation_ratio": str(cpu_ratio), "ram_allocation_ratio": str(ram_ratio),
        "reserved_host_memory_mb": "0"}})


@pytest.fixture
def cluster(cctx, adapters):
    """Three hosts: the config's own ("default", 4 GiB), node-a (8 GiB) and node-b (6 GiB)."""
    capacity(cctx)
    adapters.hypervisor.capacity = HostCapacity(vcpus=16, memory_mb=4096)
    fakes = adapters.fake_hosts
    fakes.add("node-a", vcpus=16, memory_mb=8192)
    fakes.add("node-b", vcpus=16, memory_mb=6144)
    host_records.add_host(cctx, name="node-a", uri="fake://node-a")
    host_records.add_host(cctx, name="node-b", uri="fake://node-b")
    return fakes.fakes


NO_INSTANCE_LIMITS = {"limits": {"instances": "-1", "vcpus": "-1", "memory_mb": "-1", "groups": "5",
                                 "managed_users": "5"}}


@pytest.fixture
def alice(cctx, client):
    caller = make_caller(cctx, "alice@example.org")
    enable(cctx, caller, username="alice")
    give_volume(client, caller)
    cctx.config = cctx.config.with_values(NO_INSTANCE_LIMITS)
    return caller


@pytest.fixture
def flavor(cctx, catalog):
    return images.add_flavor(cctx, name="gig", memory=1024, disk=10, vcpu=1)


def boot(client, caller, catalog, flavor):
    return client.simulate_post(BASE, headers=caller.headers,
                                json={"server-image": catalog["public"]["id"], "server-flavor": flavor["id"]})


def host_of(cctx, instance_id) -> str:
    return cctx.store.list_instances(visible_to=None, instance_id=instance_id)[0]["host"]


def on_hosts(fakes) -> dict[str, set[str]]:
    return {name: set(fake.instances) for name, fake in fakes.items()}


def assert_nothing_over_committed(cctx):
    for h in host_records.list_hosts(cctx):
        assert h["allocated_memory_mb"] <= h["memory_mb"] and h["allocated_vcpus"] <= h["vcpus"], h


# -- placement -------------------------------------------------------------------------------
def test_the_config_host_is_a_host_without_host_add(cctx, adapters):
    [only] = host_records.list_hosts(cctx)
    assert only == {"name": "default", "uri": "test:///default", "enabled": True, "reachable": True,
                    "vcpus": 64, "memory_mb": 262144, "allocated_vcpus": 0, "allocated_memory_mb": 0,
                    "instances": 0}


def test_placement_weighs_free_memory_and_records_the_host(client, cctx, cluster, alice, catalog, flavor):
    placed = [host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) for _ in range(6)]
    # Free MB a/b/default: 8192/6144/4096 -> a; 7168 -> a; 6144 ties b: by name, a; then b 6144;
    # 5120 ties: a; b 5120.
    assert placed == ["node-a", "node-a", "node-a", "node-b", "node-a", "node-b"]
    assert {n: len(i) for n, i in on_hosts(cluster).items()} == {"default": 0, "node-a": 4, "node-b": 2}
    for row in cctx.store.all_instances():
        assert row["id"] in cluster[row["host"]].instances  # every later call goes to that host
    listed = {h["name"]: h for h in host_records.list_hosts(cctx)}
    assert listed["node-a"]["allocated_memory_mb"] == 4096 and listed["node-a"]["instances"] == 4


def test_no_host_with_room_is_409_and_makes_nothing(client, cctx, cluster, alice, catalog, flavor):
    for _ in range(18):  # 4 + 8 + 6 GiB
        ok(boot(client, alice, catalog, flavor))
    msg = refused(boot(client, alice, catalog, flavor), 409)
    assert msg.startswith("no hypervisor host has room for this flavor (gig: 1 vCPU, 1024 MB; 3 hosts short of memory")
    assert len(cctx.store.all_instances()) == 18
    assert sum(len(i) for i in on_hosts(cluster).values()) == 18
    assert_nothing_over_committed(cctx)


def test_a_disabled_host_takes_no_new_instance_and_keeps_its_own(client, cctx, cluster, alice, catalog, flavor):
    first = ok(boot(client, alice, catalog, flavor))[0]
    assert host_of(cctx, first["id"]) == "node-a"
    disabled = host_records.set_enabled(cctx, "node-a", False)
    assert disabled["enabled"] is False and disabled["instances"] == 1
    placed = {host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) for _ in range(4)}
    assert "node-a" not in placed
    assert ok(client.simulate_get(f"{BASE}/{first['id']}", headers=alice.headers), 200)[0]["status"] == "running"
    host_records.set_enabled(cctx, "default", False)
    host_records.set_enabled(cctx, "node-b", False)
    msg = refused(boot(client, alice, catalog, flavor), 409)
    assert "disabled: default, node-a, node-b" in msg
    assert host_records.set_enabled(cctx, "node-a", True)["enabled"] is True
    assert host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) == "node-a"


def test_remove_is_refused_while_a_host_holds_instances(client, cctx, cluster, alice, catalog, flavor):
    inst = ok(boot(client, alice, catalog, flavor))[0]
    with pytest.raises(Conflict, match="holds 1 instance"):
        host_records.remove_host(cctx, "node-a")
    assert cctx.store.get_host("node-a") is not None
    with pytest.raises(Conflict, match="disable it instead"):
        host_records.remove_host(cctx, "default")
    ok(client.simulate_delete(f"{BASE}/{inst['id']}", headers=alice.headers), 200)
    removed = host_records.remove_host(cctx, "node-a")
    assert removed["name"] == "node-a" and cctx.store.get_host("node-a") is None
    with pytest.raises(NotFound):
        host_records.remove_host(cctx, "node-a")


@pytest.mark.parametrize("name", ["", "Node", "-a", "a b", "a/b", "x" * 64, "a;b"])
def test_host_names_are_checked(cctx, adapters, name):
    with pytest.raises(Exception, match="invalid host name"):
        host_records.add_host(cctx, name=name, uri="fake://x")
    assert [h["name"] for h in host_records.list_hosts(cctx)] == ["default"]


def test_an_unreachable_uri_is_refused_by_host_add(cctx, adapters):
    adapters.fake_hosts.add("node-c")
    adapters.fake_hosts.kill("node-c")
    with pytest.raises(HostUnavailable, match="host node-c not added: cannot connect"):
        host_records.add_host(cctx, name="node-c", uri="fake://node-c")
    assert cctx.store.get_host("node-c") is None
    with pytest.raises(Conflict, match="exists"):
        host_records.add_host(cctx, name="default", uri="fake://default")


def test_32_concurrent_creates_never_over_commit_a_host(client, cctx, cluster, alice, catalog, flavor):
    results = together(32, lambda i: boot(client, alice, catalog, flavor))
    statuses = sorted(r.status_code for r in results)
    assert statuses == [201] * 18 + [409] * 14, [r.json for r in results]
    by_host = {n: len(i) for n, i in on_hosts(cluster).items()}
    assert by_host == {"default": 4, "node-a": 8, "node-b": 6}
    assert {r["host"] for r in cctx.store.all_instances()} == set(by_host)
    assert_nothing_over_committed(cctx)


# -- a dead host -------------------------------------------------------------------------------
def test_a_dead_host_makes_only_its_instances_error_and_503(client, cctx, adapters, cluster, alice, catalog, flavor):
    made = [ok(boot(client, alice, catalog, flavor))[0] for _ in range(4)]  # node-a three times, node-b
    on_a = [m for m in made if host_of(cctx, m["id"]) == "node-a"]
    [on_b] = [m for m in made if host_of(cctx, m["id"]) == "node-b"]
    adapters.fake_hosts.kill("node-a")
    dead = cluster["node-a"]

    listed = {i["id"]: i["status"] for i in ok(client.simulate_get(BASE, headers=alice.headers), 200)}
    assert {listed[m["id"]] for m in on_a} == {"error"} and listed[on_b["id"]] == "running"
    # Nothing that would lose the real state is written.
    assert {r["status"] for r in cctx.store.all_instances()} == {"running"}
    calls = dead.calls.total()
    got = ok(client.simulate_get(f"{BASE}/{on_a[0]['id']}", headers=alice.headers), 200)[0]
    assert got["status"] == "error" and got["private-ip"] == on_a[0]["private-ip"]
    bob = make_caller(cctx, "bob@example.org", owner=alice)
    bob_uuid = enable(cctx, bob, username="bob")["uuid"]
    for task in ({"what": "power-off"}, {"what": "power-on"}, {"what": "reboot"},
                 {"what": "modify-users", "how": "add", "users": [bob_uuid]}):
        r = client.simulate_put(f"{BASE}/{on_a[0]['id']}", headers=alice.headers, json={"task": task})
        assert "node-a is unreachable" in refused(r, 503)
    assert "unreachable" in refused(client.simulate_delete(f"{BASE}/{on_a[0]['id']}", headers=alice.headers), 503)
    assert len(cctx.store.all_instances()) == 4  # the delete changed nothing
    assert dead.calls.total() == calls  # in its back-off: nobody waited on it again
    # Everything else keeps working: the other host, and creations (never on the dead host).
    ok(client.simulate_put(f"{BASE}/{on_b['id']}", headers=alice.headers, json={"task": {"what": "power-off"}}), 200)
    placed = {host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) for _ in range(3)}
    assert "node-a" not in placed
    listed = {h["name"]: h for h in host_records.list_hosts(cctx)}
    assert listed["node-a"]["reachable"] is False and listed["node-b"]["reachable"] is True
    # Reconcile reports the dead host and goes on with the others.
    drift = reconcile(cctx)
    [item] = [d for d in drift if d["kind"] == "host-unreachable"]
    assert (item["target"], item["host"], item["fixable"]) == ("node-a", "node-a", False)
    assert "fake://node-a does not answer" in item["detail"]
    cluster["node-b"].instances[on_b["id"]].status = "running"  # changed behind the controller's back
    drift = reconcile(cctx, fix=True)
    assert {(d["kind"], d["host"]) for d in drift} >= {("host-unreachable", "node-a"), ("instance-status", "node-b")}
    assert [d for d in drift if d["kind"] == "instance-status"][0]["fixed"] is True


def test_a_dead_host_is_tried_again_after_its_back_off(client, cctx, adapters, cluster, alice, catalog, flavor):
    clock = [1000.0]
    adapters.hosts._health.clock = lambda: clock[0]
    inst = ok(boot(client, alice, catalog, flavor))[0]
    adapters.fake_hosts.kill("node-a")
    assert ok(client.simulate_get(f"{BASE}/{inst['id']}", headers=alice.headers), 200)[0]["status"] == "error"
    adapters.fake_hosts.revive("node-a")
    clock[0] += 29
    assert ok(client.simulate_get(f"{BASE}/{inst['id']}", headers=alice.headers), 200)[0]["status"] == "error"
    clock[0] += 2  # [hosts] retry_seconds = 30 have passed
    assert ok(client.simulate_get(f"{BASE}/{inst['id']}", headers=alice.headers), 200)[0]["status"] == "running"


def test_the_health_refresher_takes_a_host_that_answers_again_out_of_its_back_off(
        client, cctx, adapters, cluster, alice, catalog, flavor):
    """A host back before its back-off ends takes creates at the next health round, not after
    [hosts] retry_seconds (faults (a): creates 503 for up to 30 s after libvirtd came back)."""
    from controller.monitoring.health import monitor_for

    clock = [1000.0]
    adapters.hosts._health.clock = lambda: clock[0]
    for name in ("default", "node-a", "node-b"):
        adapters.fake_hosts.kill(name)
        adapters.hosts.mark_unreachable(name, "down")
    assert refused(boot(client, alice, catalog, flavor), 503).startswith("no hypervisor host is reachable")
    monitor = monitor_for(cctx)
    monitor.stop()  # no refresher thread: the test runs the rounds
    monitor.refresh_now()
    assert {n for n in ("default", "node-a", "node-b") if not adapters.hosts.reachable(n)} == {
        "default", "node-a", "node-b"}  # still dead: still in their back-off
    adapters.fake_hosts.revive("default")
    monitor.refresh_now()  # clock unmoved: well inside retry_seconds
    assert adapters.hosts.reachable("default") and not adapters.hosts.reachable("node-a")
    assert host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) == "default"


def test_every_host_dead_is_503_not_409(client, cctx, adapters, cluster, alice, catalog, flavor):
    for name in ("default", "node-a", "node-b"):
        adapters.fake_hosts.kill(name)
        adapters.hosts.mark_unreachable(name, "down")
    msg = refused(boot(client, alice, catalog, flavor), 503)
    assert msg.startswith("no hypervisor host is reachable for this flavor")
    assert cctx.store.all_instances() == []


# -- issue 16, finding 5: a host that died after `host add` ----------------------------------------
def nothing_on(fake, base_images=()) -> None:
    assert (fake.instances, fake.disks, fake.seeds) == ({}, {}, {})
    assert set(fake.base_images) == set(base_images)
    assert all(not reservations for reservations in fake.networks.values())


@pytest.mark.parametrize("dead_host", ["node-a", "default"])
def test_a_create_on_a_host_that_died_is_placed_again_on_the_next_host(client, cctx, adapters, cluster, alice,
                                                                       catalog, flavor, dead_host):
    """node-a dies in its image copy (another host), default in its spawn (the config's host)."""
    clock = [1000.0]
    adapters.hosts._health.clock = lambda: clock[0]
    if dead_host == "default":
        adapters.hypervisor.capacity = HostCapacity(vcpus=16, memory_mb=16384)  # the most free memory
    host_records.list_hosts(cctx)  # every host answers and its capacity is recorded, as at `host add`
    for name in ("node-a", "node-b"):  # the image is on every host (the config's own may die)
        image_copy.ensure_image_on_host(cctx, cctx.store.get_image(catalog["public"]["id"]), name)
    adapters.fake_hosts.kill(dead_host)
    dead = cluster[dead_host]
    inst = ok(boot(client, alice, catalog, flavor))[0]
    assert host_of(cctx, inst["id"]) == ("node-b" if dead_host == "node-a" else "node-a")
    assert inst["status"] == "running" and inst["id"] in cluster[host_of(cctx, inst["id"])].instances
    had = set(dead.base_images)  # the image it got before it died
    nothing_on(dead, had)
    assert [r["host"] for r in cctx.store.all_instances()] == [host_of(cctx, inst["id"])]
    assert {h["name"]: h["instances"] for h in host_records.list_hosts(cctx)}[dead_host] == 0
    # In its back-off the dead host is not tried again; after it, once, and the create still lands.
    calls = dead.calls.total()
    ok(boot(client, alice, catalog, flavor))
    assert dead.calls.total() == calls
    clock[0] += 31  # [hosts] retry_seconds
    ok(boot(client, alice, catalog, flavor))
    assert dead.calls.total() > calls
    nothing_on(dead, had)
    assert len(cctx.store.all_instances()) == 3 and dead_host not in {r["host"] for r in cctx.store.all_instances()}


def test_a_dead_host_with_the_only_room_is_503_and_leaves_nothing(client, cctx, adapters, cluster, alice, catalog):
    big = images.add_flavor(cctx, name="big", memory=7168, disk=10, vcpu=1)  # fits node-a only
    adapters.fake_hosts.kill("node-a")
    msg = refused(boot(client, alice, catalog, big), 503)
    assert msg.startswith("no live hypervisor host has room for this flavor (big: 1 vCPU, 7168 MB)"), msg
    assert "node-a: cannot connect" in msg
    nothing_on(cluster["node-a"])
    assert cctx.store.all_instances() == []


def test_the_number_of_placements_is_bounded(client, cctx, adapters, cluster, alice, catalog, flavor):
    cctx.config = cctx.config.with_values({"hosts": {"max_create_attempts": "2"}})
    adapters.fake_hosts.kill("node-a")
    adapters.fake_hosts.kill("node-b")
    msg = refused(boot(client, alice, catalog, flavor), 503)
    assert "2 hypervisor host(s) it was placed on did not answer" in msg and "node-a" in msg and "node-b" in msg
    assert cluster["default"].calls["spawn"] == 0  # a third placement was not tried
    assert cctx.store.all_instances() == []
    for name in ("node-a", "node-b"):
        nothing_on(cluster[name])
    cctx.config = cctx.config.with_values({"hosts": {"max_create_attempts": "3"}})
    adapters.fake_hosts.revive("node-a")  # still in its back-off: not tried
    assert host_of(cctx, ok(boot(client, alice, catalog, flavor))[0]["id"]) == "default"


def test_a_slow_host_delays_only_the_lists_holding_its_rows(client, cctx, adapters, cluster, alice, catalog,
                                                            flavor):
    on_a = ok(boot(client, alice, catalog, flavor))[0]
    host_records.set_enabled(cctx, "node-a", False)
    bob = make_caller(cctx, "bob@example.org")
    enable(cctx, bob, username="bob")
    give_volume(client, bob)
    on_b = ok(boot(client, bob, catalog, flavor))[0]
    assert (host_of(cctx, on_a["id"]), host_of(cctx, on_b["id"])) == ("node-a", "node-b")
    slow = cluster["node-a"]
    gate = threading.Event()
    slow.slow_on["statuses"] = gate  # node-a answers, but only when the gate opens
    entered = slow.calls["statuses"]
    stuck = {}
    reader = threading.Thread(target=lambda: stuck.update(r=client.simulate_get(BASE, headers=alice.headers)))
    reader.start()
    try:
        for _ in range(500):
            if slow.calls["statuses"] > entered:
                break
            threading.Event().wait(0.01)
        assert slow.calls["statuses"] > entered  # alice's list is waiting on node-a
        answers = {}

        def list_as(name, caller):
            answers[name] = client.simulate_get(BASE, headers=caller.headers)

        others = [threading.Thread(target=list_as, args=("bob", bob)),  # rows on node-b only
                  threading.Thread(target=list_as, args=("alice", alice))]  # node-a is being read
        for t in others:
            t.start()
        for t in others:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in others), "a list waited on another list's read of a slow host"
        assert [i["id"] for i in ok(answers["bob"], 200)] == [on_b["id"]]
        # node-a's rows answer the status last stored, unwritten, while node-a is read.
        assert [(i["id"], i["status"]) for i in ok(answers["alice"], 200)] == [(on_a["id"], "running")]
        assert reader.is_alive()
    finally:
        gate.set()
        reader.join(timeout=10)
    assert [i["id"] for i in ok(stuck["r"], 200)] == [on_a["id"]]


# -- images on every host --------------------------------------------------------------------------
def qcow2_file(path: Path, size: int = 300_000) -> str:
    from tests.hypervisor.test_hypervisor import qcow2_header

    path.write_bytes(qcow2_header(virtual_size=1 << 30) + os.urandom(size))
    return str(path)


def test_an_image_reaches_a_host_on_first_use_there(client, cctx, adapters, cluster, alice, flavor, tmp_path):
    image = images.add_image(cctx, name="Real", os_name="debian", os_major="12", os_minor="7", min_disk=2,
                             min_ram=512, source=qcow2_file(tmp_path / "real.qcow2"))
    volume = cctx.store.get_image(image["id"])["base_volume"]
    assert set(cluster["node-a"].base_images) == set()
    r = client.simulate_post(BASE, headers=alice.headers, json={"server-image": image["id"],
                                                                "server-flavor": flavor["id"]})
    inst = ok(r)[0]
    assert host_of(cctx, inst["id"]) == "node-a"
    assert cluster["node-a"].base_content[volume] == cluster["default"].base_content[volume]
    assert cluster["node-a"].calls["read_base_image"] == 0 and cluster["default"].calls["read_base_image"] == 1
    ok(client.simulate_post(BASE, headers=alice.headers, json={"server-image": image["id"],
                                                               "server-flavor": flavor["id"]}))
    assert cluster["default"].calls["read_base_image"] == 1  # once per host
    assert not [p for p in os.listdir(os.path.dirname(cctx.store.path)) if p.startswith(".image-")]


def test_an_upload_failing_mid_stream_leaves_no_volume_and_no_instance(client, cctx, adapters, cluster, alice,
                                                                        flavor, tmp_path):
    from controller.errors import HostError

    image = images.add_image(cctx, name="Real", os_name="debian", os_major="12", os_minor="7", min_disk=2,
                             min_ram=512, source=qcow2_file(tmp_path / "real.qcow2"))
    target = cluster["node-a"]
    sent = []
    real_step = target._step

    def step(name):
        if name == "upload":
            sent.append(1)
            if len(sent) == 3:  # the third chunk of five
                raise HostError("connection reset during upload")
        real_step(name)

    target._step = step
    r = client.simulate_post(BASE, headers=alice.headers, json={"server-image": image["id"],
                                                               "server-flavor": flavor["id"]})
    assert "connection reset during upload" in refused(r, 503)
    assert target.base_images == {} and target.base_content == {} and target.instances == {}
    assert cctx.store.all_instances() == []
    assert not [p for p in os.listdir(os.path.dirname(cctx.store.path)) if p.startswith(".image-")]


# -- issue 16, finding 13: a base image is used only once complete --------------------------------
def wait_until(predicate, what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"never happened: {what}")


def test_concurrent_creates_of_a_new_image_on_a_host_wait_for_one_complete_upload(client, cctx, adapters, cluster,
                                                                                  alice, flavor, tmp_path):
    image = images.add_image(cctx, name="Real", os_name="debian", os_major="12", os_minor="7", min_disk=2,
                             min_ram=512, source=qcow2_file(tmp_path / "real.qcow2"))
    volume = cctx.store.get_image(image["id"])["base_volume"]
    target, source = cluster["node-a"], cluster["default"]
    gate = threading.Event()
    target.slow_on["upload"] = gate  # the copy to node-a stops half way until the gate opens
    body = {"server-image": image["id"], "server-flavor": flavor["id"]}
    answers = []
    creates = [threading.Thread(target=lambda: answers.append(client.simulate_post(BASE, headers=alice.headers,
                                                                                   json=body)))
               for _ in range(2)]
    try:
        for t in creates:
            t.start()
        wait_until(lambda: target.calls["upload"] >= 1, "the upload to node-a began")
        threading.Event().wait(0.2)  # the other create has had time to look
        # Mid-upload the image is on node-a only under a temporary name: no create uses it.
        assert volume not in target.base_images
        assert [n for n in target.base_images if n.startswith("cc-part-")] != []
        assert target.list_base_images() == [] and target.instances == {}
        assert all(t.is_alive() for t in creates)  # the second waits for the first's copy
    finally:
        gate.set()
        for t in creates:
            t.join(timeout=30)
    assert sorted(r.status_code for r in answers) == [201, 201], [r.json for r in answers]
    assert {host_of(cctx, r.json["data"][0]["id"]) for r in answers} == {"node-a"}
    assert source.calls["read_base_image"] == 1  # one copy, not one per create
    assert target.base_content[volume] == source.base_content[volume]
    assert set(target.base_images) == {volume}  # no temporary volume is left


def test_reconcile_finds_and_removes_partial_base_volumes_on_every_host(client, cctx, adapters, cluster, alice,
                                                                       flavor, tmp_path):
    from host_adapters.names import Names

    image = images.add_image(cctx, name="Real", os_name="debian", os_major="12", os_minor="7", min_disk=2,
                             min_ram=512, source=qcow2_file(tmp_path / "real.qcow2"))
    volume = cctx.store.get_image(image["id"])["base_volume"]
    names = Names("cc-")
    # What a crash mid-upload leaves: a truncated temporary volume, on another host and on the config's.
    left = {"node-a": names.partial_base(image["id"], "0badc0de"),
            "default": names.partial_base(image["id"], "0ddba11a")}
    for host, name in left.items():
        cluster[host].base_images[name] = 2
        cluster[host].base_content[name] = cluster["default"].base_content[volume][:1000]
    # Never taken for the image: the next create on node-a copies it whole.
    inst = ok(client.simulate_post(BASE, headers=alice.headers, json={"server-image": image["id"],
                                                                     "server-flavor": flavor["id"]}))[0]
    assert host_of(cctx, inst["id"]) == "node-a"
    assert cluster["node-a"].instances[inst["id"]].base_image == volume
    assert cluster["node-a"].base_content[volume] == cluster["default"].base_content[volume]
    partial = [d for d in reconcile(cctx) if d["kind"] == "base-image-partial"]
    assert sorted((d["host"], d["target"], d["fixable"], d["fixed"]) for d in partial) == [
        ("default", left["default"], True, False), ("node-a", left["node-a"], True, False)]
    fixed = [d for d in reconcile(cctx, fix=True) if d["kind"] == "base-image-partial"]
    assert len(fixed) == 2 and all(d["fixed"] for d in fixed)
    assert set(cluster["node-a"].base_images) == {volume} and set(cluster["default"].base_images) >= {volume}
    assert not [n for n in cluster["default"].base_images if n.startswith("cc-part-")]
    assert [d for d in reconcile(cctx) if d["kind"] == "base-image-partial"] == []
    with pytest.raises(Exception, match="not a temporary base image volume"):
        cluster["node-a"].delete_partial_base_image(volume)  # a published base is never removed this way


# -- addresses on a bridged network -------------------------------------------------------------------
def test_a_bridged_host_gets_static_addresses_and_no_dhcp_reservations(client, cctx, adapters, alice, catalog,
                                                                        flavor):
    adapters.hypervisor.capacity = HostCapacity(vcpus=1, memory_mb=512)  # the default host is full
    capacity(cctx)
    bridged = adapters.fake_hosts.add("node-br", network="cc-bridge", dhcp=False)
    bridged.networks = {"cc-bridge": {}}
    host_records.add_host(cctx, name="node-br", uri="fake://node-br", network="cc-bridge")
    inst = ok(boot(client, alice, catalog, flavor))[0]
    assert host_of(cctx, inst["id"]) == "node-br"
    guest = bridged.instances[inst["id"]].guest
    assert [(n.network, n.address) for n in guest.nics] == [("cc-bridge", inst["private-ip"])]
    assert bridged.networks["cc-bridge"] == {}
    network_config = json.loads(bridged.seeds[inst["id"]]["network-config"])
    assert inst["private-ip"] in json.dumps(network_config)
    assert [d for d in reconcile(cctx) if d["host"] == "node-br"] == []


# -- several libvirt test-driver hosts ---------------------------------------------------------------------
def node_file(tmp_path: Path, name: str, *, cpus: int, memory_mb: int) -> str:
    """A libvirt test-driver node of its own: its CPUs, memory, storage pool and network. Its
    pool keeps one UUID, as a real host's does (each process reads the node anew)."""
    path = tmp_path / f"{name}.xml"
    path.write_text(f"""<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><nodes>1</nodes><sockets>1</sockets>
       <cores>{cpus}</cores><threads>1</threads><active>{cpus}</active></cpu>
  <memory>{memory_mb * 1024}</memory>
  <network><name>cc-private</name><bridge name='virbr-{name}'/><forward mode='nat'/>
    <ip address='10.213.0.1' netmask='255.255.0.0'><dhcp/></ip></network>
  <pool type='dir'><name>pool-{name}</name><uuid>{uuid.uuid5(uuid.NAMESPACE_URL, str(path))}</uuid>
    <target><path>/pool-{name}</path></target></pool>
</node>""")
    return f"test://{path}"


@pytest.fixture
def libvirt_cluster(tmp_path):
    """The controller on the test driver's own host ("default") and two test-driver nodes."""
    from host_adapters.factory import Adapters, build_hosts, build_hypervisor, fake_adapters

    values = config_values_for(tmp_path)
    values["capacity"] = {"cpu_allocation_ratio": "1.0", "ram_allocation_ratio": "1.0",
                          "reserved_host_memory_mb": "0"}
    config = config_from_dict(values)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    # Real libvirt (test driver) hosts; homes, groups and the directory are fakes here.
    fakes = fake_adapters()
    hypervisor = build_hypervisor(config)
    adapters = Adapters(hypervisor=hypervisor, homes=fakes.homes, groups=fakes.groups, directory=fakes.directory,
                        hypervisor_in_process=True, hosts=build_hosts(config, hypervisor))
    ctx = build_context(config, store=store, adapters=adapters)
    host_records.set_enabled(ctx, "default", False)  # 16 CPUs, 3 GiB: not part of this cluster
    uris = {"node-1": node_file(tmp_path, "node-1", cpus=4, memory_mb=4096),
            "node-2": node_file(tmp_path, "node-2", cpus=2, memory_mb=3072)}
    for name, uri in uris.items():
        host_records.add_host(ctx, name=name, uri=uri, storage_pool=f"pool-{name}", network="cc-private")
    yield ctx, uris
    store.close()


def test_test_driver_hosts_have_their_own_capacity_and_take_instances(libvirt_cluster, tmp_path):
    ctx, uris = libvirt_cluster
    listed = {h["name"]: h for h in host_records.list_hosts(ctx)}
    assert (listed["node-1"]["vcpus"], listed["node-1"]["memory_mb"]) == (4, 4096)
    assert (listed["node-2"]["vcpus"], listed["node-2"]["memory_mb"]) == (2, 3072)
    client, alice, body = ready_to_create(ctx, memory=1024, disk=2, min_ram=256)
    ctx.config = ctx.config.with_values(NO_INSTANCE_LIMITS)
    made = []
    while True:
        r = client.simulate_post(BASE, headers=alice.headers, json=body)
        if r.status_code != 201:
            break
        made.append(r.json["data"][0])
    assert "no hypervisor host has room" in refused(r, 409)
    by_host = {}
    for inst in made:
        by_host.setdefault(host_of(ctx, inst["id"]), []).append(inst["id"])
    # node-1: 4 CPUs, 4 GiB -> 4; node-2: 2 CPUs -> 2 (short of vCPUs before memory).
    assert {n: len(i) for n, i in by_host.items()} == {"node-1": 4, "node-2": 2}
    for name, ids in by_host.items():
        hv = host_routing.hypervisor_of_host(ctx, name)
        assert hv.list_instances() == sorted(ids)  # the domains are on that host, not elsewhere
        # Statuses are kept by libvirt's lifecycle events, which a loaded machine delivers
        # late: an event from before a create (DEFINED) may land after the create's own
        # update. They settle within a bounded wait.
        deadline = time.monotonic() + 10
        while hv.statuses() != {i: "running" for i in ids} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hv.statuses() == {i: "running" for i in ids}
        assert hv.list_base_images() == [body["server-image"]]  # reached it on first use
    # test:///default is one state per process, shared with every other test that used it:
    # what matters is that the disabled default host took none of these instances.
    assert not set(ctx.adapters.hypervisor.list_instances()) & {inst["id"] for inst in made}
    for inst in made:
        ok(client.simulate_delete(f"{BASE}/{inst['id']}", headers=alice.headers), 200)
    assert all(host_routing.hypervisor_of_host(ctx, n).list_instances() == [] for n in by_host)


def test_a_test_driver_host_that_stops_answering(libvirt_cluster, tmp_path, monkeypatch):
    from controller.errors import HostUnreachable

    ctx, uris = libvirt_cluster
    client, alice, body = ready_to_create(ctx, memory=1024, disk=2, min_ram=256)
    first = ok(client.simulate_post(BASE, headers=alice.headers, json=body))[0]
    assert host_of(ctx, first["id"]) == "node-1"
    hv = host_routing.hypervisor_of_host(ctx, "node-1").inner

    def gone():
        raise HostUnreachable(f"cannot connect to libvirt at {uris['node-1']}: connection refused")

    monkeypatch.setattr(hv, "_connection", gone)
    # The create set up the event-kept statuses; a host that goes away closes their connection
    # (libvirt's close callback), which a test driver in this process never does by itself.
    assert hv._live is not None
    hv._live.closed = True
    assert ok(client.simulate_get(f"{BASE}/{first['id']}", headers=alice.headers), 200)[0]["status"] == "error"
    r = client.simulate_put(f"{BASE}/{first['id']}", headers=alice.headers, json={"task": {"what": "reboot"}})
    assert refused(r, 503)
    second = ok(client.simulate_post(BASE, headers=alice.headers, json=body))[0]
    assert host_of(ctx, second["id"]) == "node-2"
    drift = reconcile(ctx)
    assert [(d["kind"], d["target"]) for d in drift if d["host"] == "node-1"] == [("host-unreachable", "node-1")]
    assert [d for d in drift if d["host"] == "node-2"] == []


# -- the agent -----------------------------------------------------------------------------------------------------
HOST_FIELDS = {"name", "uri", "enabled", "reachable", "vcpus", "memory_mb", "allocated_vcpus",
               "allocated_memory_mb", "instances"}


def test_agent_host_commands_print_the_contracts_shapes(tmp_path):
    config = str(tmp_path / "controller.ini")
    assert agent_call(config, "init", "--sandbox", str(tmp_path / "state"))[0] == 0
    rc, doc = agent_call(config, "host", "list")
    assert rc == 0 and set(doc) == {"hosts"} and [h["name"] for h in doc["hosts"]] == ["default"]
    assert set(doc["hosts"][0]) == HOST_FIELDS and doc["hosts"][0]["reachable"] is True
    uri = node_file(tmp_path, "node-9", cpus=8, memory_mb=16384)
    rc, added = agent_call(config, "host", "add", "node-9", "--uri", uri, "--storage-pool", "pool-node-9",
                            "--network", "cc-private")
    assert rc == 0 and added == {"name": "node-9", "uri": uri, "enabled": True, "reachable": True, "vcpus": 8,
                                 "memory_mb": 16384, "allocated_vcpus": 0, "allocated_memory_mb": 0, "instances": 0}
    rc, doc = agent_call(config, "host", "disable", "node-9")
    assert rc == 0 and set(doc) == HOST_FIELDS and doc["enabled"] is False
    rc, doc = agent_call(config, "host", "enable", "node-9")
    assert rc == 0 and doc["enabled"] is True
    rc, doc = agent_call(config, "host", "add", "node-x", "--uri", "qemu+tcp://127.0.0.1:1/system", "--insecure")
    assert rc == 1 and "host node-x not added: cannot connect to libvirt" in doc["error"]
    rc, doc = agent_call(config, "host", "remove", "default")
    assert rc == 1 and "disable it instead" in doc["error"]
    rc, doc = agent_call(config, "host", "list")
    assert [h["name"] for h in doc["hosts"]] == ["default", "node-9"]
    rc, doc = agent_call(config, "host", "remove", "node-9")
    assert rc == 0 and doc["name"] == "node-9"
    # A host holding an instance: refused, exit 1, nothing changed.
    db = sqlite3_rows(tmp_path / "state" / "controller.db")
    db.execute("INSERT INTO hosts (name, uri, storage_pool, network, created_at_utc, updated_at_utc) "
               "VALUES ('busy', 'test:///default', 'p', 'n', 'x', 'x')")
    db.execute("INSERT INTO users (id, email, password_hash, api_key, created_at_utc) VALUES ('u', 'u@x', 'h', 'k', 'x')")
    db.execute("INSERT INTO images (id, name, os_name, os_major, os_minor, min_disk, min_ram, base_volume, "
               "creation_date) VALUES ('i', 'i', 'd', '1', '2', 1, 1, 'b', 'x')")
    db.execute("INSERT INTO flavors (name, memory, disk, vcpu) VALUES ('f', 1, 1, 1)")
    db.execute("INSERT INTO instances (id, owner_id, image_id, flavor_id, status, creation_date, host) "
               "VALUES ('v', 'u', 'i', 1, 'running', 'x', 'busy')")
    db.commit()
    rc, doc = agent_call(config, "host", "remove", "busy")
    assert rc == 1 and "holds 1 instance" in doc["error"]
    assert db.execute("SELECT COUNT(*) FROM hosts WHERE name = 'busy'").fetchone()[0] == 1


def sqlite3_rows(path):
    import sqlite3

    return sqlite3.connect(path)


def test_host_commands_have_help_with_examples():
    from click.testing import CliRunner

    from agent.cli import cli

    for command in ("add", "list", "enable", "disable", "remove", "evacuate"):
        result = CliRunner().invoke(cli, ["host", command, "--help"])
        assert result.exit_code == 0 and "Example" in result.output, (command, result.output)


def test_check_reports_every_other_host_and_what_it_cannot_see(cctx, adapters, cluster):
    from controller.monitoring.health import run_checks

    adapters.fake_hosts.kill("node-b")
    checks = {c["name"]: c for c in run_checks(cctx, thorough=True)}
    assert checks["host node-a"]["ok"] is True
    assert "fake://node-a: reachable" in checks["host node-a"]["detail"]
    assert f"{cctx.config.volumes.home_root} not checked there" in checks["host node-a"]["detail"]
    assert checks["host node-b"]["ok"] is False and "cannot connect" in checks["host node-b"]["detail"]
    assert "host default" not in checks and checks["libvirt"]["ok"] is True  # the config's own host


def test_a_host_that_never_answers_costs_one_bounded_connect(tmp_path):
    """A peer that accepts the TCP connection and then says nothing (a hung node): the
    connection attempt gives up after connect_timeout, and the host is then in its back-off."""
    import socket
    import time

    from controller.errors import HostUnreachable
    from host_adapters.host_pool import HostPool, HostSpec
    from host_adapters.libvirt.driver import LibvirtHypervisor

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # never accepted, never answered
    uri = f"qemu+tcp://127.0.0.1:{silent.getsockname()[1]}/system"
    try:
        pool = HostPool(lambda spec: LibvirtHypervisor(spec.uri, storage_pool="p", connect_timeout=0.5),
                        retry_seconds=60)
        hv = pool.hypervisor(HostSpec(name="hung", uri=uri, storage_pool="p", network="n"))
        began = time.monotonic()
        with pytest.raises(HostUnreachable, match="no answer within 0.5 s"):
            hv.host_capacity()
        assert time.monotonic() - began < 5
        assert pool.reachable("hung") is False
        began = time.monotonic()
        with pytest.raises(HostUnreachable, match="hung is unreachable"):
            hv.statuses()
        assert time.monotonic() - began < 0.1  # in its back-off: no second wait
    finally:
        silent.close()


def test_a_call_that_began_before_the_host_answered_again_does_not_put_it_back_in_its_back_off():
    """faults (a): a connect begun while libvirtd was still starting waited out its
    connect_timeout and failed after the daemon answered other calls; it put the host back
    into its back-off, and creates seconds after libvirtd was back were 503."""
    from common.errors import HostUnreachable
    from host_adapters.fake_hypervisor import FakeHypervisor, FakeHosts
    from host_adapters.host_pool import HostPool, HostSpec

    clock = [1000.0]
    fakes = FakeHosts(FakeHypervisor())
    pool = HostPool(fakes.build, retry_seconds=30, clock=lambda: clock[0])
    hv = pool.hypervisor(HostSpec("default", "fake://default", "pool", "cc-private"))
    slow_started = threading.Event()
    finish_slow = threading.Event()
    real_capacity = hv.inner.host_capacity

    def slow_then_fail():
        slow_started.set()
        assert finish_slow.wait(10)
        raise HostUnreachable("cannot connect to libvirt: no answer within 5 s")

    hv.inner.host_capacity = slow_then_fail
    failed = []
    t = threading.Thread(target=lambda: failed.append(pytest.raises(HostUnreachable, hv.host_capacity)))
    t.start()
    assert slow_started.wait(10)
    hv.inner.host_capacity = real_capacity
    clock[0] += 5
    hv.host_capacity()  # another call answers: the daemon is back
    clock[0] += 1
    finish_slow.set()  # the stale connect fails only now
    t.join(10)
    assert failed and pool.reachable("default")  # its failure predates the answer: no back-off
    # A call that begins after the last answer and fails still starts the back-off.
    hv.inner.host_capacity = lambda: (_ for _ in ()).throw(HostUnreachable("gone"))
    with pytest.raises(HostUnreachable):
        hv.host_capacity()
    assert not pool.reachable("default")


def test_a_connect_begun_while_libvirtd_restarts_is_joined_by_another_that_answers(mocker):
    """faults (a): an open begun while libvirtd was starting again waited the whole
    connect_timeout in silence, though the daemon answered a moment later; every call to the
    host waited behind it, and the host went back into its back-off. A second attempt after
    a second of silence takes the answer."""
    import libvirt

    from host_adapters.libvirt import connection
    from host_adapters.libvirt.driver import LibvirtHypervisor

    class Conn:
        closed = False

        def setKeepAlive(self, *_):
            pass

        def close(self):
            self.closed = True

    stuck, answered = threading.Event(), Conn()
    late = Conn()
    calls = []

    def open_(uri):
        calls.append(uri)
        if len(calls) == 1:
            stuck.wait(10)  # begun while the daemon restarted: silence
            return late  # ... and it answers only after the other attempt won
        return answered

    mocker.patch.object(libvirt, "open", open_)
    mocker.patch.object(connection, "_start_event_loop", lambda: None)
    hv = LibvirtHypervisor("qemu+tcp://127.0.0.1:1/system", storage_pool="p", connect_timeout=5)
    began = time.monotonic()
    assert hv._connection() is answered
    assert time.monotonic() - began < connection.HEDGE_AFTER_SECONDS + 1.5 and len(calls) == 2
    stuck.set()
    deadline = time.monotonic() + 5
    while not late.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late.closed  # the late answer is closed, not leaked
