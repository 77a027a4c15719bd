"""The host runbooks when moves are cut short (issue 27 items 3, 4 and 9), on fake hosts.

tests/hosts/test_hosts.py's cluster: default 4 GiB, node-a 8 GiB (holding the three
instances), node-b 6 GiB (where the first one is moving). A drain of node-a is cut short
(before or after its commit) and node-b dies; the dead-host runbook (evacuate node-b, then
reconcile --fix) leaves the instance with its own disk, running once, and nothing for
reconcile to find; `host drain --abandon` gives up such a move; `host remove` refuses a
host an unfinished move names. A user deactivated while a disk is copied is not in the
moved guest; a head node whose disk is full fails the move cleanly.
"""

import errno
import threading

import pytest

from controller.maintenance import drain, evacuate
from controller.hosts import host_records
from controller.users import users
from controller.errors import Conflict
from controller.permissions import Requester
from controller.maintenance.reconcile import reconcile
from tests.fixtures.api import enable, make_caller
from tests.hosts.test_drain import BASE, Crash, assert_gone_from, task, with_disks
from tests.hosts.test_evacuate import drift_of, rows_by_id, three_on_node_a
from tests.hosts.test_hosts import alice, boot, cluster, flavor, host_of, ok  # noqa: F401 (fixtures)

ADMIN = Requester(id="admin", roles=frozenset({"superuser"}))


def cut_short(cctx, cluster, monkeypatch, when):
    """A drain of node-a whose process dies while moving the first instance to node-b."""
    if when == "before-commit":
        real = cluster["node-b"].receive

        def crash(instance_id, **kw):  # the copy is defined on node-b, the row still names node-a
            real(instance_id, **kw)
            raise Crash()

        monkeypatch.setattr(cluster["node-b"], "receive", crash)
    else:
        real = cctx.store.commit_move

        def crash(instance_id):  # the row names node-b; node-a's copy is not removed yet
            real(instance_id)
            raise Crash()

        monkeypatch.setattr(cctx.store, "commit_move", crash)
    with pytest.raises(Crash):
        drain.drain(cctx, "node-a")
    monkeypatch.undo()


def running_copies(cluster, instance_id):
    return [n for n, fake in cluster.items() if not fake.dead and instance_id in fake.instances
            and fake.instances[instance_id].status == "running"]


@pytest.mark.parametrize("when", ["before-commit", "after-commit"])
def test_the_dead_host_runbook_after_a_drain_cut_short_keeps_the_instances_own_disk(
        client, cctx, adapters, cluster, alice, catalog, flavor, monkeypatch, when):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    before = rows_by_id(cctx)
    cut_short(cctx, cluster, monkeypatch, when)
    moving = made[0]
    spawns = {n: fake.calls["spawn"] for n, fake in cluster.items()}
    adapters.fake_hosts.kill("node-b")  # the target dies
    # The move names node-b: it cannot be forgotten while the move is not finished.
    named = (f"host node-b is named by the move of instance {moving} from host node-a to host node-b, not finished"
             if when == "before-commit" else "host node-b holds 1 instance")
    with pytest.raises(Conflict, match=named):
        host_records.remove_host(cctx, "node-b")
    # The runbook: evacuate the dead host, then reconcile --fix.
    result = evacuate.evacuate(cctx, "node-b", host_is_down=True)
    assert result == {"host": "node-b", "rebuilt": [], "failed": [], "kept": [{"id": moving, "to": "node-a"}]}
    fixed = reconcile(cctx, fix=True)
    assert [d for d in fixed if d["kind"] != "host-unreachable"] == []
    # Its own disk, on the host its row names, running there and nowhere else; no image rebuild.
    row = rows_by_id(cctx)[moving]
    assert (row["host"], row["status"], row["intent"]) == ("node-a", "running", None)
    assert cluster["node-a"].disk_content[moving] == disks[moving]
    assert running_copies(cluster, moving) == ["node-a"]
    assert {n: fake.calls["spawn"] for n, fake in cluster.items()} == spawns  # nothing rebuilt from an image
    assert cctx.store.list_moves() == [] and cctx.store.list_evacuations() == []
    assert cctx.store.list_instance_claims() == []
    assert {k: row[k] for k in ("mac", "private_ip", "hostname")} == \
        {k: before[moving][k] for k in ("mac", "private_ip", "hostname")}
    # Its owner may use it again (no 409 forever), and reads what happened.
    *_, returned = ok(client.simulate_get(f"{BASE}/{moving}/actions", headers=alice.headers), 200)
    assert (returned["action"], returned["result"]) == ("move", "error")
    assert returned["message"] == ("not moved: host node-b, where it was moving, is down; it is on host node-a "
                                   "with its own disk")
    ok(task(client, alice, moving, "reboot"), 200)
    # The dead host comes back (as it died: nothing autostarts): its stale copy goes, never started.
    adapters.fake_hosts.revive("node-b")
    adapters.hosts.forget("node-b")
    assert cluster["node-b"].instances[moving].status == "shutoff"  # the copy defined there, never started
    starts = cluster["node-b"].calls["power_on"]
    assert drift_of(cctx, fix=True) == [("domain-stale", moving)]
    assert cluster["node-b"].calls["power_on"] == starts
    assert_gone_from(cluster["node-b"], [moving])
    assert drift_of(cctx) == []
    assert running_copies(cluster, moving) == ["node-a"] and cluster["node-a"].disk_content[moving] == disks[moving]
    host_records.remove_host(cctx, "node-b")  # nothing names it now
    # The drain finishes the others (and this one) once a target answers.
    moved = drain.drain(cctx, "node-a")
    assert moved["failed"] == [] and {m["id"] for m in moved["moved"]} == set(made)
    for i in made:
        assert running_copies(cluster, i) == [host_of(cctx, i)] and cluster[host_of(cctx, i)].disk_content[i] == disks[i]
    assert drift_of(cctx) == []


def test_drain_abandon_gives_up_a_move_whose_target_died(client, cctx, adapters, cluster, alice, catalog, flavor,
                                                         monkeypatch):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    cut_short(cctx, cluster, monkeypatch, "before-commit")
    adapters.fake_hosts.kill("node-b")
    # Off and refused while the move is recorded.
    assert cluster["node-a"].instances[made[0]].status == "shutoff"
    r = task(client, alice, made[0], "power-on")
    assert r.status_code == 409 and "being moved to another host" in r.json["msg"]
    result = drain.abandon(cctx, "node-a")
    assert result == {"host": "node-a", "abandoned": [{"id": made[0], "host": "node-a"}], "failed": []}
    assert running_copies(cluster, made[0]) == ["node-a"] and cluster["node-a"].disk_content[made[0]] == disks[made[0]]
    assert cctx.store.list_moves() == [] and rows_by_id(cctx)[made[0]]["status"] == "running"
    ok(task(client, alice, made[0], "power-off"), 200)
    host_records.remove_host(cctx, "node-b")
    assert drift_of(cctx) == []


def test_drain_abandon_refuses_a_committed_move_and_says_what_to_do(client, cctx, adapters, cluster, alice,
                                                                    catalog, flavor, monkeypatch):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    cut_short(cctx, cluster, monkeypatch, "after-commit")
    result = drain.abandon(cctx, "node-a")
    assert result["abandoned"] == [] and result["failed"] == [{"id": made[0], "error": (
        "its move was committed: the copy on host node-b is the instance now; `cloud-agent host drain node-a` "
        "finishes the move")}]
    adapters.fake_hosts.kill("node-b")
    [failed] = drain.abandon(cctx, "node-a")["failed"]
    assert "`cloud-agent host evacuate node-b --host-is-down` returns the instance to its own disk" in failed["error"]
    assert host_of(cctx, made[0]) == "node-b" and len(cctx.store.list_moves()) == 1
    assert made[0] in cluster["node-a"].disks and made[0] in cluster["node-b"].disks  # nothing was lost


def test_a_user_deactivated_while_the_disk_is_copied_is_not_in_the_moved_guest(client, cctx, adapters, cluster,
                                                                               alice, catalog, flavor):
    bob = make_caller(cctx, "bob@example.org", owner=alice)
    bob_uuid = enable(cctx, bob, username="bob")["uuid"]
    client.simulate_post("/v1/storage-volume", headers=bob.headers,
                         json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    ok(client.simulate_put(f"{BASE}/{made[0]}", headers=alice.headers,
                           json={"task": {"what": "modify-users", "how": "add", "users": [bob_uuid]}}), 200)
    assert "bob" in {u.username for u in cluster["node-a"].instances[made[0]].guest.users}
    real = cluster["node-b"].receive
    done = []

    def deactivate_meanwhile(instance_id, **kw):
        real(instance_id, **kw)
        if instance_id == made[0]:
            # The server deactivates bob while the agent copies the disk (another thread here;
            # another process in a deployment): it does not wait for the copy.
            t = threading.Thread(target=lambda: (users.update_user(cctx, ADMIN, bob.id, active=0), done.append(1)))
            t.start()
            t.join(timeout=5)

    cluster["node-b"].receive = deactivate_meanwhile
    result = drain.drain(cctx, "node-a")
    assert result["failed"] == [] and result["moved"][0] == {"id": made[0], "to": "node-b"}
    moved = cluster["node-b"].instances[made[0]]
    assert moved.status == "running"
    # The guest booted there without bob's account or home share, and its seed says so.
    assert "bob" not in {u.username for u in moved.live_guest.users}
    assert "bob" not in {u.username for u in moved.guest.users}
    assert "alice" in {u.username for u in moved.live_guest.users}
    assert done == [1]  # it did not wait for the move (its refresh was left to the move)
    assert drift_of(cctx) == []


def test_a_full_head_node_disk_during_the_spool_fails_the_move_cleanly(client, cctx, adapters, cluster, alice,
                                                                      catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    ok(task(client, alice, made[1], "power-off"), 200)
    cluster["node-a"].fail_on["read_disk"] = OSError(errno.ENOSPC, "No space left on device")
    result = drain.drain(cctx, "node-a")
    assert result["moved"] == [] and [f["id"] for f in result["failed"]] == made
    assert {f["error"] for f in result["failed"]} == {
        f"the head node could not copy the disk through {drain._spool_folder(cctx)}: the disk is full; "
        "the move was undone"}
    # Undone: each guest as it was, on node-a with its disk; nothing on the targets; not locked.
    assert [cluster["node-a"].instances[i].status for i in made] == ["running", "shutoff", "running"]
    assert all(cluster["node-a"].disk_content[i] == disks[i] for i in made)
    assert not cluster["node-b"].instances and not cluster["default"].instances
    assert cctx.store.list_moves() == [] and cctx.store.list_instance_claims() == []
    *_, tried = ok(client.simulate_get(f"{BASE}/{made[0]}/actions", headers=alice.headers), 200)
    assert tried["message"].endswith("the disk is full; the move was undone")
    ok(task(client, alice, made[0], "reboot"), 200)
    assert drift_of(cctx) == []


def test_a_head_node_without_room_for_the_copy_changes_nothing(client, cctx, adapters, cluster, alice, catalog,
                                                              flavor, monkeypatch):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    monkeypatch.setattr(drain, "_free_bytes", lambda folder: 300 * 2**20)
    result = drain.drain(cctx, "node-a")
    assert result["moved"] == [] and len(result["failed"]) == 3
    assert result["failed"][0]["error"].startswith(
        f"the head node has 300 MiB free in {drain._spool_folder(cctx)}, where the disk is copied through; a disk "
        "of this flavor may take up to ")
    assert cluster["node-a"].calls["shut_down"] == 0  # the guests never stopped
    assert all(cluster["node-a"].instances[i].status == "running" for i in made)
    assert cctx.store.list_moves() == [] and drift_of(cctx) == []


def test_agent_host_drain_abandon_and_host_remove_of_a_host_a_move_names(tmp_path):
    from tests.fixtures.agent import agent_call
    from tests.hosts.test_drain import INSTANCE, sandbox_with_a_node

    config, db = sandbox_with_a_node(tmp_path, domain=True)
    # A drain of node-9 cut short while moving to a host that then died for good.
    db.execute("INSERT INTO hosts (name, uri, storage_pool, network, created_at_utc, updated_at_utc) "
               "VALUES ('gone', 'qemu+tls://127.0.0.1:1/system', 'p', 'cc-private', 'x', 'x')")
    db.execute("INSERT INTO moves (instance_id, from_host, to_host, was_running, started_at_utc) "
               "VALUES (?, 'node-9', 'gone', 1, 'x')", (INSTANCE,))
    db.execute("UPDATE hosts SET enabled = 0 WHERE name = 'node-9'")
    db.commit()
    rc, doc = agent_call(config, "host", "remove", "gone")
    assert rc != 0 and f"host gone is named by the move of instance {INSTANCE} from host node-9 to host gone" \
        in doc["error"]
    rc, doc = agent_call(config, "host", "drain", "node-9", "--abandon")
    assert (rc, doc) == (0, {"host": "node-9", "abandoned": [{"id": INSTANCE, "host": "node-9"}], "failed": []})
    assert db.execute("SELECT host FROM instances WHERE id = ?", (INSTANCE,)).fetchone()[0] == "node-9"
    assert db.execute("SELECT COUNT(*) FROM moves").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM instance_claims").fetchone()[0] == 0
    assert agent_call(config, "host", "remove", "gone")[0] == 0
    # Nothing left to abandon: exit 0, an empty list.
    assert agent_call(config, "host", "drain", "node-9", "--abandon") == \
        (0, {"host": "node-9", "abandoned": [], "failed": []})


@pytest.mark.parametrize("when", ["before-commit", "after-commit"])
def test_evacuating_the_source_of_a_move_cut_short(client, cctx, adapters, cluster, alice, catalog, flavor,
                                                   monkeypatch, when):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    cut_short(cctx, cluster, monkeypatch, when)
    moving = made[0]
    adapters.fake_hosts.kill("node-a")  # the source dies
    result = evacuate.evacuate(cctx, "node-a", host_is_down=True)
    assert result["failed"] == []
    if when == "after-commit":
        # Its copy on node-b was checked and committed: finished there, with its own disk.
        assert result["kept"] == [{"id": moving, "to": "node-b"}]
        assert cluster["node-b"].disk_content[moving] == disks[moving]
        assert [r["id"] for r in result["rebuilt"]] == made[1:]
    else:
        # Not committed: the copy was never checked; rebuilt from its image like the others.
        assert "kept" not in result and [r["id"] for r in result["rebuilt"]] == made
    for i in made:
        assert running_copies(cluster, i) == [host_of(cctx, i)] and host_of(cctx, i) != "node-a", (i, result)
    assert cctx.store.list_moves() == [] and cctx.store.list_evacuations() == []
    host_records.remove_host(cctx, "node-a")
    assert drift_of(cctx) == []
