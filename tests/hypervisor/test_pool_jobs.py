"""Storage pool jobs on a real libvirtd: deletes finish whatever else the host's pool is doing.

libvirt refuses a volume delete (and a pool refresh) while a volume of the same pool is
being built ("pool ... has asynchronous jobs running"); the adapter waits for it, bounded,
and a delete it could not finish keeps its intent for `reconcile --fix`. Nothing on a
request path refreshes a pool, and no guest-written byte sits in one: a console holding a
qcow2 header whose backing file is a FIFO (which hangs a refresh that probes it) leaves
console reads, deletes and volume lists answering, also after libvirtd starts again (which
refreshes every active pool); a console pool an earlier version made is undefined, its
files kept.
"""

import os
import subprocess
import threading
import time
import uuid

import pytest
from falcon import testing

from controller.maintenance.reconcile import reconcile
from controller.storage import images
from controller.users.accounts import enable_account
from host_adapters.guests.guest import GuestSpec
from host_adapters.libvirt import connection
from host_adapters.libvirt.driver import LibvirtHypervisor
from tests.fixtures.api import make_caller, new_context
from tests.fixtures.libvirtd import cleanup_hypervisor, real_libvirt_values, remove_console_pool, unique_prefix

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

REFUSAL = "internal error: pool '{pool}' has asynchronous jobs running."


def refuse_volume_deletes(monkeypatch, pool: str, times: int | None, only: str = "disk-"):
    """The next `times` (None: every) deletes of volumes whose name holds `only` are refused as
    libvirt refuses them while its pool has a job running; the domain is gone by then (the
    adapter removes it first). Returns the count of refusals made."""
    import libvirt

    class PoolBusy(libvirt.libvirtError):
        def __init__(self):
            Exception.__init__(self, REFUSAL.format(pool=pool))

        def get_error_code(self):
            return libvirt.VIR_ERR_INTERNAL_ERROR

        def get_error_domain(self):
            return libvirt.VIR_FROM_STORAGE

        def get_error_message(self):
            return REFUSAL.format(pool=pool)

    real = libvirt.virStorageVol.delete
    made = []

    def delete(vol, flags=0):
        if only in vol.name() and (times is None or len(made) < times):
            made.append(vol.name())
            raise PoolBusy()
        return real(vol, flags)

    monkeypatch.setattr(libvirt.virStorageVol, "delete", delete)
    return made


def pool_files(path: str, instance_id: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if instance_id in f) if os.path.isdir(path) else []


# -- the adapter -----------------------------------------------------------------------------------
@pytest.fixture
def hv(libvirt_dir_pool, libvirt_private_network, guest_virt):
    hv = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=unique_prefix(),
                           network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
                           virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode)
    yield hv
    cleanup_hypervisor(hv)


def test_a_pool_refusal_after_the_domain_went_is_waited_for_and_the_destroy_finishes(hv, libvirt_dir_pool,
                                                                                     monkeypatch):
    import libvirt

    base = hv.create_base_image(str(uuid.uuid4()), size_gb=1)
    instance_id = str(uuid.uuid4())
    hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=GuestSpec(hostname="vm-busy"))
    assert pool_files(libvirt_dir_pool.path, instance_id)
    refused = refuse_volume_deletes(monkeypatch, libvirt_dir_pool.name, times=3)
    hv.destroy(instance_id)
    assert len(refused) == 3
    assert hv.list_instances() == []
    conn = libvirt.open(libvirt_dir_pool.uri)
    try:
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByName(hv._names.domain(instance_id))
        assert not [v.name() for v in conn.storagePoolLookupByName(libvirt_dir_pool.name).listAllVolumes(0)
                    if instance_id in v.name()]
    finally:
        conn.close()
    assert pool_files(libvirt_dir_pool.path, instance_id) == []
    assert pool_files(libvirt_dir_pool.path + "-console", instance_id) == []


# -- the service -----------------------------------------------------------------------------------
@pytest.fixture
def service(tmp_path, libvirt_dir_pool, libvirt_private_network, guest_virt, sysroot):
    home_root = tmp_path / "homes"
    home_root.mkdir()
    values = real_libvirt_values(tmp_path, pool=libvirt_dir_pool, network=libvirt_private_network, virt=guest_virt,
                                 sysroot=sysroot, home_root=str(home_root), prefix=unique_prefix())
    ctx = new_context(values, real_adapters=True)
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    image = images.add_image(ctx, name="blank", os_name="none", os_major="0", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="micro", memory=64, disk=1, vcpu=1)
    yield ctx, client, image, flavor, libvirt_dir_pool
    hv = ctx.adapters.hypervisor
    for instance_id in hv.list_instances():
        hv.destroy(instance_id)
    for image_id in hv.list_base_images():
        hv.delete_base_image(image_id)


def user_with_volume(ctx, client, n: int):
    caller = make_caller(ctx, f"user{n}@example.org")
    enable_account(ctx, caller.email, username=f"user{n}")
    r = client.simulate_post("/v1/storage-volume", headers=caller.headers,
                             json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})
    assert r.status_code == 201, r.json
    return caller


def create(client, caller, image, flavor):
    return client.simulate_post("/v1/server-instance", headers=caller.headers,
                                json={"server-image": image["id"], "server-flavor": flavor["id"]})


def test_a_delete_refused_past_the_wait_keeps_its_intent_and_reconcile_fix_finishes_it(service, monkeypatch):
    ctx, client, image, flavor, pool = service
    alice = user_with_volume(ctx, client, 1)
    r = create(client, alice, image, flavor)
    assert r.status_code == 201, r.json
    iid = r.json["data"][0]["id"]
    monkeypatch.setattr(connection, "POOL_JOB_WAIT", 0.5)
    refuse_volume_deletes(monkeypatch, pool.name, times=None)
    r = client.simulate_delete(f"/v1/server-instance/{iid}", headers=alice.headers)
    assert r.status_code == 202 and r.json["success"] is True and "reconcile --fix" in r.json["msg"], r.json
    [row] = ctx.store.all_instances()
    assert row["intent"] == "deleting"
    assert client.simulate_get(f"/v1/server-instance/{iid}", headers=alice.headers).status_code == 404
    assert client.simulate_put(f"/v1/server-instance/{iid}", headers=alice.headers,
                               json={"task": {"what": "power-on"}}).status_code == 404
    hv = ctx.adapters.hypervisor
    assert not hv.describe(iid).defined and hv.describe(iid).disk_path  # the domain went, the disk did not

    monkeypatch.undo()  # the pool's job is over
    fixed = reconcile(ctx, fix=True)
    assert [(d["kind"], d["target"], d["fixed"]) for d in fixed] == [("instance-delete-interrupted", iid, True)]
    assert ctx.store.all_instances() == [] and hv.list_instances() == []
    assert pool_files(pool.path, iid) == [] and pool_files(pool.path + "-console", iid) == []
    assert reconcile(ctx) == []


def test_creates_console_reads_and_deletes_at_once_on_one_host_all_finish(service):
    """8 users for 30 s, each creating an instance, reading its console and deleting it: every
    delete is done (no domain, no disk, no row) and reconcile finds nothing."""
    ctx, client, image, flavor, pool = service
    users = [user_with_volume(ctx, client, n) for n in range(8)]
    deadline = time.monotonic() + 30
    answers: dict[str, list] = {"create": [], "console": [], "delete": []}
    made: list[str] = []
    lock = threading.Lock()

    def note(what, r):
        with lock:
            answers[what].append((r.status_code, r.json.get("msg", "")))
        return r.status_code

    def work(caller):
        while time.monotonic() < deadline:
            r = create(client, caller, image, flavor)
            if note("create", r) != 201:
                continue
            iid = r.json["data"][0]["id"]
            with lock:
                made.append(iid)
            for size in (1, 4096):
                note("console", client.simulate_get(f"/v1/server-instance/{iid}/console", headers=caller.headers,
                                                    query_string=f"bytes={size}"))
            note("delete", client.simulate_delete(f"/v1/server-instance/{iid}", headers=caller.headers))

    threads = [threading.Thread(target=work, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert made, answers
    for what, expected in (("create", 201), ("console", 200), ("delete", 200)):
        bad = [a for a in answers[what] if a[0] != expected]
        assert not bad, f"{what}: {len(bad)} of {len(answers[what])} answered otherwise: {bad[:5]}"
    assert ctx.store.all_instances() == []
    assert ctx.adapters.hypervisor.list_instances() == []
    for iid in made:
        assert pool_files(pool.path, iid) == [] and pool_files(pool.path + "-console", iid) == []
    assert reconcile(ctx) == []


# -- hostile console bytes -------------------------------------------------------------------------
def console_path(uri: str, domain: str) -> str:
    import xml.etree.ElementTree as ET

    import libvirt

    conn = libvirt.open(uri)
    try:
        return ET.fromstring(conn.lookupByName(domain).XMLDesc(0)).find("devices/serial/log").get("file")
    finally:
        conn.close()


def pool_folders(uri: str) -> list[str]:
    """The folders of every pool the libvirtd at uri has defined or running."""
    import xml.etree.ElementTree as ET

    import libvirt

    conn = libvirt.open(uri)
    try:
        return [ET.fromstring(p.XMLDesc(0)).findtext("target/path") or "" for p in conn.listAllStoragePools(0)]
    finally:
        conn.close()


def in_a_pool(uri: str, path: str) -> list[str]:
    return [f for f in pool_folders(uri) if f and os.path.dirname(path) == f.rstrip("/")]


def qcow2_with_fifo_backing(tmp_path) -> tuple[bytes, str]:
    """What guest root can make virtlogd's rotation start a file with: a qcow2 header naming a
    backing file of its choice, here a FIFO (opening it for reading blocks until a writer
    comes). The header's bytes and the FIFO's path."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    header = tmp_path / "header.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(fifo), "-u", str(header), "1M"],
                   check=True)
    return header.read_bytes(), str(fifo)


def release_fifo(fifo: str) -> None:
    """Whatever opened the FIFO for reading (a refresh that probed the header) gets its end."""
    for _ in range(50):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no reader: nothing waits on it
        os.close(fd)
        time.sleep(0.1)


def within(seconds: float, call):
    """call()'s result, or AssertionError when it has not answered within `seconds`."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no answer within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_qcow2_header_with_a_fifo_backing_in_a_console_holds_nothing_up(service, tmp_path):
    ctx, client, image, flavor, pool = service
    alice = user_with_volume(ctx, client, 1)
    r = create(client, alice, image, flavor)
    assert r.status_code == 201, r.json
    iid = r.json["data"][0]["id"]
    path = console_path(pool.uri, ctx.adapters.hypervisor._names.domain(iid))
    header, fifo = qcow2_with_fifo_backing(tmp_path)
    with open(path, "r+b") as f:
        f.write(header)
    try:
        r = within(20, lambda: client.simulate_get(f"/v1/server-instance/{iid}/console", headers=alice.headers,
                                                   query_string="bytes=16"))
        assert r.status_code == 200, r.json
        listed = within(20, lambda: subprocess.run(["virsh", "-c", pool.uri, "vol-list", pool.name],
                                                   capture_output=True, text=True, timeout=60))
        assert listed.returncode == 0, listed.stderr
        # The console file is in no folder of any pool libvirt knows (so nothing ever probes it).
        assert not in_a_pool(pool.uri, path)
        r = within(20, lambda: client.simulate_delete(f"/v1/server-instance/{iid}", headers=alice.headers))
        assert r.status_code == 200, r.json
        assert ctx.store.all_instances() == [] and not os.path.exists(path)
        listed = within(20, lambda: subprocess.run(["virsh", "-c", pool.uri, "vol-list", pool.name],
                                                   capture_output=True, text=True, timeout=60))
        assert listed.returncode == 0 and iid not in listed.stdout
        assert not path.startswith(pool.path + "/")  # no guest byte in the storage pool's folder
    finally:
        if os.path.exists(path):
            open(path, "wb").close()  # no later probe (a teardown's refresh) meets the header again
        release_fifo(fifo)


def test_libvirtd_starting_again_probes_no_console_and_answers_at_once(remote_libvirtd, guest_virt, tmp_path):
    """libvirtd refreshes every active pool when it starts; a console in a pool's folder would
    be probed then. The second host's libvirtd is started again with a hostile console kept."""
    hv = LibvirtHypervisor(remote_libvirtd.uri, storage_pool=remote_libvirtd.pool, domain_prefix=unique_prefix(),
                           network=remote_libvirtd.network, virt_type=guest_virt.virt_type,
                           cpu_mode=guest_virt.cpu_mode, connect_timeout=10)
    header, fifo = qcow2_with_fifo_backing(tmp_path)
    path = None
    try:
        base = hv.create_base_image(str(uuid.uuid4()), size_gb=1)
        instance_id = str(uuid.uuid4())
        hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=GuestSpec(hostname="vm-fifo"))
        path = console_path(remote_libvirtd.uri, hv._names.domain(instance_id))
        assert path.startswith(remote_libvirtd.pool_path + "-console/") and not in_a_pool(remote_libvirtd.uri, path)
        hv.power_off(instance_id)  # the file stays as the guest left it: the header first
        with open(path, "r+b") as f:
            f.write(header)
        remote_libvirtd.stop()
        within(40, remote_libvirtd.start)  # its start's refreshes answer (the fixture waits 30 s at most)
        for argv in (["pool-list", "--all"], ["vol-list", remote_libvirtd.pool]):
            listed = within(20, lambda a=argv: subprocess.run(["virsh", "-c", remote_libvirtd.uri, *a],
                                                              capture_output=True, text=True, timeout=60))
            assert listed.returncode == 0, listed.stderr
        assert within(20, lambda: hv.console(instance_id, max_bytes=16)).data == header[-16:]
        within(20, lambda: hv.destroy(instance_id))
        assert not os.path.exists(path)
    finally:
        if path and os.path.exists(path):
            open(path, "wb").close()
        release_fifo(fifo)
        cleanup_hypervisor(hv)


def test_a_console_pool_of_an_earlier_version_is_undefined_and_its_files_kept(hv, libvirt_dir_pool):
    import libvirt

    folder = libvirt_dir_pool.path + "-console"
    os.makedirs(folder, mode=0o700, exist_ok=True)
    kept = os.path.join(folder, f"{hv._names.prefix}console-{uuid.uuid4()}.log")
    with open(kept, "wb") as f:
        f.write(b"a console of an instance made before\n")
    name = libvirt_dir_pool.name + "-console"
    conn = libvirt.open(libvirt_dir_pool.uri)
    try:
        # What the earlier version made: persistent, autostarted, running on the console folder.
        old = conn.storagePoolDefineXML(f"<pool type='dir'><name>{name}</name><target><path>{folder}</path>"
                                        "</target></pool>", 0)
        old.setAutostart(1)
        old.create(0)
        base = hv.create_base_image(str(uuid.uuid4()), size_gb=1)
        instance_id = str(uuid.uuid4())
        hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=GuestSpec(hostname="vm-old"))
        assert name not in [p.name() for p in conn.listAllStoragePools(0)]
        assert folder not in pool_folders(libvirt_dir_pool.uri)
        with open(kept, "rb") as f:
            assert f.read() == b"a console of an instance made before\n"
        assert console_path(libvirt_dir_pool.uri, hv._names.domain(instance_id)).startswith(folder + "/")
        # Once more, by a check (as `cloud-agent check` and `host add` run it).
        conn.storagePoolDefineXML(f"<pool type='dir'><name>{name}</name><target><path>{folder}</path>"
                                  "</target></pool>", 0)
        hv.check()
        assert name not in [p.name() for p in conn.listAllStoragePools(0)] and os.path.exists(kept)
        hv.destroy(instance_id)
        assert os.path.exists(kept)  # not the controller's to remove: no instance of its names it
    finally:
        os.unlink(kept)
        remove_console_pool(conn, libvirt_dir_pool.name)  # when the test failed before the adapter did
        conn.close()
