"""An instance's disk copied to another host (a cold move): the overlay file, checked and
pointed at the new host's base image.

An instance's disk is a qcow2 overlay whose header names its backing file, the base
image's path in the old host's pool. The copy arrives as a file on the head node
(Hypervisor.read_disk); before it is uploaded, its header is checked (qcow2, no external
data file, no bigger than the flavor's disk) and its backing file name is rewritten to the
base image's path on the new host, in place: the name lives in the file's first cluster,
after the header and its extensions, where qemu-img rebase -u writes it too. The guest's
data (every cluster after the first) is not touched.
"""

import os
import struct

from common.errors import InvalidInput
from host_adapters.hypervisor import GiB
from host_adapters.images.image_source import _QCOW2_EXTERNAL_DATA_FILE, _QCOW2_MAGIC, ImageSource, base_file_limit

_MAX_BACKING_NAME = 1023  # qemu's limit


def disk_file_limit(disk_gb: int) -> int:
    """The most bytes the file of a disk of disk_gb GiB may hold (as a base image's)."""
    return base_file_limit(disk_gb)


def open_disk_copy(path: str, *, disk_gb: int, backing: str) -> ImageSource:
    """Open the copy of an instance's disk at `path` (a private file of the head node), check
    it and point it at `backing`; InvalidInput when it is not an overlay fit for a disk of
    disk_gb GiB or the new name does not fit where the old one is."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        what = f"the copy of the disk ({size} bytes)"
        if size > disk_file_limit(disk_gb):
            raise InvalidInput(f"{what} is more than a qcow2 file of {disk_gb} GiB holds")
        header = os.pread(fd, 104, 0)
        if len(header) < 72 or header[:4] != _QCOW2_MAGIC:
            raise InvalidInput(f"{what} is not a qcow2 file")
        version, name_at, name_len, cluster_bits, virtual_size = struct.unpack(">IQIIQ", header[4:32])
        if version >= 3 and len(header) >= 80 and struct.unpack(">Q", header[72:80])[0] & _QCOW2_EXTERNAL_DATA_FILE:
            raise InvalidInput(f"{what} uses an external data file")
        if virtual_size > disk_gb * GiB:
            raise InvalidInput(f"{what} has a virtual size of {virtual_size} bytes, more than {disk_gb} GiB")
        new = backing.encode()
        if name_at == 0 or not 9 <= cluster_bits <= 21:
            raise InvalidInput(f"{what} is not an overlay on a base image")
        if len(new) > _MAX_BACKING_NAME or name_at + max(len(new), name_len) > 1 << cluster_bits:
            raise InvalidInput(f"{what}: the backing file name {backing} does not fit in its header")
        os.pwrite(fd, new.ljust(name_len, b"\0"), name_at)
        os.pwrite(fd, struct.pack(">I", len(new)), 16)
        os.fsync(fd)
        return ImageSource(path, fd, size)
    except BaseException:
        os.close(fd)
        raise
