"""`cloud-agent host evacuate NAME --host-is-down` (hosts, README, issue 16 fault (c)).

On fake hosts (tests/hosts/test_hosts.py's cluster: default 4 GiB, node-a 8 GiB, node-b
6 GiB): a dead host's instances are rebuilt elsewhere with the same identity, the
command refuses a live host and a cluster without room, an evacuation cut short is
finished by running it again or by reconcile, and the old host's stale copies are
removed (never started) when it answers again. Then the agent's CLI.
"""

import os
import re

import pytest

from controller.maintenance import evacuate
from controller.hosts import host_records
from controller.instances import instances
from controller.audit import request_ids
from controller.errors import Conflict, InvalidInput
from controller.maintenance.reconcile import reconcile
from tests.fixtures.agent import AGENT, agent_call
from tests.hosts.test_hosts import alice, boot, cluster, flavor, host_of, ok  # noqa: F401 (fixtures)

IDENTITY = ("id", "hostname", "private_ip", "public_ip", "mac", "public_mac", "users", "owner_id", "image_id",
            "flavor_id")


def three_on_node_a(client, cctx, alice, catalog, flavor):
    made = [ok(boot(client, alice, catalog, flavor))[0]["id"] for _ in range(3)]
    assert [host_of(cctx, i) for i in made] == ["node-a"] * 3
    return [r["id"] for r in cctx.store.all_instances()]  # the order evacuate takes them in


def full_but_two_on_node_b(client, cctx, alice, catalog, flavor):
    """Every host full (4 + 8 + 6 GiB), then two of node-b's deleted: room for 2 of node-a's 8."""
    made = [ok(boot(client, alice, catalog, flavor))[0]["id"] for _ in range(18)]
    for i in [i for i in made if host_of(cctx, i) == "node-b"][:2]:
        ok(client.simulate_delete(f"/v1/server-instance/{i}", headers=alice.headers), 200)


def rows_by_id(cctx):
    return {r["id"]: r for r in cctx.store.all_instances()}


def drift_of(cctx, **kw):
    return [(d["kind"], d["target"]) for d in reconcile(cctx, **kw)]


def test_evacuate_rebuilds_a_dead_hosts_instances_with_their_identity(client, cctx, adapters, cluster, alice,
                                                                      catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    before = rows_by_id(cctx)
    guests = {i: cluster["node-a"].instances[i].guest for i in made}
    adapters.fake_hosts.kill("node-a")
    with pytest.raises(InvalidInput, match="only for a dead host that is fenced"):
        evacuate.evacuate(cctx, "node-a", host_is_down=False)
    request_ids.bind("evacuate-run")  # as cloud-agent binds one per command run
    try:
        result = evacuate.evacuate(cctx, "node-a", host_is_down=True)
    finally:
        request_ids.bind(None)
    # Most free memory first: node-b (6144), node-b (5120), then default and node-b tie at 4096: by name.
    assert result == {"host": "node-a", "failed": [],
                      "rebuilt": [{"id": made[0], "to": "node-b"}, {"id": made[1], "to": "node-b"},
                                  {"id": made[2], "to": "default"}]}
    after = rows_by_id(cctx)
    for entry in result["rebuilt"]:
        i, to = entry["id"], entry["to"]
        assert {k: after[i][k] for k in IDENTITY} == {k: before[i][k] for k in IDENTITY}
        assert after[i]["host"] == to and after[i]["intent"] is None
        domain = cluster[to].instances[i]
        assert domain.guest == guests[i]  # hostname, NICs (MAC, addresses), users, shares
        assert domain.status == "running"
        assert domain.base_image == cctx.store.get_image(catalog["public"]["id"])["base_volume"]
        assert {r.mac for r in cluster[to].networks["cc-private"].values()} >= {before[i]["mac"]}
        got = ok(client.simulate_get(f"/v1/server-instance/{i}", headers=alice.headers), 200)[0]
        assert got["status"] == "running" and got["hostname"] == before[i]["hostname"]
        create, evacuated = ok(client.simulate_get(f"/v1/server-instance/{i}/actions", headers=alice.headers), 200)
        assert create["action"] == "create" and create["requester"] == alice.id
        assert {k: evacuated[k] for k in ("action", "requester", "request-id", "result")} == {
            "action": "evacuate", "requester": None, "request-id": "evacuate-run", "result": "success"}
        assert f"host node-a is down: rebuilt on host {to}" in evacuated["message"]
    assert cctx.store.list_evacuations() == []
    assert cctx.store.get_host("node-a")["enabled"] == 0
    host_records.remove_host(cctx, "node-a")  # it holds nothing now
    assert [h["name"] for h in host_records.list_hosts(cctx)] == ["default", "node-b"]
    assert drift_of(cctx) == []


def test_evacuate_is_refused_while_the_host_answers(client, cctx, adapters, cluster, alice, catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    adapters.hosts.mark_unreachable("node-a", "a blip")  # a back-off is not death: it is asked again
    with pytest.raises(Conflict, match="host node-a answers: its guests may still run"):
        evacuate.evacuate(cctx, "node-a", host_is_down=True)
    assert {host_of(cctx, i) for i in made} == {"node-a"} and cctx.store.get_host("node-a")["enabled"] == 1
    assert set(cluster["node-a"].instances) == set(made) and not cluster["node-b"].instances
    assert cctx.store.list_evacuations() == []


def test_evacuate_without_room_says_what_is_missing_and_changes_nothing(client, cctx, adapters, cluster, alice,
                                                                        catalog, flavor):
    full_but_two_on_node_b(client, cctx, alice, catalog, flavor)
    before = rows_by_id(cctx)
    adapters.fake_hosts.kill("node-a")
    with pytest.raises(Conflict) as err:
        evacuate.evacuate(cctx, "node-a", host_is_down=True)
    assert err.value.message == ("host node-a not evacuated: the other hosts lack room for 6 of its 8 instance(s) "
                                 "(6 vCPUs and 6144 MB missing); nothing was changed")
    assert rows_by_id(cctx) == before and cctx.store.get_host("node-a")["enabled"] == 1
    assert cctx.store.list_evacuations() == [] and len(cluster["node-b"].instances) == 4


class Crash(BaseException):
    """The agent's process dying mid-way."""


@pytest.mark.parametrize("finisher", ["evacuate-again", "reconcile-fix"])
def test_an_evacuation_cut_short_is_finished_never_undone(client, cctx, adapters, cluster, alice, catalog,
                                                          flavor, monkeypatch, finisher):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    before = rows_by_id(cctx)
    adapters.fake_hosts.kill("node-a")
    real, calls = instances.respawn, []

    def crash_after_the_second_spawn(ctx, row):
        real(ctx, row)
        calls.append(row["id"])
        if len(calls) == 2:
            raise Crash()

    monkeypatch.setattr(instances, "respawn", crash_after_the_second_spawn)
    with pytest.raises(Crash):
        evacuate.evacuate(cctx, "node-a", host_is_down=True)
    monkeypatch.setattr(instances, "respawn", real)
    [record] = cctx.store.list_evacuations()
    assert (record["instance_id"], record["from_host"], record["to_host"]) == (made[1], "node-a", "node-b")
    assert host_of(cctx, made[2]) == "node-a"
    # Reconcile reports it as an evacuation to finish, not a create to undo, and the row stays.
    found = drift_of(cctx)
    assert ("instance-evacuate-interrupted", made[1]) in found
    assert not [k for k, _ in found if k.startswith("instance-create") or k.startswith("domain-")]
    assert set(rows_by_id(cctx)) == set(made)
    if finisher == "evacuate-again":
        result = evacuate.evacuate(cctx, "node-a", host_is_down=True)
        assert result["failed"] == [] and [r["id"] for r in result["rebuilt"]] == [made[1], made[2]]
    else:
        fixed = reconcile(cctx, fix=True)
        assert [(d["kind"], d["fixed"]) for d in fixed if d["target"] == made[1]] == \
            [("instance-evacuate-interrupted", True)]
        assert evacuate.evacuate(cctx, "node-a", host_is_down=True)["rebuilt"] == [{"id": made[2], "to": "default"}]
    after = rows_by_id(cctx)
    for i in made:
        assert {k: after[i][k] for k in IDENTITY} == {k: before[i][k] for k in IDENTITY}
        live = [n for n, fake in cluster.items() if n != "node-a" and i in fake.instances]
        assert live == [after[i]["host"]] and cluster[live[0]].instances[i].status == "running"
    assert cctx.store.list_evacuations() == []
    host_records.remove_host(cctx, "node-a")
    assert drift_of(cctx) == []


def test_the_old_host_answering_again_has_its_stale_copies_removed_never_started(client, cctx, adapters, cluster,
                                                                                alice, catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    old = cluster["node-a"]
    adapters.fake_hosts.kill("node-a")
    assert evacuate.evacuate(cctx, "node-a", host_is_down=True)["failed"] == []
    # It comes back as it died (a host that reboots has them shut off; nothing autostarts them).
    for i in made:
        old.instances[i].status = "shutoff"
    adapters.fake_hosts.revive("node-a")
    adapters.hosts.forget("node-a")
    starts = old.calls["power_on"] + old.calls["start"]
    found = reconcile(cctx)
    assert sorted((d["kind"], d["target"], d["fixable"]) for d in found) == \
        sorted(("domain-stale", i, True) for i in made)
    assert all("now on host" in d["detail"] for d in found)
    fixed = reconcile(cctx, fix=True)
    assert all(d["fixed"] for d in fixed) and len(fixed) == 3
    assert old.instances == {} and old.disks == {} and old.seeds == {}
    assert all(not net for net in old.networks.values())  # its DHCP reservations went with them
    assert old.calls["power_on"] + old.calls["start"] == starts
    assert all(cluster[host_of(cctx, i)].instances[i].status == "running" for i in made)
    assert drift_of(cctx) == []
    host_records.remove_host(cctx, "node-a")
    assert drift_of(cctx) == []


# -- the agent -----------------------------------------------------------------------------------------------------


def test_agent_host_evacuate(tmp_path):
    import sqlite3

    from tests.hosts.test_hosts import node_file

    config = str(tmp_path / "controller.ini")
    assert agent_call(config, "init", "--sandbox", str(tmp_path / "state"))[0] == 0
    uri = node_file(tmp_path, "node-9", cpus=8, memory_mb=16384)
    assert agent_call(config, "host", "add", "node-9", "--uri", uri, "--storage-pool", "pool-node-9",
                      "--network", "cc-private")[0] == 0
    rc, doc = agent_call(config, "host", "evacuate", "node-9")
    assert rc == 1 and "add --host-is-down" in doc["error"]
    rc, doc = agent_call(config, "host", "evacuate", "node-9", "--host-is-down")
    assert rc == 1 and "host node-9 answers" in doc["error"]
    # A host that died holding an instance (recorded as the agent would find it).
    db = sqlite3.connect(tmp_path / "state" / "controller.db")
    db.execute("INSERT INTO hosts (name, uri, storage_pool, network, created_at_utc, updated_at_utc) "
               "VALUES ('gone', 'qemu+tls://127.0.0.1:1/system', 'p', 'cc-private', 'x', 'x')")
    db.execute("INSERT INTO users (id, email, password_hash, api_key, created_at_utc) "
               "VALUES ('u', 'u@x', 'h', 'k', 'x')")
    image_id = db.execute("SELECT id FROM images LIMIT 1").fetchone()
    if image_id is None:
        db.execute("INSERT INTO images (id, name, os_name, os_major, os_minor, min_disk, min_ram, base_volume, "
                   "creation_date) VALUES ('i', 'i', 'd', '1', '2', 1, 1, 'b', 'x')")
        image_id = ("i",)
    db.execute("INSERT INTO flavors (name, memory, disk, vcpu) VALUES ('f', 64, 1, 1)")
    fid = db.execute("SELECT id FROM flavors WHERE name = 'f'").fetchone()[0]
    iid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    db.execute("INSERT INTO instances (id, owner_id, image_id, flavor_id, status, creation_date, host, hostname, "
               "private_ip, mac) VALUES (?, 'u', ?, ?, 'running', 'x', 'gone', 'vm-0f8fad5b', '10.44.0.10', "
               "'52:54:00:0f:8f:ad')", (iid, image_id[0], fid))
    db.commit()
    rc, doc = agent_call(config, "host", "evacuate", "gone", "--host-is-down")
    # The sandbox's hosts live in each process (the test driver): this one has no base image
    # to rebuild from, so the rebuild fails, is undone, and the command exits 1.
    assert set(doc) == {"host", "rebuilt", "failed"} and doc["host"] == "gone" and doc["rebuilt"] == []
    assert [set(f) for f in doc["failed"]] == [{"id", "error"}] and doc["failed"][0]["id"] == iid
    assert "is on no reachable host to copy" in doc["failed"][0]["error"] and rc == 1
    assert db.execute("SELECT enabled FROM hosts WHERE name = 'gone'").fetchone()[0] == 0
    assert db.execute("SELECT host FROM instances WHERE id = ?", (iid,)).fetchone()[0] == "gone"
    assert db.execute("SELECT COUNT(*) FROM evacuations").fetchone()[0] == 0
    # The instance's history says so, under the request id of the command's audit row.
    [(requester, result, message, request_id)] = db.execute(
        "SELECT requester, result, message, request_id FROM instance_actions WHERE instance_id = ? "
        "AND action = 'evacuate'", (iid,)).fetchall()
    assert requester is None and result == "error" and doc["failed"][0]["error"] in message
    [(audited,)] = db.execute("SELECT request_id FROM audit WHERE action = 'cloud-agent host evacuate' "
                              "ORDER BY id DESC LIMIT 1").fetchall()
    assert re.fullmatch(r"[0-9a-f]{32}", request_id) and audited == request_id
    rc, doc = agent_call(config, "host", "remove", "gone")
    assert rc == 1 and "holds 1 instance" in doc["error"]
    # On a terminal, without --json: progress on stderr, then a line per instance.
    import pexpect

    env = {k: v for k, v in os.environ.items() if k != "CLOUD_CONTROLLER_CONFIG"}
    child = pexpect.spawn(str(AGENT), ["--config", config, "host", "evacuate", "gone", "--host-is-down"],
                          env=env, encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert f"evacuate: instance 1/1 of host gone ({iid})" in child.before
    assert f"FAILED {iid}: image" in child.before and "host gone: 0 rebuilt, 1 failed" in child.before
