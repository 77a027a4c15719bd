"""The kept serial console of a libvirt domain: a log file in its storage pool's folder.

The domain's serial port logs to `<pool folder>/<prefix>console-<id>.log` with
append='off'. QEMU's output goes through virtlogd (qemu.conf `stdio_handler =
"logd"`, the default): it starts the file afresh at every start of QEMU (removing
its rotated copies too) and rotates it at its `max_size`, keeping `max_backups`
copies `<name>.0` (the newest), `<name>.1`... (virtlogd.conf): so every kept file
is of the last run and the whole is bounded. A reset keeps QEMU, hence the file.

The file is in the pool's folder so that the controller reads it as a storage
volume, over the connection, on any host (a remote host's files are out of its
reach otherwise): libvirt learns files others made at a pool refresh. The
functions take the connection, the pool and the names they need from the adapter
(host_adapters/libvirt_hypervisor.py).
"""

import posixpath
import xml.etree.ElementTree as ET

from common.errors import HostError
from host_adapters.console import ConsoleMark, ConsoleOutput, start_of_tail

# virtlogd keeps at most 32 rotated copies (its VIR_MAX_MAX_BACKUP).
MAX_BACKUPS = 32
# Pool types whose volumes are files in the pool's folder.
_FILE_POOLS = ("dir", "fs", "netfs")
_CHUNK = 256 * 1024


def file_name(prefix: str, instance_id: str) -> str:
    return f"{prefix}console-{instance_id}.log"


def log_path(pool, prefix: str, instance_id: str) -> str | None:
    """Where the domain's serial port logs to: a file in the pool's folder, or None for a pool
    whose volumes are no files of a folder (the console is then not kept)."""
    root = ET.fromstring(pool.XMLDesc(0))
    folder = root.findtext("target/path")
    if root.get("type") not in _FILE_POOLS or not folder:
        return None
    return posixpath.join(folder, file_name(prefix, instance_id))


def _lookup(pool, name: str, lv):
    try:
        return pool.storageVolLookupByName(name)
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def _kept_files(pool, name: str, lv) -> list:
    """The volumes of the kept files, oldest first: the rotated copies, then the file itself.
    The pool is refreshed first: virtlogd makes and renames these files, not libvirt."""
    pool.refresh(0)
    found = []
    current = _lookup(pool, name, lv)
    if current is None:
        return []
    for n in range(MAX_BACKUPS):
        backup = _lookup(pool, f"{name}.{n}", lv)
        if backup is None:
            break
        found.append(backup)
    return [*reversed(found), current]


def _size(vol, lv) -> int | None:
    try:
        return vol.info()[1]  # a raw file: its capacity is its length
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_VOL or e.get_error_domain() == lv.VIR_FROM_STORAGE:
            return None  # rotated away or removed since the refresh (the file cannot be opened)
        raise


def _download(conn, vol, offset: int, length: int) -> bytes:
    """`length` bytes of the volume from `offset`, or fewer when it ends first; never more
    (a host is not trusted to end the stream where asked)."""
    stream = conn.newStream(0)
    data = bytearray()
    try:
        vol.download(stream, offset, length, 0)
        while len(data) <= length:
            piece = stream.recv(min(_CHUNK, length - len(data) + 1))
            if not piece:
                break
            data += piece
        if len(data) > length:
            raise HostError(f"volume {vol.name()} streamed more than the {length} bytes asked for; stopped")
        stream.finish()
    except BaseException:
        try:
            stream.abort()
        except Exception:  # noqa: BLE001 - already failing; the first error is the one to raise
            pass
        raise
    return bytes(data)


def read(conn, pool, dom, *, name: str, max_bytes: int, since: ConsoleMark | None, lv) -> ConsoleOutput:
    """The last max_bytes of the kept output (after `since` when it is of this run) of the
    domain `dom` (None: it has no domain), whose console file is `name`."""
    run = str(dom.ID()) if dom is not None and dom.isActive() else None
    files = [(vol, size) for vol in _kept_files(pool, name, lv) if (size := _size(vol, lv)) is not None]
    total = sum(size for _vol, size in files)
    want = total - start_of_tail(total, max_bytes, since, run)
    parts = []
    for vol, size in reversed(files):  # newest first, from the end
        if want <= 0:
            break
        take = min(want, size)
        if take:
            parts.append(_download(conn, vol, size - take, take))
        want -= take
    mark = ConsoleMark(run=run, size=total) if run is not None else None
    return ConsoleOutput(data=b"".join(reversed(parts)), mark=mark)


def remove(pool, name: str, lv) -> None:
    """Delete the console file `name` and its rotated copies. Succeeds when they are gone."""
    for vol in _kept_files(pool, name, lv):
        try:
            vol.delete(0)
        except lv.libvirtError as e:
            if e.get_error_code() != lv.VIR_ERR_NO_STORAGE_VOL:
                raise
