"""Writing and reading the content of libvirt storage volumes.

Real drivers move bytes with libvirt streams (virStorageVolUpload/Download),
which work the same over a remote connection. The test driver has no streams,
also behind a daemon: InProcessVolumeIO keeps small contents (seeds) for the
life of the process, which is as long as the test driver keeps its volumes
anyway (behind a daemon: as long as the server is its client).
"""

import hashlib
import os
import tempfile
import threading
import zlib
from contextlib import contextmanager

from common.errors import HostError
from host_adapters.hypervisor import Progress
from host_adapters.images.image_source import ImageSource
from host_adapters.libvirt.connection import _while_pool_busy


class VolumeIO:
    """How volume content is written and read. `keeps_content` is False where the
    content of a large upload (a base image) cannot be stored."""

    keeps_content = True

    def write(self, conn, vol, data: bytes, *, pad_to: int = 0) -> None:
        """Overwrite the volume from offset 0 with data (no longer than its capacity),
        followed by zeros up to pad_to bytes."""
        raise NotImplementedError

    def read(self, conn, vol, *, limit: int) -> bytes:
        """The volume's content (of its capacity). HostError, before anything is read, when
        its capacity is over limit bytes: what a volume declares is not trusted to fit in memory."""
        raise NotImplementedError

    def upload_file(self, conn, vol, source: ImageSource, progress: Progress | None) -> None:
        """Write the content of the opened source (its `size` bytes, read from its own
        descriptor, never from its path), calling progress(sent, size)."""
        raise NotImplementedError

    def read_head(self, conn, vol, nbytes: int) -> bytes:
        """The first nbytes of the volume (fewer if it is shorter); b"" where content is not kept."""
        raise NotImplementedError

    def download_file(self, conn, vol, dest: int, progress: Progress | None, *, limit: int) -> None:
        """Write the volume's content (its allocation as libvirt streams it) to the file
        descriptor dest, calling progress(received, capacity). HostError when the volume
        declares, or the stream brings, more than limit bytes: a host is not trusted to end
        the stream, and the file fills a disk of the head node."""
        raise NotImplementedError

    def digest(self, conn, vol) -> str:
        """The SHA-256 of the volume's whole content as libvirt streams it (read back to
        check an upload); only where content is kept."""
        raise NotImplementedError


class StreamVolumeIO(VolumeIO):
    def write(self, conn, vol, data: bytes, *, pad_to: int = 0) -> None:
        view = memoryview(data)
        total = max(len(data), pad_to)
        sent = 0

        def chunk(_stream, nbytes, _opaque):
            nonlocal sent
            piece = bytes(view[sent : sent + nbytes])
            if len(piece) < nbytes and sent + len(piece) < total:
                piece += bytes(min(nbytes - len(piece), total - sent - len(piece)))
            sent += len(piece)
            return piece

        self._send(conn, vol, total, chunk)

    def upload_file(self, conn, vol, source: ImageSource, progress: Progress | None) -> None:
        size = source.size
        sent = 0

        def chunk(_stream, nbytes, _opaque):
            nonlocal sent
            data = source.read(sent, min(nbytes, size - sent))
            sent += len(data)
            if progress is not None and data:
                progress(sent, size)
            return data

        self._send(conn, vol, size, chunk)

    def read_head(self, conn, vol, nbytes: int) -> bytes:
        return self._receive(conn, vol, min(nbytes, vol.info()[1]))

    def read(self, conn, vol, *, limit: int) -> bytes:
        return self._receive(conn, vol, _within(vol.name(), vol.info()[1], limit, "declares"))

    def download_file(self, conn, vol, dest: int, progress: Progress | None, *, limit: int) -> None:
        # The file's allocation (a qcow2 volume's capacity is its virtual size), for progress
        # only: a filesystem may count blocks it preallocated, so what counts is what arrives.
        total = vol.info()[2]
        received = 0

        def sink(_stream, data, _opaque):
            nonlocal received
            _within(vol.name(), received + len(data), limit, "streamed")
            view = memoryview(data)
            while view:
                view = view[os.write(dest, view):]
            received += len(data)
            if progress is not None:
                progress(received, max(total, received))
            return len(data)

        with _stream(conn) as stream:
            vol.download(stream, 0, 0, 0)
            stream.recvAll(sink, None)

    def digest(self, conn, vol) -> str:
        sha = hashlib.sha256()

        def sink(_stream, data, _opaque):
            sha.update(data)
            return len(data)

        with _stream(conn) as stream:
            vol.download(stream, 0, 0, 0)
            stream.recvAll(sink, None)
        return sha.hexdigest()

    @staticmethod
    def _send(conn, vol, size: int, chunk) -> None:
        with _stream(conn) as stream:
            _while_pool_busy(vol.upload, stream, 0, size, 0)
            stream.sendAll(chunk, None)

    @staticmethod
    def _receive(conn, vol, length: int) -> bytes:
        parts: list[bytes] = []
        received = 0

        def sink(_stream, data, _opaque):
            nonlocal received
            received += len(data)
            _within(vol.name(), received, length, "streamed")  # libvirt asked for length bytes, no more
            parts.append(data)
            return len(data)

        with _stream(conn) as stream:
            vol.download(stream, 0, length, 0)
            stream.recvAll(sink, None)
        return b"".join(parts)


def _within(volume: str, size: int, limit: int, what: str) -> int:
    """size, or HostError naming the volume when it is over limit bytes."""
    if size > limit:
        raise HostError(f"volume {volume} {what} {size} bytes, more than the {limit} bytes taken from it; "
                        "stopped")
    return size


@contextmanager
def _stream(conn):
    """A libvirt stream, finished when the block ends and aborted when it fails."""
    import libvirt

    stream = conn.newStream(0)
    try:
        yield stream
        stream.finish()
    except BaseException:
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass
        raise


class InProcessVolumeIO(VolumeIO):
    """For libvirt's test driver: contents kept by this process, keyed by volume path.

    Uploaded base images are not kept (keeps_content False): the sandbox
    boots no real guest, so a checked source stands in as a blank disk.
    Contents are kept zlib-compressed without their zero padding: a sandbox
    with 10,000 instances holds 10,000 seeds of 4 MiB each (about 3 KB so).
    They are written to an unlinked temporary file, not kept in memory: on a
    host volume contents are files, not the controller's memory (10,000 seeds
    held as bytes were 34 MB of the server's), and the file goes with the
    process, as the test driver's volumes do. Only their places stay in memory.
    """

    keeps_content = False

    def __init__(self):
        self._file = tempfile.TemporaryFile(prefix="cc-volume-contents-")
        # path -> (offset in the file, compressed length, length with padding)
        self._where: dict[str, tuple[int, int, int]] = {}
        self._end = 0
        self._lock = threading.Lock()

    def write(self, conn, vol, data: bytes, *, pad_to: int = 0) -> None:
        packed = zlib.compress(data, 1)
        path = vol.path()
        with self._lock:
            old = self._where.get(path)
            if old is not None and old[1] >= len(packed):
                offset = old[0]  # a rewrite that fits reuses its place
            else:
                offset, self._end = self._end, self._end + len(packed)
            try:
                os.pwrite(self._file.fileno(), packed, offset)
            except OSError as e:  # e.g. a full temporary folder
                raise HostError(f"cannot keep the content of volume {path}: {e.strerror}") from None
            self._where[path] = (offset, len(packed), max(len(data), pad_to))

    def read(self, conn, vol, *, limit: int) -> bytes:
        return self._content(vol, limit)

    def _content(self, vol, limit: int | None) -> bytes:
        with self._lock:  # a rewrite may reuse the place: read it whole first
            where = self._where.get(vol.path())
            if where is not None and limit is not None:
                _within(vol.path(), where[2], limit, "declares")
            packed = None if where is None else os.pread(self._file.fileno(), where[1], where[0])
        if where is None:
            return b""
        return zlib.decompress(packed).ljust(where[2], b"\0")

    def upload_file(self, conn, vol, source: ImageSource, progress: Progress | None) -> None:
        if progress is not None:
            progress(source.size, source.size)

    def read_head(self, conn, vol, nbytes: int) -> bytes:
        return self._content(vol, None)[:nbytes]

    def download_file(self, conn, vol, dest: int, progress: Progress | None, *, limit: int) -> None:
        raise NotImplementedError("the test driver keeps no base image content")
