"""`cloud-agent host drain NAME` (hosts, README, issue 19): cold moves off a host that answers.

On fake hosts (tests/hosts/test_hosts.py's cluster: default 4 GiB, node-a 8 GiB, node-b
6 GiB): each instance is moved with its identity, its disk's content and its power state,
the host is disabled first, a cluster without room is refused naming what is missing, a
move cut short is finished by a second run or by reconcile (the old disk kept until the
new one is committed), a failed copy is undone. Then the agent's CLI on libvirt's test
driver. The same on two real libvirtds is in test_drain_remote.py; a real guest in
tests/guests/test_guest_e2e.py.
"""

import os
import sqlite3

import pytest

from controller.maintenance import drain
from controller.hosts import host_records
from controller.audit import request_ids
from controller.errors import Conflict, HostError, HostUnavailable
from controller.maintenance.reconcile import reconcile
from tests.fixtures.agent import AGENT, agent_call
from tests.hosts.test_evacuate import IDENTITY, drift_of, full_but_two_on_node_b, rows_by_id, three_on_node_a
from tests.hosts.test_hosts import alice, boot, cluster, flavor, host_of, node_file, ok  # noqa: F401 (fixtures)

BASE = "/v1/server-instance"


def task(client, caller, instance_id, what):
    return client.simulate_put(f"{BASE}/{instance_id}", headers=caller.headers, json={"task": {"what": what}})


def with_disks(cluster, made):
    """Each instance's disk holds something of its own (what a guest wrote)."""
    for i in made:
        cluster["node-a"].disk_content[i] = f"the disk of {i}".encode() * 100
    return {i: cluster["node-a"].disk_content[i] for i in made}


def assert_gone_from(fake, made):
    assert not set(fake.instances) & set(made) and not set(fake.disks) & set(made)
    assert not set(fake.seeds) & set(made) and not set(fake.disk_content) & set(made)


def test_drain_moves_each_instance_with_its_identity_disk_and_power_state(client, cctx, adapters, cluster, alice,
                                                                         catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    ok(task(client, alice, made[1], "power-off"), 200)
    cluster["node-a"].ignores_acpi.add(made[2])  # powered off hard after the wait
    before = rows_by_id(cctx)
    macs = {i: before[i]["mac"] for i in made}
    guests = {i: cluster["node-a"].instances[i].guest for i in made}
    # The host is disabled before the first guest is asked to shut down.
    enabled_at_shutdown = []
    real_shut_down = cluster["node-a"].shut_down

    def watching(instance_id, *, wait_seconds):
        enabled_at_shutdown.append(cctx.store.get_host("node-a")["enabled"])
        assert wait_seconds == cctx.config.hosts.shutdown_wait_seconds
        return real_shut_down(instance_id, wait_seconds=wait_seconds)

    cluster["node-a"].shut_down = watching
    request_ids.bind("drain-run")  # as cloud-agent binds one per command run
    try:
        result = drain.drain(cctx, "node-a")
    finally:
        request_ids.bind(None)
    assert enabled_at_shutdown == [0, 0, 0]
    # Most free memory first, as a create: node-b (6144), node-b (5120), then default and node-b tie: by name.
    assert result == {"host": "node-a", "failed": [],
                      "moved": [{"id": made[0], "to": "node-b"}, {"id": made[1], "to": "node-b"},
                                {"id": made[2], "to": "default"}]}
    after = rows_by_id(cctx)
    assert all(after[i][k] == before[i][k] for i in made for k in IDENTITY)
    for i, to in ((m["id"], m["to"]) for m in result["moved"]):
        assert (after[i]["host"], after[i]["intent"]) == (to, None)
        domain = cluster[to].instances[i]
        assert domain.guest == guests[i]  # hostname, NICs (MAC, addresses), users, shares
        assert cluster[to].disk_content[i] == disks[i]  # the root disk, not a new one
        assert cluster[to].disks[i] == cctx.store.get_image(catalog["public"]["id"])["base_volume"]
        assert macs[i] in cluster[to].networks["cc-private"]  # its DHCP reservation moved with it
        assert macs[i] not in cluster["node-a"].networks["cc-private"]
        expected = "shutoff" if i == made[1] else "running"  # the power state it had
        assert domain.status == expected and after[i]["status"] == expected
        got = ok(client.simulate_get(f"{BASE}/{i}", headers=alice.headers), 200)[0]
        assert got["status"] == expected and got["hostname"] == before[i]["hostname"]
        assert got["private-ip"] == before[i]["private_ip"]
        # Its history says what happened, under the command's request id.
        *_, moved = ok(client.simulate_get(f"{BASE}/{i}/actions", headers=alice.headers), 200)
        assert {k: moved[k] for k in ("action", "requester", "request-id", "result")} == {
            "action": "move", "requester": None, "request-id": "drain-run", "result": "success"}
        assert moved["message"].startswith(f"moved from host node-a to host {to}: a cold move")
    assert_gone_from(cluster["node-a"], made)
    assert cctx.store.list_moves() == [] and cctx.store.get_host("node-a")["enabled"] == 0
    assert cluster["node-b"].calls["spawn"] == 0  # received, not rebuilt
    assert drift_of(cctx) == []
    host_records.set_enabled(cctx, "node-a", True)  # after the maintenance
    assert drift_of(cctx) == []


def test_drain_without_room_says_what_is_missing_and_changes_nothing(client, cctx, adapters, cluster, alice,
                                                                     catalog, flavor):
    full_but_two_on_node_b(client, cctx, alice, catalog, flavor)
    before = rows_by_id(cctx)
    held = {n: set(f.instances) for n, f in cluster.items()}
    with pytest.raises(Conflict) as err:
        drain.drain(cctx, "node-a")
    assert err.value.message == ("host node-a not drained: the other hosts lack room for 6 of its 8 instance(s) "
                                 "(6 vCPUs and 6144 MB missing); nothing was changed")
    assert rows_by_id(cctx) == before and cctx.store.get_host("node-a")["enabled"] == 1
    assert cctx.store.list_moves() == [] and {n: set(f.instances) for n, f in cluster.items()} == held
    assert all(f.instances[i].status == "running" for f in cluster.values() for i in f.instances)
    assert cluster["node-a"].calls["shut_down"] == 0


def test_drain_of_a_host_that_does_not_answer_changes_nothing(client, cctx, adapters, cluster, alice, catalog,
                                                              flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    adapters.fake_hosts.kill("node-a")
    with pytest.raises(HostUnavailable, match="host node-a does not answer .*nothing was changed.*--host-is-down"):
        drain.drain(cctx, "node-a")
    assert {host_of(cctx, i) for i in made} == {"node-a"} and cctx.store.get_host("node-a")["enabled"] == 1
    assert cctx.store.list_moves() == []


class Crash(BaseException):
    """The agent's process dying mid-way."""


@pytest.mark.parametrize("finisher", ["drain-again", "reconcile-fix"])
@pytest.mark.parametrize("when", ["before-commit", "after-commit"])
def test_a_move_cut_short_is_finished_and_never_loses_the_disk(client, cctx, adapters, cluster, alice, catalog,
                                                               flavor, monkeypatch, finisher, when):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    before = rows_by_id(cctx)
    target = cluster["node-b"]
    if when == "before-commit":
        real = target.receive

        def crash(instance_id, **kw):  # the copy is defined on node-b, the row still names node-a
            real(instance_id, **kw)
            raise Crash()

        monkeypatch.setattr(target, "receive", crash)
    else:
        real = cctx.store.commit_move

        def crash(instance_id):  # the row names node-b; node-a's copy is not removed yet
            real(instance_id)
            raise Crash()

        monkeypatch.setattr(cctx.store, "commit_move", crash)
    with pytest.raises(Crash):
        drain.drain(cctx, "node-a")
    monkeypatch.undo()
    [record] = cctx.store.list_moves()
    assert (record["instance_id"], record["from_host"], record["to_host"]) == (made[0], "node-a", "node-b")
    assert host_of(cctx, made[0]) == ("node-a" if when == "before-commit" else "node-b")
    # The old disk is still there, whatever the crash cut.
    assert cluster["node-a"].disk_content[made[0]] == disks[made[0]]
    # Room for it on node-b counts already: it is never given away to another instance.
    listed = {h["name"]: h for h in host_records.list_hosts(cctx)}
    assert listed["node-b"]["allocated_memory_mb"] == 1024
    # Reconcile reports a move to finish, not drift of either host, and keeps the row.
    found = drift_of(cctx)
    assert found == [("instance-move-interrupted", made[0])]
    # A user's power task is refused while it moves (a power-on mid-copy would run the guest).
    assert task(client, alice, made[0], "power-on").status_code == 409
    if finisher == "drain-again":
        result = drain.drain(cctx, "node-a")
        assert result["failed"] == [] and [m["id"] for m in result["moved"]] == made
    else:
        fixed = reconcile(cctx, fix=True)
        assert [(d["kind"], d["fixed"]) for d in fixed] == [("instance-move-interrupted", True)]
        assert [m["id"] for m in drain.drain(cctx, "node-a")["moved"]] == made[1:]
    after = rows_by_id(cctx)
    for i in made:
        assert {k: after[i][k] for k in IDENTITY} == {k: before[i][k] for k in IDENTITY}
        live = [n for n, fake in cluster.items() if i in fake.instances]
        assert live == [after[i]["host"]] and live != ["node-a"]
        assert cluster[live[0]].instances[i].status == "running"
        assert cluster[live[0]].disk_content[i] == disks[i]
    assert_gone_from(cluster["node-a"], made)
    assert cctx.store.list_moves() == [] and drift_of(cctx) == []


def test_a_failed_copy_is_undone_and_the_guest_runs_where_it_was(client, cctx, adapters, cluster, alice, catalog,
                                                                 flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    seen = []
    real = cluster["node-b"].receive

    def user_looks_then_fails(instance_id, **kw):
        # Mid-move the user sees it as it is: shut off, on its old host (power tasks are refused
        # meanwhile: test_a_move_cut_short_...).
        got = ok(client.simulate_get(f"{BASE}/{instance_id}", headers=alice.headers), 200)[0]
        seen.append((got["status"], host_of(cctx, instance_id)))
        real(instance_id, **kw)
        raise HostError("receive instance: cannot define domain: the host refused")

    cluster["node-b"].receive = user_looks_then_fails
    result = drain.drain(cctx, "node-a")
    assert seen == [("shutoff", "node-a")] * 3  # each undone: node-b has room again for the next
    assert result["moved"] == [] and [f["id"] for f in result["failed"]] == made
    assert {f["error"] for f in result["failed"]} == {"receive instance: cannot define domain: the host refused"}
    for i in made:  # the owner reads why it is still where it was
        *_, tried = ok(client.simulate_get(f"{BASE}/{i}/actions", headers=alice.headers), 200)
        assert (tried["action"], tried["result"]) == ("move", "error")
        assert tried["message"] == ("host node-a is drained; not moved: receive instance: cannot define domain: "
                                    "the host refused")
    # Nothing remains on the targets; each guest runs again on node-a with its disk.
    assert not cluster["node-b"].instances and not cluster["node-b"].disks and not cluster["default"].instances
    assert all(cluster["node-a"].instances[i].status == "running" for i in made)
    assert all(cluster["node-a"].disk_content[i] == disks[i] for i in made)
    assert {host_of(cctx, i) for i in made} == {"node-a"} and cctx.store.list_moves() == []
    assert all(r["status"] == "running" for r in rows_by_id(cctx).values())
    assert drift_of(cctx) == []


def test_instances_being_created_or_deleted_are_reported_not_moved(client, cctx, adapters, cluster, alice,
                                                                   catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    assert cctx.store.set_instance_intent(made[2], "deleting", expect=None)
    result = drain.drain(cctx, "node-a")
    assert [m["id"] for m in result["moved"]] == made[:2]
    assert result["failed"] == [{"id": made[2], "error": "it is being deleted; drain again once that has ended"}]
    assert rows_by_id(cctx)[made[2]]["host"] == "node-a" and made[2] in cluster["node-a"].instances


# -- the agent -----------------------------------------------------------------------------------------------------

INSTANCE = "0f8fad5b-d9cb-469f-a165-70867728950e"
IMAGE = "6f1ed002-ab5d-42de-a5f3-4c1d0a1e9a77"


def sandbox_with_a_node(tmp_path, *, domain: bool):
    """A sandbox and a test-driver node holding one recorded instance (its domain in the node
    file when `domain`: each agent process reads that node anew)."""
    config = str(tmp_path / "controller.ini")
    assert agent_call(config, "init", "--sandbox", str(tmp_path / "state"))[0] == 0
    prefix = open(config).read().split("domain_prefix = ")[1].split("\n")[0].strip()
    uri = node_file(tmp_path, "node-9", cpus=8, memory_mb=16384)
    if domain:
        path = uri.removeprefix("test://")
        text = open(path).read().replace("</target></pool>", f"""</target>
    <volume><name>{prefix}disk-{INSTANCE}.qcow2</name><capacity>1073741824</capacity></volume></pool>""")
        text = text.replace("</node>", f"""  <domain type='test'><name>{prefix}{INSTANCE}</name>
    <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>
</node>""")
        open(path, "w").write(text)
    assert agent_call(config, "host", "add", "node-9", "--uri", uri, "--storage-pool", "pool-node-9",
                      "--network", "cc-private")[0] == 0
    db = sqlite3.connect(tmp_path / "state" / "controller.db")
    db.execute("INSERT INTO users (id, email, password_hash, api_key, created_at_utc) "
               "VALUES ('u', 'u@x', 'h', 'k', 'x')")
    db.execute("INSERT INTO images (id, name, os_name, os_major, os_minor, min_disk, min_ram, base_volume, "
               "creation_date) VALUES (?, 'i', 'd', '1', '2', 1, 1, ?, 'x')", (IMAGE, f"{prefix}base-{IMAGE}.qcow2"))
    db.execute("INSERT INTO flavors (name, memory, disk, vcpu) VALUES ('f', 64, 1, 1)")
    fid = db.execute("SELECT id FROM flavors WHERE name = 'f'").fetchone()[0]
    db.execute("INSERT INTO instances (id, owner_id, image_id, flavor_id, status, creation_date, host, hostname, "
               "private_ip, mac) VALUES (?, 'u', ?, ?, 'running', 'x', 'node-9', 'vm-0f8fad5b', '10.213.0.10', "
               "'52:54:00:0f:8f:ad')", (INSTANCE, IMAGE, fid))
    db.commit()
    return config, db


def test_agent_host_drain_moves_and_prints_the_contract_document(tmp_path):
    config, db = sandbox_with_a_node(tmp_path, domain=True)
    rc, doc = agent_call(config, "host", "drain", "node-9")
    assert (rc, doc) == (0, {"host": "node-9", "moved": [{"id": INSTANCE, "to": "default"}], "failed": []})
    assert db.execute("SELECT host FROM instances WHERE id = ?", (INSTANCE,)).fetchone()[0] == "default"
    assert db.execute("SELECT enabled FROM hosts WHERE name = 'node-9'").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM moves").fetchone()[0] == 0
    rc, doc = agent_call(config, "host", "list")
    assert {h["name"]: (h["enabled"], h["instances"]) for h in doc["hosts"]} == \
        {"default": (True, 1), "node-9": (False, 0)}
    # Drained again: nothing to move, exit 0; then enabled after the maintenance.
    assert agent_call(config, "host", "drain", "node-9") == (0, {"host": "node-9", "moved": [], "failed": []})
    assert agent_call(config, "host", "enable", "node-9")[1]["enabled"] is True


def test_agent_host_drain_exits_1_while_the_host_holds_an_instance(tmp_path):
    # Recorded on node-9, but its domain is not there (each agent process reads the node anew).
    config, db = sandbox_with_a_node(tmp_path, domain=False)
    rc, doc = agent_call(config, "host", "drain", "node-9")
    assert set(doc) == {"host", "moved", "failed"} and doc["host"] == "node-9" and doc["moved"] == []
    assert [set(f) for f in doc["failed"]] == [{"id", "error"}] and doc["failed"][0]["id"] == INSTANCE
    assert "has no domain" in doc["failed"][0]["error"] and rc == 1
    assert db.execute("SELECT host FROM instances WHERE id = ?", (INSTANCE,)).fetchone()[0] == "node-9"
    assert db.execute("SELECT COUNT(*) FROM moves").fetchone()[0] == 0  # undone
    assert db.execute("SELECT enabled FROM hosts WHERE name = 'node-9'").fetchone()[0] == 0
    # A host that does not answer: refused, nothing changed.
    db.execute("INSERT INTO hosts (name, uri, storage_pool, network, created_at_utc, updated_at_utc) "
               "VALUES ('gone', 'qemu+tls://127.0.0.1:1/system', 'p', 'cc-private', 'x', 'x')")
    db.commit()
    rc, doc = agent_call(config, "host", "drain", "gone")
    assert rc != 0 and "host gone does not answer" in doc["error"]
    assert db.execute("SELECT enabled FROM hosts WHERE name = 'gone'").fetchone()[0] == 1
    # On a terminal, without --json: progress on stderr, then a line per instance.
    import pexpect

    env = {k: v for k, v in os.environ.items() if k != "CLOUD_CONTROLLER_CONFIG"}
    child = pexpect.spawn(str(AGENT), ["--config", config, "host", "drain", "node-9"], env=env, encoding="utf-8",
                          timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert f"drain: instance 1/1 of host node-9 ({INSTANCE})" in child.before
    assert f"FAILED {INSTANCE}: " in child.before and "host node-9: 0 moved, 1 failed, 1 left" in child.before


def test_a_delete_is_refused_while_the_instance_moves(client, cctx, adapters, cluster, alice, catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    to = cctx.store.begin_move(made[0], "node-a", lambda hosts: "node-b", was_running=True)
    assert to == "node-b"
    r = client.simulate_delete(f"{BASE}/{made[0]}", headers=alice.headers)
    assert r.status_code == 409 and "being moved to another host" in r.json["msg"]
    assert made[0] in cluster["node-a"].instances and host_of(cctx, made[0]) == "node-a"
