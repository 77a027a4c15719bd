"""Issue 19 on real parts: `host drain` moves a domain and its disk between two real libvirtds.

The config's own host is the first test libvirtd; the second is reached over
`qemu+tcp://` (tests/fixtures/remote_libvirtd.py), as in test_hosts_remote.py, whose
cluster fixture this uses. A real QEMU domain (a blank image: no guest OS answers the
ACPI button, so it is powered off after the wait) is moved with its disk: the bytes the
"guest" wrote are on the other host, the copy's header names that host's base image, the
old host keeps nothing. A real guest that is moved and reached by SSH is in
tests/guests/test_guest_e2e.py.
"""

import subprocess
from pathlib import Path

import pytest

from controller.maintenance import drain
from controller.hosts import host_routing
from controller.maintenance.reconcile import reconcile
from host_adapters.images.disk_copy import open_disk_copy
from tests.fixtures.api import ready_to_create
from tests.hosts.test_hosts_remote import cluster  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

BASE = "/v1/server-instance"


def backing_of(path: Path) -> str:
    out = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(path)], capture_output=True, text=True,
                         check=True).stdout
    import json

    return json.loads(out)["backing-filename"]


def test_drain_moves_a_domain_and_its_disk_to_the_other_libvirtd(cluster, libvirt_dir_pool, remote_libvirtd,
                                                                   tmp_path):
    ctx = cluster
    ctx.config = ctx.config.with_values({"hosts": {"shutdown_wait_seconds": "2"}})
    client, alice, body = ready_to_create(ctx)
    r = client.simulate_post(BASE, headers=alice.headers, json=body)
    assert r.status_code == 201, r.json
    instance_id = r.json["data"][0]["id"]
    [row] = ctx.store.list_instances(visible_to=None, instance_id=instance_id)
    assert row["host"] == "default"  # the first libvirtd has the most free memory: by name on a tie
    disk = Path(host_routing.hypervisor_of_host(ctx, "default").describe(instance_id).disk_path)
    # What the guest wrote: a pattern into its overlay, while it is shut off.
    assert client.simulate_put(f"{BASE}/{instance_id}", headers=alice.headers,
                               json={"task": {"what": "power-off"}}).status_code == 200
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 3M", str(disk)], check=True,
                   capture_output=True)
    assert client.simulate_put(f"{BASE}/{instance_id}", headers=alice.headers,
                               json={"task": {"what": "power-on"}}).status_code == 200
    kept = tmp_path / "before.qcow2"
    kept.write_bytes(disk.read_bytes())
    cluster_bits = int.from_bytes(kept.read_bytes()[20:24], "big")

    result = drain.drain(ctx, "default")

    assert result == {"host": "default", "moved": [{"id": instance_id, "to": "remote"}], "failed": []}
    [row] = ctx.store.list_instances(visible_to=None, instance_id=instance_id)
    assert row["host"] == "remote" and row["status"] == "running"
    remote = host_routing.hypervisor_of_host(ctx, "remote")
    moved = Path(remote.describe(instance_id).disk_path)
    assert moved.parent == Path(remote_libvirtd.pool_path)
    # The disk's bytes are the old ones past the header cluster; the header names the new host's base.
    assert moved.read_bytes()[1 << cluster_bits:] == kept.read_bytes()[1 << cluster_bits:]
    base = ctx.store.get_image(row["image_id"])["base_volume"]
    assert backing_of(moved) == str(Path(remote_libvirtd.pool_path) / base)
    assert backing_of(kept) == str(Path(libvirt_dir_pool.path) / base)
    subprocess.run(["qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -P 0x5a 1M 3M", str(moved)], check=True,
                   capture_output=True)
    same = subprocess.run(["qemu-img", "compare", "-U", str(kept), str(moved)], capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    state = subprocess.run(["virsh", "-c", remote_libvirtd.uri, "domstate", ctx.config.libvirt.domain_prefix +
                            instance_id], capture_output=True, text=True)
    assert state.stdout.strip() == "running"  # it ran before: it runs there
    # Nothing of it is left on the first libvirtd: domain, disk, seed.
    gone = subprocess.run(["virsh", "-c", ctx.config.libvirt.uri, "dominfo", ctx.config.libvirt.domain_prefix +
                           instance_id], capture_output=True, text=True)
    assert gone.returncode != 0 and not disk.exists()
    assert instance_id not in host_routing.hypervisor_of_host(ctx, "default").list_instances()
    assert ctx.store.get_host("default")["enabled"] == 0 and ctx.store.list_moves() == []
    assert reconcile(ctx) == []


def test_a_copy_whose_new_backing_name_does_not_fit_is_refused(tmp_path):
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(tmp_path / "base.qcow2"), "1G"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(tmp_path / "base.qcow2"),
                    str(overlay), "1G"], check=True)
    from controller.errors import InvalidInput

    with pytest.raises(InvalidInput, match="does not fit"):
        open_disk_copy(str(overlay), disk_gb=1, backing="/" + "x" * 2000)
    with pytest.raises(InvalidInput, match="more than 0 GiB|virtual size"):
        open_disk_copy(str(overlay), disk_gb=0, backing="/elsewhere/base.qcow2")
    with open_disk_copy(str(overlay), disk_gb=1, backing="/elsewhere/base.qcow2") as copy:
        assert copy.size == overlay.stat().st_size
    assert backing_of(overlay) == "/elsewhere/base.qcow2"
