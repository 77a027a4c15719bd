"""The libvirt adapter's console: the domain's serial log in a folder beside the storage
pool's (`<pool folder>-console`) that no pool holds, read through the host's files channel.

On the test driver (fast) the definition; on a real libvirtd (integration) what SeaBIOS
prints on the serial port of an instance with a blank disk: no guest OS is booted. A
second libvirtd reached over qemu+tcp:// (tests/fixtures/remote_libvirtd.py) serves the
console of its instance the same way.
"""

import os
import time
import uuid
import xml.etree.ElementTree as ET

import pytest

from common.errors import InvalidInput
from host_adapters.guests.console import MAX_BYTES
from host_adapters.guests.guest import GuestSpec
from host_adapters.libvirt.driver import LibvirtHypervisor
from tests.fixtures.libvirtd import TEST_POOL, TEST_URI, cleanup_hypervisor, unique_prefix

BOOT_END = b"No bootable device."


def spawn(hv) -> str:
    instance_id = str(uuid.uuid4())
    base = hv.create_base_image(str(uuid.uuid4()), size_gb=1)
    hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=GuestSpec(hostname="vm-console"))
    return instance_id


def console_file(hv, instance_id) -> str:
    return f"{hv._names.prefix}console-{instance_id}.log"


# -- the test driver ---------------------------------------------------------------------------
def test_the_serial_port_logs_to_a_file_of_the_console_folder_in_no_pool(libvirt_test_driver):
    import libvirt

    hv = libvirt_test_driver
    files = hv.host_files  # the test driver's host is memory: so are its files
    instance_id = spawn(hv)
    conn = libvirt.open(TEST_URI)
    dom = ET.fromstring(conn.lookupByName(hv._names.domain(instance_id)).XMLDesc(0))
    log = dom.find("devices/serial/log")
    name = console_file(hv, instance_id)
    assert log.get("file") == f"/default-pool-console/{name}" and log.get("append") == "off"
    assert dom.find("os/bios").get("useserial") == "yes"
    # The folder was made through the host's files channel; no pool holds it, and no byte of
    # the guest's is a volume of any pool.
    assert "/default-pool-console" in files.folders
    assert "default-pool-console" not in conn.listStoragePools() + conn.listDefinedStoragePools()
    for pool in conn.listAllStoragePools(0):
        assert ET.fromstring(pool.XMLDesc(0)).findtext("target/path") != "/default-pool-console"
        assert not [v for v in pool.listAllVolumes(0) if "console" in v.name()]
    # What virtlogd would write is read back, newest copy last, and removed with the instance.
    files.write("/default-pool-console", f"{name}.0", b"older ")
    files.write("/default-pool-console", name, b"newest")
    assert hv.console(instance_id, max_bytes=MAX_BYTES).data == b"older newest"
    assert hv.console(instance_id, max_bytes=8).data == b"r newest"
    hv.destroy(instance_id)
    assert not [p for p in files.files if name in p]


def test_a_console_pool_of_an_earlier_version_is_undefined_at_the_next_create(libvirt_test_driver):
    import libvirt

    hv = libvirt_test_driver
    conn = libvirt.open(TEST_URI)
    try:
        conn.storagePoolDefineXML("<pool type='dir'><name>default-pool-console</name>"
                                  "<target><path>/default-pool-console</path></target></pool>", 0).create(0)
        spawn(hv)
        assert "default-pool-console" not in conn.listStoragePools() + conn.listDefinedStoragePools()
        hv.check()  # and a check meets none: nothing to do
    finally:
        if "default-pool-console" in conn.listStoragePools() + conn.listDefinedStoragePools():
            pool = conn.storagePoolLookupByName("default-pool-console")
            if pool.isActive():
                pool.destroy()
            pool.undefine()
        conn.close()


def test_the_test_driver_keeps_no_output_and_answers_empty(libvirt_test_driver):
    hv = libvirt_test_driver
    instance_id = spawn(hv)
    out = hv.console(instance_id, max_bytes=MAX_BYTES)
    assert out.data == b"" and out.running
    hv.power_off(instance_id)
    assert hv.console(instance_id, max_bytes=10).mark is None
    hv.destroy(instance_id)
    assert hv.console(instance_id, max_bytes=10).data == b""


def test_console_arguments_are_checked_before_the_host_is_asked(libvirt_test_driver):
    for bad in (-1, MAX_BYTES + 1, None):
        with pytest.raises(InvalidInput):
            libvirt_test_driver.console("i1", max_bytes=bad)
    with pytest.raises(InvalidInput):
        libvirt_test_driver.console("../etc", max_bytes=1)


# -- a real libvirtd ---------------------------------------------------------------------------
def wait_for(hv, instance_id, pattern: bytes, *, since=None, count: int = 1, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        out = hv.console(instance_id, max_bytes=MAX_BYTES, since=since)
        if out.data.count(pattern) >= count:
            return out
        assert time.monotonic() < deadline, f"no {pattern!r} on the console; it shows {out.data[-500:]!r}"
        time.sleep(0.5)


@pytest.fixture
def real(libvirt_dir_pool, libvirt_private_network, guest_virt):
    hv = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=unique_prefix(),
                           network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
                           virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode)
    yield hv, libvirt_dir_pool.path + "-console"  # the console folder
    cleanup_hypervisor(hv)


@pytest.mark.integration
@pytest.mark.real_commands
def test_console_of_a_real_guest_since_start_reset_and_power_cycle(real):
    hv, console_path = real
    instance_id = spawn(hv)
    first = wait_for(hv, instance_id, BOOT_END)
    assert b"SeaBIOS" in first.data and first.running
    assert first.mark.size == len(first.data) == os.path.getsize(f"{console_path}/{console_file(hv, instance_id)}")
    # The end, at most max_bytes of it.
    assert hv.console(instance_id, max_bytes=10).data == first.data[-10:]
    assert hv.console(instance_id, max_bytes=0).data == b""

    # A reset (the guest's own reboot; the API's reboot shuts down and starts) keeps QEMU: the
    # same run, the output goes on; read from the mark, only the new boot.
    hv._call("reset", lambda conn: hv._existing_domain(conn, instance_id).reset(0))
    after = wait_for(hv, instance_id, BOOT_END, since=first.mark)
    assert after.mark.run == first.mark.run
    assert after.data.count(b"SeaBIOS") == 1 and after.mark.size == first.mark.size + len(after.data)
    whole = hv.console(instance_id, max_bytes=MAX_BYTES)
    assert whole.data.count(b"SeaBIOS") == 2 and whole.data.endswith(after.data)

    # Shut off: no run, the last run's output is kept.
    hv.power_off(instance_id)
    stopped = hv.console(instance_id, max_bytes=MAX_BYTES)
    assert stopped.mark is None and stopped.data == whole.data

    # A new start of QEMU starts the file afresh; a mark of the earlier run counts no more.
    hv.power_on(instance_id)
    fresh = wait_for(hv, instance_id, BOOT_END, since=after.mark)
    assert fresh.mark.run != first.mark.run
    assert fresh.data.count(b"SeaBIOS") == 1
    assert hv.console(instance_id, max_bytes=MAX_BYTES).data == fresh.data

    # The API's reboot (issue 25) shuts the guest down and starts a new QEMU: a new run too.
    hv.reboot(instance_id, wait_seconds=1)
    rebooted = wait_for(hv, instance_id, BOOT_END, since=fresh.mark)
    assert rebooted.mark.run != fresh.mark.run and rebooted.data.count(b"SeaBIOS") == 1


@pytest.mark.integration
@pytest.mark.real_commands
def test_rotated_copies_are_read_in_order_and_deleted_with_the_instance(real):
    import libvirt

    hv, console_path = real
    instance_id = spawn(hv)
    current = wait_for(hv, instance_id, BOOT_END).data
    name = console_file(hv, instance_id)
    # What virtlogd leaves when it rotates at its max_size: <name>.0 the newest copy, .1 older.
    for n, text in ((1, b"oldest part\n"), (0, b"newer part\n")):
        with open(f"{console_path}/{name}.{n}", "wb") as f:
            f.write(text)
    out = hv.console(instance_id, max_bytes=MAX_BYTES)
    assert out.data == b"oldest part\nnewer part\n" + current
    assert out.mark.size == len(out.data)
    assert hv.console(instance_id, max_bytes=len(current) + 5).data == b"part\n" + current

    hv.destroy(instance_id)
    assert not [f for f in os.listdir(console_path) if f.startswith(name)]
    conn = libvirt.open(hv.uri)
    try:
        assert not [v for v in conn.storagePoolLookupByName(hv.storage_pool).listAllVolumes(0)
                    if v.name().startswith(name)]
        # The console folder is no pool's: libvirt never probes its files.
        assert f"{hv.storage_pool}-console" not in [p.name() for p in conn.listAllStoragePools(0)]
    finally:
        conn.close()
    assert hv.console(instance_id, max_bytes=MAX_BYTES).data == b""


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_remote_host_serves_the_console_of_its_instance(remote_libvirtd, guest_virt):
    hv = LibvirtHypervisor(remote_libvirtd.uri, storage_pool=remote_libvirtd.pool, domain_prefix=unique_prefix(),
                           network=remote_libvirtd.network, virt_type=guest_virt.virt_type,
                           cpu_mode=guest_virt.cpu_mode, connect_timeout=10)
    try:
        instance_id = spawn(hv)
        out = wait_for(hv, instance_id, BOOT_END)
        assert b"SeaBIOS" in out.data and out.running
        # The file is on the remote host, in its console folder (on this machine: read directly).
        path = f"{remote_libvirtd.pool_path}-console/{console_file(hv, instance_id)}"
        with open(path, "rb") as f:
            assert f.read() == out.data
        hv.destroy(instance_id)
        assert not os.path.exists(path)
    finally:
        cleanup_hypervisor(hv)
