"""Issue 10 on real parts: a second real libvirtd reached over `qemu+tcp://` as another host.

The config's own host is the first test libvirtd; the second
(tests/fixtures/remote_libvirtd.py) is added with `host add`. An image reaches
it over the connection (a failure mid-stream leaves no volume there), an
instance is placed there, and when its daemon stops: its instance shows
`error`, its operations are 503, the other host keeps working and reconcile
reports it and goes on. The real guest that boots on the remote host is in
tests/guests/test_guest_e2e.py (one boot serves both).
"""

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from controller.hosts import host_records, host_routing, image_copy
from controller.storage import images
from controller.errors import ControllerError
from controller.maintenance.reconcile import reconcile
from tests.fixtures.api import new_context, ready_to_create
from tests.fixtures.libvirtd import assert_same_image, cleanup_hypervisor, real_libvirt_values

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

BASE = "/v1/server-instance"
RETRY_SECONDS = 2


@pytest.fixture
def cluster(tmp_path, libvirt_dir_pool, libvirt_private_network, remote_libvirtd, guest_virt, sysroot,
            btrfs_home_root):
    values = real_libvirt_values(tmp_path, pool=libvirt_dir_pool, network=libvirt_private_network, virt=guest_virt,
                                 sysroot=sysroot, home_root=btrfs_home_root, prefix=f"hr{uuid.uuid4().hex[:6]}-")
    values["hosts"] = {"retry_seconds": RETRY_SECONDS, "connect_timeout_seconds": 5}
    values["capacity"] = {"cpu_allocation_ratio": "16", "ram_allocation_ratio": "1.0",
                          "reserved_host_memory_mb": "0"}
    values["limits"] = {"instances": -1, "vcpus": -1, "memory_mb": -1, "groups": 5, "managed_users": 5}
    ctx = new_context(values, path=tmp_path / "controller.ini", real_adapters=True)
    # The test daemon listens on plain tcp on the loopback, in a namespace of its own.
    added = host_records.add_host(ctx, name="remote", uri=remote_libvirtd.uri, storage_pool=remote_libvirtd.pool,
                           network=remote_libvirtd.network, insecure=True)
    assert added["reachable"] is True and added["vcpus"] > 0 and added["memory_mb"] > 0
    yield ctx
    for name in ("default", "remote"):
        try:
            cleanup_hypervisor(host_routing.hypervisor_of_host(ctx, name))
        except ControllerError:
            pass
    ctx.store.close()


def qcow2_source(tmp_path: Path, mib: int = 6) -> Path:
    """A qcow2 file with `mib` MiB of random data: an upload of many stream chunks."""
    raw, image = tmp_path / "data.raw", tmp_path / "source.qcow2"
    subprocess.run(["dd", "if=/dev/urandom", f"of={raw}", "bs=1M", f"count={mib}", "status=none"], check=True)
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(image)], check=True)
    return image


def remote_volumes(ctx, remote) -> list[str]:
    import libvirt

    conn = libvirt.open(remote.uri)
    try:
        pool = conn.storagePoolLookupByName(remote.pool)
        pool.refresh(0)
        return sorted(v.name() for v in pool.listAllVolumes(0))
    finally:
        conn.close()


def test_an_image_reaches_the_remote_host_over_the_connection(cluster, remote_libvirtd, tmp_path):
    ctx = cluster
    source = qcow2_source(tmp_path)
    image = images.add_image(ctx, name="Data", os_name="debian", os_major="12", os_minor="0", min_disk=1,
                             min_ram=128, source=str(source))
    row = ctx.store.get_image(image["id"])

    sent = []

    def fail_half_way(done, total):
        sent.append(done)
        if done > total // 2:
            raise RuntimeError("upload interrupted")

    with pytest.raises(RuntimeError, match="upload interrupted"):
        image_copy.ensure_image_on_host(ctx, row, "remote", progress=fail_half_way)
    assert len(sent) > 2  # it failed in the middle of the stream
    assert remote_volumes(ctx, remote_libvirtd) == []  # no partial volume left there
    assert not list(Path(remote_libvirtd.pool_path).iterdir())

    progress = []
    image_copy.ensure_image_on_host(ctx, row, "remote", progress=lambda d, t: progress.append((d, t)))
    assert remote_volumes(ctx, remote_libvirtd) == [row["base_volume"]]
    assert progress[-1][0] == progress[-1][1] == source.stat().st_size
    # What is there is the image (published by a copy within the pool: compared as an image).
    assert_same_image(source, Path(remote_libvirtd.pool_path) / row["base_volume"])


def created_on_a_remote_host(ctx):
    """alice's instance, created while the config's own host is disabled; the client, alice,
    the create's body and the instance."""
    client, alice, body = ready_to_create(ctx)
    host_records.set_enabled(ctx, "default", False)
    r = client.simulate_post(BASE, headers=alice.headers, json=body)
    assert r.status_code == 201, r.json
    return client, alice, body, r.json["data"][0]


def test_a_remote_host_that_stops_answering(cluster, remote_libvirtd, tmp_path):
    ctx = cluster
    client, alice, body, remote_inst = created_on_a_remote_host(ctx)
    [row] = ctx.store.list_instances(visible_to=None, instance_id=remote_inst["id"])
    assert row["host"] == "remote" and remote_inst["status"] == "running"
    domain = ctx.config.libvirt.domain_prefix + remote_inst["id"]
    info = subprocess.run(["virsh", "-c", remote_libvirtd.uri, "domstate", domain], capture_output=True, text=True)
    assert info.stdout.strip() == "running"
    on_first = subprocess.run(["virsh", "-c", ctx.config.libvirt.uri, "dominfo", domain],
                              capture_output=True, text=True)
    assert on_first.returncode != 0  # on the remote host only

    remote_libvirtd.stop()
    try:
        host_records.set_enabled(ctx, "default", True)
        # A GET answers from the statuses libvirt's events keep (no call to the host) until the
        # connection's close callback says the host went away: it comes from libvirt's event
        # loop a moment after the daemon stopped.
        deadline = time.monotonic() + 10
        r = client.simulate_get(f"{BASE}/{remote_inst['id']}", headers=alice.headers)
        while r.json["data"][0]["status"] != "error" and time.monotonic() < deadline:
            time.sleep(0.05)
            r = client.simulate_get(f"{BASE}/{remote_inst['id']}", headers=alice.headers)
        assert r.status_code == 200 and r.json["data"][0]["status"] == "error"
        began = time.monotonic()
        r = client.simulate_put(f"{BASE}/{remote_inst['id']}", headers=alice.headers,
                                json={"task": {"what": "power-off"}})
        assert r.status_code == 503 and "remote is unreachable" in r.json["msg"], r.json
        assert time.monotonic() - began < 1  # in its back-off: nobody waits on it
        r = client.simulate_delete(f"{BASE}/{remote_inst['id']}", headers=alice.headers)
        assert r.status_code == 503
        # The other host keeps working: a create lands there, lists answer.
        r = client.simulate_post(BASE, headers=alice.headers, json=body)
        assert r.status_code == 201, r.json
        local = r.json["data"][0]
        listed = {i["id"]: i["status"] for i in client.simulate_get(BASE, headers=alice.headers).json["data"]}
        assert listed == {remote_inst["id"]: "error", local["id"]: "running"}
        found = {h["name"]: h for h in host_records.list_hosts(ctx)}
        assert found["remote"]["reachable"] is False and found["default"]["reachable"] is True
        assert found["remote"]["instances"] == 1
        drift = reconcile(ctx)
        assert [(d["kind"], d["target"]) for d in drift if d["host"] == "remote"] == [("host-unreachable", "remote")]
        assert [d for d in drift if d["host"] == "default"] == []  # compared, and in order
    finally:
        remote_libvirtd.start()
    time.sleep(RETRY_SECONDS + 0.5)
    r = client.simulate_get(f"{BASE}/{remote_inst['id']}", headers=alice.headers)
    assert r.json["data"][0]["status"] == "running"  # it ran on while its libvirtd was down
    for inst in (remote_inst, local):
        assert client.simulate_delete(f"{BASE}/{inst['id']}", headers=alice.headers).status_code == 200
    assert subprocess.run(["virsh", "-c", remote_libvirtd.uri, "dominfo", domain],
                          capture_output=True).returncode != 0


# -- issue 16, finding 13: a base image is used only once complete, on every host ----------------
def test_a_base_image_is_seen_on_the_remote_host_only_complete_and_creates_wait_for_one_copy(
        cluster, remote_libvirtd, tmp_path):
    import threading

    ctx = cluster
    source = qcow2_source(tmp_path)
    image = images.add_image(ctx, name="Data", os_name="debian", os_major="12", os_minor="0", min_disk=1,
                             min_ram=128, source=str(source))
    row = ctx.store.get_image(image["id"])
    half, go_on = threading.Event(), threading.Event()
    second_progress = []

    def stop_half_way(done, total):
        if done > total // 2 and not go_on.is_set():
            half.set()
            go_on.wait(30)

    first = threading.Thread(target=image_copy.ensure_image_on_host, args=(ctx, row, "remote"),
                             kwargs={"progress": stop_half_way})
    second = threading.Thread(target=image_copy.ensure_image_on_host, args=(ctx, row, "remote"),
                              kwargs={"progress": lambda d, t: second_progress.append(d)})
    first.start()
    try:
        assert half.wait(30)
        second.start()
        time.sleep(0.5)
        # Half way through the stream: only a temporary volume, never the base image's name.
        on_remote = remote_volumes(ctx, remote_libvirtd)
        assert row["base_volume"] not in on_remote
        assert [v for v in on_remote if "-part-" in v] and len(on_remote) == 1, on_remote
        assert image["id"] not in host_routing.hypervisor_of_host(ctx, "remote").list_base_images()
        assert second.is_alive()  # waiting for the first copy, not uploading its own
    finally:
        go_on.set()
        first.join(60)
        second.join(60)
    assert second_progress == []  # the second used the first's copy
    assert remote_volumes(ctx, remote_libvirtd) == [row["base_volume"]]  # the temporary volume is gone
    assert_same_image(source, Path(remote_libvirtd.pool_path) / row["base_volume"])


def test_reconcile_finds_and_removes_what_a_crash_mid_upload_left_on_the_remote_host(
        cluster, remote_libvirtd, tmp_path):
    import libvirt

    ctx = cluster
    source = qcow2_source(tmp_path, mib=2)
    image = images.add_image(ctx, name="Data", os_name="debian", os_major="12", os_minor="0", min_disk=1,
                             min_ram=128, source=str(source))
    prefix = ctx.config.libvirt.domain_prefix
    left = f"{prefix}part-0badc0de-{image['id']}.qcow2"
    conn = libvirt.open(remote_libvirtd.uri)
    try:  # what a crash half way through an upload leaves: the temporary volume, truncated
        pool = conn.storagePoolLookupByName(remote_libvirtd.pool)
        pool.createXML(f"<volume><name>{left}</name><capacity unit='bytes'>{source.stat().st_size}</capacity>"
                       "<target><format type='raw'/></target></volume>", 0)
    finally:
        conn.close()
    assert image["id"] not in host_routing.hypervisor_of_host(ctx, "remote").list_base_images()  # never taken for the image
    drift = [d for d in reconcile(ctx) if d["kind"] == "base-image-partial"]
    assert [(d["host"], d["target"], d["fixable"]) for d in drift] == [("remote", left, True)]
    fixed = [d for d in reconcile(ctx, fix=True) if d["kind"] == "base-image-partial"]
    assert [(d["target"], d["fixed"]) for d in fixed] == [(left, True)]
    assert remote_volumes(ctx, remote_libvirtd) == []


# -- issue 16, finding 5: a create placed on a host whose libvirtd stopped -----------------------
def test_a_create_placed_on_a_stopped_remote_host_lands_on_the_live_one(cluster, remote_libvirtd):
    ctx = cluster
    client, alice, body = ready_to_create(ctx)
    host_records.set_enabled(ctx, "remote", False)
    first = client.simulate_post(BASE, headers=alice.headers, json=body)
    assert first.status_code == 201, first.json
    host_records.set_enabled(ctx, "remote", True)  # it answers: its capacity is fresh, it has the most free memory
    made = []
    remote_libvirtd.stop()
    try:
        r = client.simulate_post(BASE, headers=alice.headers, json=body)
        assert r.status_code == 201, r.json
        made = [first.json["data"][0]["id"], r.json["data"][0]["id"]]
        assert r.json["data"][0]["status"] == "running"
        rows = {i: ctx.store.list_instances(visible_to=None, instance_id=i)[0]["host"] for i in made}
        assert rows == {made[0]: "default", made[1]: "default"}
        assert {r["host"] for r in ctx.store.all_instances()} == {"default"}
    finally:
        remote_libvirtd.start()
    # Nothing of it on the host that did not answer: no domain, no volume.
    domain = ctx.config.libvirt.domain_prefix + made[1]
    assert subprocess.run(["virsh", "-c", remote_libvirtd.uri, "dominfo", domain],
                          capture_output=True).returncode != 0
    assert remote_volumes(ctx, remote_libvirtd) == []
    for instance_id in made:
        assert client.simulate_delete(f"{BASE}/{instance_id}", headers=alice.headers).status_code == 200


# -- issue 16, fault (c): a host that died for good is evacuated ---------------------------------
def test_a_dead_remote_host_is_evacuated_and_its_stale_domain_removed_when_it_answers(cluster, remote_libvirtd,
                                                                                      another_remote_libvirtd):
    """The instance is rebuilt on a third libvirtd ("spare"; the config's own host is disabled),
    keeping its identity; the old host, answering again, has its stale domain removed."""
    from controller.maintenance import evacuate
    from controller.errors import Conflict

    ctx = cluster
    client, alice, body, inst = created_on_a_remote_host(ctx)
    spare = another_remote_libvirtd
    host_records.add_host(ctx, name="spare", uri=spare.uri, storage_pool=spare.pool, network=spare.network, insecure=True)
    [before] = ctx.store.list_instances(visible_to=None, instance_id=inst["id"])
    assert before["host"] == "remote"
    domain = ctx.config.libvirt.domain_prefix + inst["id"]
    with pytest.raises(Conflict, match="host remote answers"):
        evacuate.evacuate(ctx, "remote", host_is_down=True)
    remote_libvirtd.stop()
    try:
        result = evacuate.evacuate(ctx, "remote", host_is_down=True)
        assert result == {"host": "remote", "rebuilt": [{"id": inst["id"], "to": "spare"}], "failed": []}
        [after] = ctx.store.list_instances(visible_to=None, instance_id=inst["id"])
        assert after["host"] == "spare"
        assert {k: after[k] for k in ("hostname", "private_ip", "mac", "users")} == \
            {k: before[k] for k in ("hostname", "private_ip", "mac", "users")}
        state = subprocess.run(["virsh", "-c", spare.uri, "domstate", domain], capture_output=True, text=True)
        assert state.stdout.strip() == "running"
        info = host_routing.hypervisor_of_host(ctx, "spare").describe(inst["id"])
        assert [n.mac for n in info.nics] == [before["mac"]]
        # Its network is bridged here: the guest's static config carries the address, no reservation.
        dhcp = host_routing.hypervisor_of_host(ctx, "spare").uses_dhcp_reservations()
        assert [(x.mac, x.address) for x in info.reservations] == \
            ([(before["mac"], before["private_ip"])] if dhcp else [])
        r = client.simulate_get(f"{BASE}/{inst['id']}", headers=alice.headers)
        assert r.json["data"][0]["status"] == "running"
    finally:
        remote_libvirtd.start()
    ctx.adapters.hosts.forget("remote")  # past its back-off
    found = [(d["kind"], d["target"]) for d in reconcile(ctx) if d["host"] == "remote"]
    assert found == [("domain-stale", inst["id"])]
    fixed = [d for d in reconcile(ctx, fix=True) if d["host"] == "remote"]
    assert [(d["kind"], d["fixed"]) for d in fixed] == [("domain-stale", True)]
    assert subprocess.run(["virsh", "-c", remote_libvirtd.uri, "dominfo", domain],
                          capture_output=True).returncode != 0
    assert [d for d in reconcile(ctx) if d["host"] == "remote"] == []
    assert client.simulate_delete(f"{BASE}/{inst['id']}", headers=alice.headers).status_code == 200
