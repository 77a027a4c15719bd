"""One libvirt, one host record (issue 27, item 2).

A host is known by the libvirt it reaches (its host UUID and its storage pool's UUID),
whatever URI reached it: `host add` refuses a second record of one libvirt (the same URI
again, or another URI for it), a drain checks again before it moves anything, and no
move or repair destroys on one host what the row places on another when both are one
libvirt. On fake hosts (tests/hosts/test_hosts.py's cluster), on the sandbox's test
driver through `cloud-agent`, and on two real libvirtds.
"""

import pytest

from controller.maintenance import drain
from controller.hosts import host_records
from controller.errors import Conflict
from controller.maintenance.reconcile import reconcile
from tests.fixtures.agent import agent_call
from tests.hosts.test_drain import with_disks
from tests.hosts.test_evacuate import three_on_node_a
from tests.hosts.test_hosts import alice, cluster, flavor  # noqa: F401 (fixtures)
from tests.hosts.test_hosts_remote import cluster as real_cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.real_commands


def test_a_second_record_of_one_libvirt_is_refused_by_uri_or_by_identity(cctx, cluster):
    with pytest.raises(Conflict, match="host node-x not added: another record, host node-a \\(fake://node-a\\), "
                                       "reaches the same libvirt .*one libvirt is one host"):
        host_records.add_host(cctx, name="node-x", uri="fake://node-a")
    # Another URI for the same daemon (a host name and its address, qemu+ssh and qemu+tls): the
    # same host UUID answers.
    cctx.adapters.fake_hosts.alias("node-y", of="node-b")
    with pytest.raises(Conflict, match="host node-y not added: another record, host node-b"):
        host_records.add_host(cctx, name="node-y", uri="fake://node-y")
    assert {h["name"] for h in cctx.store.list_hosts()} == {"default", "node-a", "node-b"}
    # A libvirt of its own is added.
    cctx.adapters.fake_hosts.add("node-c")
    host_records.add_host(cctx, name="node-c", uri="fake://node-c")
    row = cctx.store.get_host("node-c")
    assert row["pool_uuid"] == cluster["node-c"].pool_uuid and row["host_uuid"] == cluster["node-c"].host_uuid


def _duplicate_of_node_a(cctx, cluster):
    """A second record of node-a's libvirt under another URI, as a database from before the
    check holds one; the only other host with room, so a drain of node-a would move there."""
    cctx.adapters.fake_hosts.alias("node-a2", of="node-a")
    cctx.store.insert_host({"name": "node-a2", "uri": "fake://node-a2", "storage_pool": "p",
                            "network": "cc-private", "vcpus": 16, "memory_mb": 8192})
    for name in ("default", "node-b"):
        cctx.store.set_host_enabled(name, False)


def test_a_drain_onto_a_second_record_of_its_libvirt_is_refused_and_loses_nothing(client, cctx, cluster, alice,
                                                                                  catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    _duplicate_of_node_a(cctx, cluster)
    with pytest.raises(Conflict, match="host node-a and host node-a2 reach the same libvirt.*Nothing was changed"):
        drain.drain(cctx, "node-a")
    node_a = cluster["node-a"]
    assert {i: node_a.disk_content.get(i) for i in made} == disks
    assert set(made) <= set(node_a.instances) and all(node_a.instances[i].status == "running" for i in made)
    assert cctx.store.get_host("node-a")["enabled"] == 1 and cctx.store.list_moves(from_host="node-a") == []
    assert {r["host"] for r in cctx.store.all_instances()} == {"node-a"}


def test_a_recorded_move_onto_the_same_libvirt_destroys_nothing(client, cctx, cluster, alice, catalog, flavor):
    # The guard at the copy itself, whatever checked before: a move recorded by an older run.
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    _duplicate_of_node_a(cctx, cluster)
    cctx.store.begin_move(made[0], "node-a", lambda hosts: "node-a2", was_running=True)
    with pytest.raises(Conflict, match="hosts node-a and node-a2 reach the same libvirt: the instance was not moved "
                                       "and nothing of it was destroyed"):
        drain.finish(cctx, made[0])
    assert cluster["node-a"].disk_content[made[0]] == disks[made[0]] and made[0] in cluster["node-a"].instances
    # After the commit (the row names the duplicate), the "old" copy is the instance itself: kept.
    cctx.store.commit_move(made[0])
    with pytest.raises(Conflict, match="reach the same libvirt"):
        drain.finish(cctx, made[0])
    assert cluster["node-a"].disk_content[made[0]] == disks[made[0]] and made[0] in cluster["node-a"].instances


def test_reconcile_never_removes_as_stale_a_domain_the_row_places_on_a_second_record(client, cctx, cluster, alice,
                                                                                     catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    disks = with_disks(cluster, made)
    _duplicate_of_node_a(cctx, cluster)
    drift = reconcile(cctx, fix=True)
    doubled = [d for d in drift if d["kind"] == "host-duplicate"]
    assert sorted(d["target"] for d in doubled) == sorted(made)
    assert not [d for d in drift if d["kind"] == "domain-stale"]
    assert {i: cluster["node-a"].disk_content.get(i) for i in made} == disks
    assert set(made) <= set(cluster["node-a"].instances)


def test_a_drain_refuses_a_host_that_now_reaches_another_libvirt(client, cctx, cluster, alice, catalog, flavor):
    made = three_on_node_a(client, cctx, alice, catalog, flavor)
    node_a = cluster["node-a"]
    # libvirtd started again on a machine without a firmware UUID: a new host UUID, the same
    # pool. The same libvirt: the drain goes on, and the new UUID is recorded.
    node_a.host_uuid = "6d3c2f5e-0000-4000-8000-000000000001"
    cctx.store.set_host_enabled("default", False)
    assert drain.drain(cctx, "node-b")["moved"] == []  # node-b holds none: only checked
    assert host_records.check_distinct(cctx, "node-a").host_uuid == node_a.host_uuid
    assert cctx.store.get_host("node-a")["host_uuid"] == node_a.host_uuid
    # Both changed: the URI now reaches another libvirt. Refused, nothing changed.
    node_a.host_uuid = "6d3c2f5e-0000-4000-8000-000000000002"
    node_a.pool_uuid = "6d3c2f5e-0000-4000-8000-00000000000f"
    with pytest.raises(Conflict, match=r"host node-a \(fake://node-a\) now reaches another libvirt than when it "
                                       "was added"):
        drain.drain(cctx, "node-a")
    assert cctx.store.get_host("node-a")["enabled"] == 1 and set(made) <= set(node_a.instances)


def test_cloud_agent_host_add_refuses_the_sandbox_libvirt_twice(tmp_path):
    config = str(tmp_path / "controller.ini")
    assert agent_call(config, "init", "--sandbox", str(tmp_path / "state"))[0] == 0
    rc, doc = agent_call(config, "host", "add", "again", "--uri", "test:///default")
    assert rc != 0
    assert "host again not added: another record, host default (test:///default), reaches the same libvirt" \
        in doc["error"]
    rc, doc = agent_call(config, "host", "list")
    assert rc == 0 and [h["name"] for h in doc["hosts"]] == ["default"]


@pytest.mark.integration
def test_real_libvirtds_are_told_apart_and_a_second_record_of_one_is_refused(real_cluster, remote_libvirtd):
    ctx = real_cluster
    rows = {r["name"]: r for r in ctx.store.list_hosts()}
    # Two daemons, each its own host UUID (from capabilities) and pool: both recorded.
    assert rows["remote"]["host_uuid"] and rows["remote"]["pool_uuid"]
    ours = host_records.read_identity(ctx, rows["default"])
    assert ours.host_uuid and ours.host_uuid != rows["remote"]["host_uuid"]
    # The same URI again, and another URI for the config's own daemon: refused, nothing recorded.
    with pytest.raises(Conflict, match="host again not added: another record, host remote"):
        host_records.add_host(ctx, name="again", uri=remote_libvirtd.uri, storage_pool=remote_libvirtd.pool,
                              network=remote_libvirtd.network, insecure=True)
    with pytest.raises(Conflict, match="host local not added: another record, host default"):
        host_records.add_host(ctx, name="local", uri="qemu+unix:///system")
    assert {r["name"] for r in ctx.store.list_hosts()} == {"default", "remote"}
    # A drain checks again: the two records are two libvirts.
    assert host_records.check_distinct(ctx, "remote").host_uuid == rows["remote"]["host_uuid"]
