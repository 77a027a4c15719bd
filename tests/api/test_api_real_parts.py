"""The controller API on real host parts: KVM domains, a btrfs home with its quota, groups in a system root.

These run the service exactly as a head node would (production profile), with
the adapters built from a config by the same factory `cloud-agent serve` uses.
"""

import os
import subprocess
import time
import uuid

import pytest
from falcon import testing

from controller.storage import images
from controller import limits
from controller.users.accounts import enable_account
from tests.fixtures.api import config_values_for, make_caller, new_context

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]


def build(tmp_path, **sections):
    values = config_values_for(tmp_path)
    values["controller"]["profile"] = "production"
    for section, keys in sections.items():
        values[section].update(keys)
    ctx = new_context(values, real_adapters=True)
    from api.app import create_app

    return ctx, testing.TestClient(create_app(ctx))


def ok(r, status=200):
    assert r.status_code == status, r.json
    assert r.json["success"] is True
    return r.json["data"]


def run(*argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check)


# -- KVM -------------------------------------------------------------------------------------
@pytest.fixture
def kvm_service(tmp_path, libvirt_dir_pool, libvirt_private_network, guest_virt, sysroot):
    home_root = tmp_path / "homes"
    home_root.mkdir()
    prefix = f"it{uuid.uuid4().hex[:6]}-"
    ctx, client = build(
        tmp_path,
        libvirt={"uri": libvirt_dir_pool.uri, "storage_pool": libvirt_dir_pool.name, "domain_prefix": prefix,
                 "virt_type": guest_virt.virt_type, "cpu_mode": guest_virt.cpu_mode},
        network={"name": libvirt_private_network.name, "subnet": libvirt_private_network.subnet},
        volumes={"home_root": str(home_root), "quota_backend": "none"},
        unix={"root": sysroot},
        # Blank disks run no OS to hear the power button: forced after 2 s (issue 25).
        guest={"shutdown_timeout_seconds": 2},
    )
    yield ctx, client, libvirt_dir_pool, prefix
    hv = ctx.adapters.hypervisor
    for instance_id in hv.list_instances():
        hv.destroy(instance_id)
    for image_id in hv.list_base_images():
        hv.delete_base_image(image_id)


def libvirt_network_name(ctx) -> str:
    return ctx.config.network.name


def virsh(uri, *args, check=True):
    return run("virsh", "-c", uri, *args, check=check)


def test_instance_lifecycle_on_kvm(kvm_service):
    ctx, client, pool, prefix = kvm_service
    alice = make_caller(ctx, "alice@example.org")
    account = enable_account(ctx, alice.email, username="alice")
    image = images.add_image(ctx, name="blank", os_name="none", os_major="0", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="micro", memory=128, disk=1, vcpu=1)
    ok(client.simulate_post("/v1/storage-volume", headers=alice.headers,
                            json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 201)

    [inst] = ok(client.simulate_post("/v1/server-instance", headers=alice.headers,
                                     json={"server-image": image["id"], "server-flavor": flavor["id"]}), 201)
    domain = f"{prefix}{inst['id']}"
    assert inst["status"] == "running" and inst["users"] == [account["uuid"]]
    assert virsh(pool.uri, "domstate", domain).stdout.strip() == "running"
    xml = virsh(pool.uri, "dumpxml", domain).stdout
    assert "<target dir='alice'/>" in xml and os.path.join(ctx.config.volumes.home_root, "alice") in xml
    assert "type='virtiofs'" in xml and inst["private-ip"] in virsh(pool.uri, "net-dumpxml",
                                                                    libvirt_network_name(ctx)).stdout
    files = [f for f in os.listdir(pool.path) if inst["id"] in f]
    assert len(files) == 2 and not [f for f in files if "console-" in f]  # the overlay and the seed
    # The guest's console output is kept in a pool of its own (no guest byte in the storage pool).
    assert [f for f in os.listdir(pool.path + "-console") if inst["id"] in f]

    def task(what):
        [r] = ok(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=alice.headers,
                                     json={"task": {"what": what}}))
        return r

    def last_message(what):
        entry = ok(client.simulate_get(f"/v1/server-instance/{inst['id']}/actions", headers=alice.headers))[-1]
        assert (entry["action"], entry["result"]) == (what, "success")
        return entry["message"]

    forced = ("forced: the guest did not shut down within 2 s of being asked ([guest] shutdown_timeout_seconds); "
              "it was powered off hard")
    started = time.monotonic()
    assert task("power-off")["status"] == "shutoff"
    assert 2 <= time.monotonic() - started < 30  # asked, waited, then forced
    assert virsh(pool.uri, "domstate", domain).stdout.strip() == "shut off"
    assert last_message("power-off") == forced
    r = client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=alice.headers,
                            json={"task": {"what": "reboot"}})
    assert r.status_code == 409
    assert task("power-on")["status"] == "running"
    assert virsh(pool.uri, "domstate", domain).stdout.strip() == "running"
    domid = virsh(pool.uri, "domid", domain).stdout.strip()
    assert task("reboot")["status"] == "running"
    assert virsh(pool.uri, "domstate", domain).stdout.strip() == "running"
    assert virsh(pool.uri, "domid", domain).stdout.strip() != domid  # shut down and started, not reset
    assert last_message("reboot") == forced + ", then started again"

    assert ok(client.simulate_delete(f"/v1/server-instance/{inst['id']}", headers=alice.headers)) == []
    assert virsh(pool.uri, "dominfo", domain, check=False).returncode != 0
    assert not any(inst["id"] in f for f in os.listdir(pool.path))
    assert not any(inst["id"] in f for f in os.listdir(pool.path + "-console"))
    assert ctx.store.all_instances() == []


def test_failed_start_on_kvm_leaves_nothing(kvm_service):
    ctx, client, pool, prefix = kvm_service
    bob = make_caller(ctx, "bob@example.org")
    enable_account(ctx, bob.email, username="bob")
    image = images.add_image(ctx, name="blank", os_name="none", os_major="0", os_minor="0", min_disk=1, min_ram=64)
    # More memory than this machine has: QEMU refuses to start, after the disk and the domain exist.
    flavor = images.add_flavor(ctx, name="huge", memory=64 * 1024 * 1024, disk=1, vcpu=1)
    ok(client.simulate_post("/v1/storage-volume", headers=bob.headers,
                            json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 201)
    body = {"server-image": image["id"], "server-flavor": flavor["id"]}
    # Bob's memory limit refuses it before anything is made...
    r = client.simulate_post("/v1/server-instance", headers=bob.headers, json=body)
    assert r.status_code == 409 and r.json["msg"].startswith("limit reached: memory_mb"), r.json
    assert ctx.store.all_instances() == []
    # ...and without limits (the host's memory times the config's ratio is enough on paper), QEMU refuses it.
    limits.set_limits(ctx, ctx.store.get_user(bob.id), {kind: -1 for kind in limits.KINDS})
    ctx.config = ctx.config.with_values({"capacity": {"ram_allocation_ratio": "100000"}})
    r = client.simulate_post("/v1/server-instance", headers=bob.headers, json=body)
    assert r.status_code == 503 and r.json["success"] is False, r.json
    assert ctx.store.all_instances() == []
    assert not [d for d in virsh(pool.uri, "list", "--all", "--name").stdout.split() if d.startswith(prefix)]
    assert not any(f.startswith((f"{prefix}disk-", f"{prefix}seed-")) for f in os.listdir(pool.path))


# -- btrfs quota ---------------------------------------------------------------------------------
def test_volume_quota_on_btrfs_is_enforced_and_removed(tmp_path, btrfs_home_root, sysroot):
    ctx, client = build(
        tmp_path,
        volumes={"home_root": btrfs_home_root, "quota_backend": "btrfs"},
        unix={"root": sysroot},
    )
    carol = make_caller(ctx, "carol@example.org")
    account = enable_account(ctx, carol.email, username="carol")
    [vol] = ok(client.simulate_post("/v1/storage-volume", headers=carol.headers,
                                    json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 201)
    home = vol["volume-type"]["mount-point"]
    assert home == os.path.join(btrfs_home_root, "carol")
    st = os.stat(home)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (account["uid"], account["gid"], 0o700)
    # The list is the whole filesystem's: other tests' roots may hold a "carol" of their own.
    mine = f"{os.path.basename(btrfs_home_root)}/carol\n"
    assert mine in run("btrfs", "subvolume", "list", btrfs_home_root).stdout

    as_carol = ["setpriv", f"--reuid={account['uid']}", f"--regid={account['gid']}", "--clear-groups"]
    small = run(*as_carol, "dd", "if=/dev/zero", f"of={home}/small", "bs=1M", "count=100", "conv=fsync",
                check=False)
    assert small.returncode == 0, small.stderr
    big = run(*as_carol, "dd", "if=/dev/zero", f"of={home}/big", "bs=1M", "count=1200", "conv=fsync",
              check=False)
    assert big.returncode != 0 and "quota" in big.stderr.lower(), big.stderr
    run("sync")

    subvol_id = run("btrfs", "inspect-internal", "rootid", home).stdout.strip()
    assert f"0/{subvol_id}" in run("btrfs", "qgroup", "show", btrfs_home_root).stdout
    assert ok(client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=carol.headers)) == []
    assert not os.path.exists(home)
    assert mine not in run("btrfs", "subvolume", "list", btrfs_home_root).stdout
    assert f"0/{subvol_id} " not in run("btrfs", "qgroup", "show", btrfs_home_root).stdout + " "


# -- groups in a scratch system root -----------------------------------------------------------
def group_line(sysroot, name):
    with open(os.path.join(sysroot, "etc", "group")) as f:
        for line in f:
            if line.split(":", 1)[0] == name:
                return line.rstrip("\n")
    return None


def test_groups_in_a_system_root(tmp_path, sysroot):
    ctx, client = build(tmp_path, unix={"root": sysroot})
    dave = make_caller(ctx, "dave@example.org")
    erin = make_caller(ctx, "erin@example.org", owner=dave)
    enable_account(ctx, dave.email, username="dave")
    enable_account(ctx, erin.email, username="erin")

    [g] = ok(client.simulate_post("/v1/group", headers=dave.headers,
                                  json={"group-name": "physics", "group-members": ["dave"]}), 201)
    line = group_line(sysroot, "physics")
    assert line is not None and line.endswith(":dave")
    gid = g["group-id"]

    def put(action, members):
        return ok(client.simulate_put(f"/v1/group/{gid}", headers=dave.headers,
                                      json={"action": action, "group-members": members}))

    put("add", ["erin"])
    assert group_line(sysroot, "physics").split(":")[3].split(",") == ["dave", "erin"]
    put("delete", ["dave"])
    assert group_line(sysroot, "physics").endswith(":erin")
    put("replace", ["dave"])
    assert group_line(sysroot, "physics").endswith(":dave")
    r = client.simulate_post("/v1/group", headers=dave.headers, json={"group-name": "bad;name"})
    assert r.status_code == 400 and group_line(sysroot, "bad;name") is None
    assert ok(client.simulate_delete(f"/v1/group/{gid}", headers=dave.headers)) == []
    assert group_line(sysroot, "physics") is None
