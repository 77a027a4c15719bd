"""A base image is checked and uploaded from one descriptor, and checked again once stored
(issue 8, finding 8): a qcow2 swapped in at the path after the check, or written over in
place during the upload, never becomes a base image every guest boots from."""

import os

import pytest

from controller.errors import InvalidInput
from host_adapters import subp
from host_adapters.images.image_source import ImageSource, open_image_source
from host_adapters.libvirt.volume_io import StreamVolumeIO
from tests.hypervisor.test_hypervisor import qcow2_header
from tests.fixtures.libvirtd import assert_same_image
from tests.hypervisor.test_hypervisor_kvm import kvm, pool_files, prefix  # noqa: F401 (fixtures)

GiB = 1 << 30


# -- the descriptor, without libvirt ----------------------------------------------------------
class _Stream:
    def __init__(self):
        self.received = bytearray()

    def sendAll(self, chunk, opaque):  # noqa: N802 (libvirt's name)
        while True:
            data = chunk(self, 4096, opaque)
            if not data:
                return
            self.received += data

    def finish(self):
        pass

    def abort(self):
        pass


class _Conn:
    def __init__(self):
        self.stream = _Stream()

    def newStream(self, flags):  # noqa: N802
        return self.stream


class _Vol:
    def upload(self, stream, offset, length, flags):
        assert (offset, flags) == (0, 0)
        self.length = length


def test_the_upload_sends_the_checked_file_even_after_the_path_is_swapped(tmp_path):
    checked = qcow2_header() + b"checked content" * 1000
    evil = qcow2_header(backing_offset=512) + b"/dev/sda".ljust(64, b"\0") + b"evil" * 4000
    source = tmp_path / "image.qcow2"
    source.write_bytes(checked)
    with open_image_source(str(source), 1) as image:
        (tmp_path / "evil.qcow2").write_bytes(evil)
        os.replace(tmp_path / "evil.qcow2", source)  # the path now names another file
        conn, vol = _Conn(), _Vol()
        StreamVolumeIO().upload_file(conn, vol, image, None)
    assert bytes(conn.stream.received) == checked and vol.length == len(checked)


def test_a_symlink_is_refused_before_anything_is_read(tmp_path):
    (tmp_path / "image.qcow2").write_bytes(qcow2_header())
    (tmp_path / "link").symlink_to(tmp_path / "image.qcow2")
    with pytest.raises(InvalidInput, match="symbolic link"):
        open_image_source(str(tmp_path / "link"), 1)


def test_the_descriptor_is_closed_after_a_refusal(tmp_path):
    source = tmp_path / "raw.img"
    source.write_bytes(b"\0" * 4096)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(InvalidInput):
            open_image_source(str(source), 1)
    assert len(os.listdir("/proc/self/fd")) == before


# -- a real libvirtd ---------------------------------------------------------------------
def make_qcow2(path, *extra: str, size: str = "64M") -> None:
    subp.run(["qemu-img", "create", "-q", "-f", "qcow2", *extra, str(path), size])


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_file_swapped_in_after_the_check_is_not_what_is_uploaded(kvm, libvirt_dir_pool, tmp_path):  # noqa: F811
    source = tmp_path / "image.qcow2"
    make_qcow2(source)
    keep = tmp_path / "checked-copy.qcow2"
    keep.write_bytes(source.read_bytes())
    evil = tmp_path / "evil.qcow2"
    # A host file as backing file: every guest would read it.
    make_qcow2(evil, "-u", "-b", "/etc/shadow", "-F", "raw")
    real_upload = kvm._io.upload_file

    def swap_then_upload(*args, **kwargs):
        os.replace(evil, source)  # between the check and the upload
        return real_upload(*args, **kwargs)

    kvm._io.upload_file = swap_then_upload
    image_id = new_image_id()
    base = kvm.create_base_image(image_id, size_gb=1, source=str(source))
    stored = os.path.join(libvirt_dir_pool.path, base)
    assert_same_image(keep, stored)
    assert "backing" not in subp.run(["qemu-img", "info", "--force-share", stored]).stdout


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_source_written_over_in_place_during_the_upload_is_refused_and_removed(kvm, libvirt_dir_pool,  # noqa: F811
                                                                                tmp_path):
    """Someone who can write the file itself (not only the path) changes it after the check:
    the stored volume is checked again, refused and removed."""
    source = tmp_path / "image.qcow2"
    make_qcow2(source)
    evil = tmp_path / "evil.qcow2"
    make_qcow2(evil, "-u", "-b", "/etc/shadow", "-F", "raw")
    size = source.stat().st_size
    evil_bytes = evil.read_bytes()[:size]
    real_upload = kvm._io.upload_file

    def overwrite_then_upload(*args, **kwargs):
        with open(source, "r+b") as f:  # same inode: the descriptor sees it
            f.write(evil_bytes)
        return real_upload(*args, **kwargs)

    kvm._io.upload_file = overwrite_then_upload
    before = pool_files(libvirt_dir_pool)
    image_id = new_image_id()
    with pytest.raises(InvalidInput, match="backing file; removed"):
        kvm.create_base_image(image_id, size_gb=1, source=str(source))
    assert image_id not in kvm.list_base_images()
    assert pool_files(libvirt_dir_pool) == before


@pytest.mark.integration
@pytest.mark.real_commands
def test_a_raw_upload_is_refused_and_removed(kvm, libvirt_dir_pool, tmp_path):  # noqa: F811
    """The stored volume must be qcow2: raw bytes uploaded in its place are removed."""
    source = tmp_path / "image.qcow2"
    make_qcow2(source)
    real_upload = kvm._io.upload_file
    raw = tmp_path / "raw.img"
    raw.write_bytes(b"\0" * source.stat().st_size)

    def upload_raw(conn, vol, image, progress):
        fd = os.open(raw, os.O_RDONLY)
        with ImageSource(str(raw), fd, image.size) as other:
            return real_upload(conn, vol, other, progress)

    kvm._io.upload_file = upload_raw
    before = pool_files(libvirt_dir_pool)
    with pytest.raises(InvalidInput, match="not qcow2; removed"):
        kvm.create_base_image(new_image_id(), size_gb=1, source=str(source))
    assert pool_files(libvirt_dir_pool) == before


def new_image_id() -> str:
    import uuid

    return str(uuid.uuid4())
