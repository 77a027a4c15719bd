"""What is read from a host's volume is bounded before it is held (issue 16, finding 15): a
seed volume is read only up to the size of a seed, whatever capacity the volume declares,
and a base image copied between hosts is spooled only up to what a qcow2 file of its
min-disk can hold, whatever the stream keeps sending."""

import os

import pytest

from controller.hosts import host_records, image_copy
from controller.storage import images
from controller.errors import HostError, InvalidInput
from host_adapters.images.image_source import base_file_limit, open_image_source
from host_adapters.libvirt.storage import SEED_BYTES
from host_adapters.libvirt.volume_io import StreamVolumeIO
from tests.hypervisor.test_hypervisor import qcow2_header

GiB = 1 << 30


# -- libvirt's stream, without libvirt ------------------------------------------------------------
class _Stream:
    """Hands recvAll's handler chunks of `sending` until it is empty, as libvirt-python does
    (an exception from the handler aborts the stream)."""

    def __init__(self, sending):
        self.sending = sending
        self.aborted = self.finished = False
        self.handed = 0

    def recvAll(self, handler, opaque):  # noqa: N802 (libvirt's name)
        for chunk in self.sending:
            self.handed += len(chunk)
            try:
                handler(self, chunk, opaque)
            except BaseException:
                self.abort()
                raise

    def finish(self):
        self.finished = True

    def abort(self):
        self.aborted = True


class _Conn:
    def __init__(self, sending=()):
        self.stream = _Stream(sending)
        self.streams = 0

    def newStream(self, flags):  # noqa: N802
        self.streams += 1
        return self.stream


class _Vol:
    def __init__(self, capacity: int, allocation: int = 0):
        self.capacity, self.allocation = capacity, allocation
        self.asked: list[tuple[int, int]] = []

    def name(self):
        return "cc-x-seed"

    def info(self):
        return [0, self.capacity, self.allocation]

    def download(self, stream, offset, length, flags):
        self.asked.append((offset, length))


def flood(total: int, chunk: bytes = b"\xab" * 65536):
    """Far more than the volume declares (finite, so that a reader without a bound ends too)."""
    for _ in range(total // len(chunk)):
        yield chunk


def test_a_seed_volume_declaring_more_than_a_seed_is_not_read():
    conn, vol = _Conn(flood(2 * SEED_BYTES)), _Vol(capacity=100 * GiB)
    with pytest.raises(HostError, match=rf"cc-x-seed declares {100 * GiB} bytes, more than the {SEED_BYTES}"):
        StreamVolumeIO().read(conn, vol, limit=SEED_BYTES)
    assert conn.streams == 0 and vol.asked == []  # refused before any stream


def test_a_stream_bringing_more_than_was_asked_is_stopped():
    conn, vol = _Conn(flood(2 * SEED_BYTES, b"s" * 4096)), _Vol(capacity=SEED_BYTES)
    with pytest.raises(HostError, match="streamed"):
        StreamVolumeIO().read(conn, vol, limit=SEED_BYTES)
    assert vol.asked == [(0, SEED_BYTES)]
    assert conn.stream.aborted and conn.stream.handed <= SEED_BYTES + 4096


def test_a_seed_within_its_size_is_read_whole():
    content = b"seed" * (SEED_BYTES // 4)
    conn, vol = _Conn([content[:100], content[100:]]), _Vol(capacity=SEED_BYTES)
    assert StreamVolumeIO().read(conn, vol, limit=SEED_BYTES) == content
    assert conn.stream.finished and not conn.stream.aborted


def test_a_download_stops_at_its_limit(tmp_path):
    limit = 10 * 65536 + 5
    conn, vol = _Conn(flood(100 * 65536)), _Vol(capacity=GiB, allocation=1000)  # declares little, sends much
    spool = tmp_path / "spool"
    fd = os.open(spool, os.O_WRONLY | os.O_CREAT, 0o600)
    seen = []
    try:
        with pytest.raises(HostError, match=rf"streamed {11 * 65536} bytes, more than the {limit}"):
            StreamVolumeIO().download_file(conn, vol, fd, lambda got, total: seen.append(got), limit=limit)
    finally:
        os.close(fd)
    assert conn.stream.aborted
    assert spool.stat().st_size == 10 * 65536 <= limit and seen[-1] == 10 * 65536


def test_a_download_within_its_limit_is_written_whole(tmp_path):
    chunks = [os.urandom(1000), os.urandom(24)]
    conn, vol = _Conn(chunks), _Vol(capacity=GiB, allocation=1024)
    spool = tmp_path / "spool"
    fd = os.open(spool, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        StreamVolumeIO().download_file(conn, vol, fd, None, limit=1024)
    finally:
        os.close(fd)
    assert spool.read_bytes() == b"".join(chunks) and conn.stream.finished


# -- the bound of a base image's file ----------------------------------------------------------
def test_the_bound_holds_a_qcow2_of_its_size_and_little_more():
    assert GiB < base_file_limit(1) < GiB + GiB // 16 + 64 * 1024 * 1024
    assert base_file_limit(100) < 104 * GiB + 64 * 1024 * 1024


def test_an_image_source_larger_than_its_min_disk_holds_is_refused(tmp_path):
    source = tmp_path / "image.qcow2"
    source.write_bytes(qcow2_header(virtual_size=GiB))
    os.truncate(source, base_file_limit(1) + 1)  # sparse: nothing is written
    with pytest.raises(InvalidInput, match=rf"is {base_file_limit(1) + 1} bytes, more than a qcow2 file of 1 GiB"):
        open_image_source(str(source), 1)
    os.truncate(source, base_file_limit(1))
    open_image_source(str(source), 1).close()


def test_a_copy_between_hosts_stops_at_the_bound_and_leaves_nothing(cctx, adapters, monkeypatch, tmp_path):
    """The service passes the bound of the image's min-disk to the host it copies from."""
    fakes = adapters.fake_hosts
    fakes.add("node-a")
    host_records.add_host(cctx, name="node-a", uri="fake://node-a")
    image = images.add_image(cctx, name="i", os_name="d", os_major="1", os_minor="0", min_disk=1, min_ram=64)
    row = cctx.store.get_image(image["id"])
    base = adapters.hypervisor._names.base(image["id"])
    asked = []
    real = adapters.hypervisor.read_base_image

    def read_base_image(image_id, dest, *, max_bytes, progress=None):
        asked.append(max_bytes)
        return real(image_id, dest, max_bytes=max_bytes, progress=progress)

    monkeypatch.setattr(adapters.hypervisor, "read_base_image", read_base_image)
    adapters.hypervisor.base_content[base] = qcow2_header().ljust(5000, b"\0")
    monkeypatch.setattr(image_copy, "base_file_limit", lambda size_gb: 4096 if size_gb == 1 else None)
    spool_dir = os.path.dirname(os.path.abspath(cctx.store.path))
    before = sorted(os.listdir(spool_dir))
    with pytest.raises(HostError, match="streamed 5000 bytes, more than the 4096 bytes"):
        image_copy.ensure_image_on_host(cctx, row, "node-a")
    assert asked == [4096]
    assert image["id"] not in fakes.fakes["node-a"].list_base_images()
    # The spool file is gone (the copy locks' folder, `<database>.locks`, stays: it is kept state).
    assert sorted(n for n in os.listdir(spool_dir) if not n.endswith(".locks")) == before
    adapters.hypervisor.base_content[base] = qcow2_header().ljust(4096, b"\0")
    image_copy.ensure_image_on_host(cctx, row, "node-a")
    assert image["id"] in fakes.fakes["node-a"].list_base_images()


# -- a real libvirtd ---------------------------------------------------------------------------
@pytest.fixture
def real(libvirt_dir_pool, libvirt_private_network):
    from host_adapters.libvirt.driver import LibvirtHypervisor
    from tests.fixtures.libvirtd import cleanup_hypervisor, unique_prefix

    hv = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=unique_prefix(),
                           network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
                           virt_type="qemu", cpu_mode=None)
    yield hv
    cleanup_hypervisor(hv)


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_real_seed_volume_grown_past_a_seed_is_a_clear_error(real, libvirt_dir_pool):
    import libvirt

    from host_adapters.libvirt import xml as domain_xml
    from tests.hypervisor.test_hypervisor import new_id

    instance_id = new_id()
    conn = libvirt.open(libvirt_dir_pool.uri)
    pool = conn.storagePoolLookupByName(libvirt_dir_pool.name)
    # A seed's name, 16 times a seed's size (sparse: the pool's filesystem gives none of it).
    vol = pool.createXML(domain_xml.Volume(name=real._names.seed(instance_id), capacity_bytes=16 * SEED_BYTES,
                                           format="raw").to_xml(), 0)
    try:
        with pytest.raises(HostError, match=rf"declares {16 * SEED_BYTES} bytes, more than the {SEED_BYTES}"):
            real.describe(instance_id)
    finally:
        vol.delete(0)
        conn.close()


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_real_base_image_is_copied_only_within_its_bound(real, tmp_path):
    from host_adapters import subp
    from tests.hypervisor.test_hypervisor import new_id

    source = tmp_path / "image.qcow2"
    subp.run(["qemu-img", "create", "-q", "-f", "qcow2", str(source), "64M"])
    with open(source, "r+b") as f:  # some data, so that the file is more than its header
        f.seek(source.stat().st_size)
        f.write(os.urandom(4096))
    image_id = new_id()
    real.create_base_image(image_id, size_gb=1, source=str(source))
    spool = tmp_path / "spool"
    # The stored volume is the image published by a copy within the pool, not the source's
    # bytes (the data past the qcow2 image is not copied): its own size is the bound to test.
    fd = os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        assert real.read_base_image(image_id, fd, max_bytes=source.stat().st_size + 2 ** 30)
    finally:
        os.close(fd)
    size = spool.stat().st_size
    for limit, whole in ((size - 1, False), (size, True)):
        fd = os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if whole:
                assert real.read_base_image(image_id, fd, max_bytes=limit)
            else:
                with pytest.raises(HostError, match=rf"more than the {limit} bytes"):
                    real.read_base_image(image_id, fd, max_bytes=limit)
        finally:
            os.close(fd)
        assert spool.stat().st_size <= limit
    from tests.fixtures.libvirtd import assert_same_image

    assert_same_image(spool, source)


def test_the_test_drivers_contents_are_bounded_too():
    from host_adapters.libvirt.volume_io import InProcessVolumeIO

    class Vol:
        def path(self):
            return "/pool/cc-x-seed"

    io = InProcessVolumeIO()
    io.write(None, Vol(), b"seed", pad_to=2 * SEED_BYTES)
    with pytest.raises(HostError, match=rf"/pool/cc-x-seed declares {2 * SEED_BYTES} bytes, more than the {SEED_BYTES}"):
        io.read(None, Vol(), limit=SEED_BYTES)
    assert io.read(None, Vol(), limit=2 * SEED_BYTES).startswith(b"seed")
