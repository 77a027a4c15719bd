"""A qcow2 file that is to become a base image: opened once, checked, and read from that descriptor.

Both hypervisor adapters take a base image's content from here
(Hypervisor.create_base_image's `source`); base_file_limit bounds a base
image's file wherever one is copied.
"""

import errno
import hashlib
import os
import stat
import struct

from common.errors import InvalidInput
from host_adapters.hypervisor import GiB

_QCOW2_MAGIC = b"QFI\xfb"
_QCOW2_EXTERNAL_DATA_FILE = 1 << 2


class ImageSource:
    """A source image opened once, by open_image_source: checked from this descriptor
    and uploaded from it, so whatever is at the path later is never read.

    A context manager; `read(offset, n)` reads without moving a file position,
    so the header check and the upload cannot disturb each other.
    """

    def __init__(self, path: str, fd: int, size: int):
        self.path, self.fd, self.size = path, fd, size

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def sha256(self) -> str:
        """The SHA-256 of its `size` bytes, read from the descriptor."""
        digest, offset = hashlib.sha256(), 0
        while offset < self.size:
            chunk = self.read(offset, min(1 << 20, self.size - offset))
            if not chunk:
                break
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "ImageSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_qcow2_header(header: bytes, size_gb: int, what: str) -> None:
    """InvalidInput unless header (the first 80 bytes or all there are) is a qcow2 header fit for a
    base image: no backing file, no external data file, a virtual size of at most size_gb GiB."""
    if len(header) < 32 or header[:4] != _QCOW2_MAGIC:
        raise InvalidInput(f"{what} is not a qcow2 file (convert it with qemu-img convert -O qcow2)")
    version, backing_offset = struct.unpack(">IQ", header[4:16])
    # A backing file or external data file would let the guest read a host file.
    if backing_offset != 0:
        raise InvalidInput(f"{what} refers to a backing file; flatten it first")
    if version >= 3 and len(header) >= 80:
        (incompatible,) = struct.unpack(">Q", header[72:80])
        if incompatible & _QCOW2_EXTERNAL_DATA_FILE:
            raise InvalidInput(f"{what} uses an external data file")
    (virtual_size,) = struct.unpack(">Q", header[24:32])
    if virtual_size > size_gb * GiB:
        raise InvalidInput(f"{what} has a virtual size of {virtual_size} bytes, more than {size_gb} GiB")


def base_file_limit(size_gb: int) -> int:
    """The most bytes a base image's file of size_gb GiB may hold: its virtual size, the qcow2
    tables over it (about 2 % with the smallest clusters, 512 bytes) and room for the header.
    More is not a disk (internal snapshots, data past its end): refused when it is added, and
    a copy between hosts stops there, before it fills the head node's disk."""
    return size_gb * GiB + size_gb * GiB // 32 + 64 * 1024 * 1024


def open_image_source(source: str, size_gb: int) -> ImageSource:
    """Open a qcow2 file to become a base image and check it from that descriptor; InvalidInput
    if it cannot be read, is a symlink (O_NOFOLLOW) or not a regular file, or is unfit."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(source, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"image source {source} is a symbolic link; give the file itself") from None
        raise InvalidInput(f"cannot read image source {source}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"image source {source} is not a regular file")
        if st.st_size > base_file_limit(size_gb):
            raise InvalidInput(f"image source {source} is {st.st_size} bytes, more than a qcow2 file of "
                               f"{size_gb} GiB holds ({base_file_limit(size_gb)}); remove its snapshots "
                               "(qemu-img convert -O qcow2)")
        image = ImageSource(source, fd, st.st_size)
        try:
            header = image.read(0, 80)
        except OSError as e:
            raise InvalidInput(f"cannot read image source {source}: {e.strerror}") from None
        check_qcow2_header(header, size_gb, f"image source {source}")
        return image
    except BaseException:
        os.close(fd)
        raise
