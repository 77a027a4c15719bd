"""The kept serial console of a libvirt domain: log files in a storage pool of their own,
which libvirt is never asked to refresh.

The domain's serial port logs to `<console folder>/<prefix>console-<id>.log` with
append='off'. QEMU's output goes through virtlogd (qemu.conf `stdio_handler =
"logd"`, the default): it starts the file afresh at every start of QEMU (removing
its rotated copies too) and rotates it at its `max_size`, keeping `max_backups`
copies `<name>.0` (the newest), `<name>.1`... (virtlogd.conf): so every kept file
is of the last run and the whole is bounded. A reset keeps QEMU, hence the file.

Why a pool of its own, and no refresh. Every byte of these files is the guest's, and
libvirt probes each file of a pool as a disk image when it refreshes the pool: a
qcow2-looking header makes libvirtd open, as root, a backing path the guest chose (a
FIFO there hangs the pool, and every request that touches it). So no console file is
in the instances' storage pool (whose refreshes, libvirt's own after an upload
included, see only images the controller made), and the console pool (POOL_SUFFIX) is
never refreshed by the controller: the file and its copies are volumes the controller
creates, empty and raw, before the domain is defined (libvirt knows them from then, by
path; virtlogd writes, rotates and starts them anew under the same paths), and a read
is a bounded virStorageVolDownload of a known volume, which opens the file and streams
its bytes without parsing them (the size of a raw volume is the file's length). The
volumes are the one channel the controller has to a remote host's files, and they
work the same over qemu+ssh:// and qemu+tls://.

The pool is `<storage pool>-console`: an existing pool of that name is used as it is
(an admin may define it on any folder); else the adapter makes it, of type dir, at the
storage pool's folder with `-console` appended, mode 0700 owned by root, persistent
and autostarted when the storage pool is (libvirt refreshes a pool when it starts it:
made empty, and started again only by libvirtd's own start; docs/threat-model.md).

The functions take the connection, the pools and the names they need from the adapter
(driver.py).
"""

import posixpath
import threading
import xml.etree.ElementTree as ET

from common.errors import HostError, HostUnavailable
from host_adapters.console import ConsoleMark, ConsoleOutput, start_of_tail
from host_adapters.libvirt.connection import _while_pool_busy

POOL_SUFFIX = "-console"
# The rotated copies kept as volumes: virtlogd's default max_backups. A host whose virtlogd
# keeps more leaves the older copies in the console folder after a delete (docs/guests.md).
KEPT_COPIES = 3
# Pool types whose volumes are files in the pool's folder.
_FILE_POOLS = ("dir", "fs", "netfs")
_CHUNK = 256 * 1024
_making = threading.Lock()  # one process makes a host's console pool once


def pool_name(storage_pool: str) -> str:
    return f"{storage_pool}{POOL_SUFFIX}"


def file_name(prefix: str, instance_id: str) -> str:
    return f"{prefix}console-{instance_id}.log"


def _names(name: str) -> list[str]:
    """The file and its kept copies, oldest first."""
    return [*(f"{name}.{n}" for n in reversed(range(KEPT_COPIES))), name]


def _folder(pool) -> str | None:
    root = ET.fromstring(pool.XMLDesc(0))
    folder = root.findtext("target/path")
    return folder if root.get("type") in _FILE_POOLS and folder else None


def find_pool(conn, storage_pool: str, lv):
    """The active console pool of the storage pool, or None (no console is kept then)."""
    try:
        pool = conn.storagePoolLookupByName(pool_name(storage_pool))
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_POOL:
            return None
        raise
    return pool if pool.isActive() else None


def ensure_pool(conn, storage, lv):
    """The console pool of the storage pool `storage` (an active virStoragePool), made when
    missing; None where the storage pool's volumes are no files of a folder."""
    name = pool_name(storage.name())
    with _making:
        try:
            pool = conn.storagePoolLookupByName(name)
        except lv.libvirtError as e:
            if e.get_error_code() != lv.VIR_ERR_NO_STORAGE_POOL:
                raise
            pool = None
        if pool is None:
            folder = _folder(storage)
            if folder is None:
                return None
            xml = (f"<pool type='dir'><name>{name}</name><target><path>{folder.rstrip('/')}{POOL_SUFFIX}</path>"
                   "<permissions><mode>0700</mode><owner>0</owner><group>0</group></permissions>"
                   "</target></pool>")
            try:
                if storage.isPersistent():
                    pool = conn.storagePoolDefineXML(xml, 0)
                    pool.build(0)
                    pool.setAutostart(1)
                    pool.create(0)  # its folder was just made: the start's refresh finds nothing
                else:
                    pool = conn.storagePoolCreateXML(xml, lv.VIR_STORAGE_POOL_CREATE_WITH_BUILD)
            except lv.libvirtError:
                pool = conn.storagePoolLookupByName(name)  # another process made it meanwhile, or raises
        if not pool.isActive():
            # Starting it would make libvirt probe the guests' files: libvirtd's own start does
            # that, or the admin after looking (`virsh pool-start`).
            raise HostUnavailable(f"libvirt storage pool {name!r} (the serial consoles) is not active")
        return pool


def log_path(pool, prefix: str, instance_id: str) -> str | None:
    """Where the domain's serial port logs to: a file in the console pool's folder, or None
    (no console pool: the console is then not kept)."""
    folder = _folder(pool) if pool is not None else None
    return posixpath.join(folder, file_name(prefix, instance_id)) if folder else None


def _lookup(pool, name: str, lv):
    try:
        return pool.storageVolLookupByName(name)
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def make_files(pool, name: str, lv) -> None:
    """The file `name` and its kept copies as empty raw volumes of the console pool: libvirt
    knows them from now on without a refresh. Those it knows already are kept."""
    for each in _names(name):
        if _lookup(pool, each, lv) is None:
            xml = (f"<volume><name>{each}</name><capacity>0</capacity>"
                   "<target><format type='raw'/><permissions><mode>0600</mode></permissions></target></volume>")
            _while_pool_busy(pool.createXML, xml, 0)


def _kept_files(pool, name: str, lv) -> list:
    """The volumes of the kept files libvirt knows, oldest first. No refresh: the controller
    made them (make_files)."""
    return [vol for vol in (_lookup(pool, each, lv) for each in _names(name)) if vol is not None]


def _size(vol, lv) -> int | None:
    try:
        return vol.info()[1]  # a raw volume: its capacity is the file's length, nothing parsed
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_VOL or e.get_error_domain() == lv.VIR_FROM_STORAGE:
            return None  # not there now (virtlogd removed the copies at the start of QEMU)
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
    domain `dom` (None: it has no domain), whose console file is `name` in the console pool
    `pool` (None: no console is kept)."""
    run = str(dom.ID()) if dom is not None and dom.isActive() else None
    kept = _kept_files(pool, name, lv) if pool is not None else []
    files = [(vol, size) for vol in kept if (size := _size(vol, lv)) is not None]
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


def remove(pools, name: str, lv) -> None:
    """Delete the console file `name` and its kept copies from each of `pools` (the console
    pool; and the storage pool, where instances made before the console pool logged).
    Succeeds when they are gone."""
    for pool in pools:
        if pool is None:
            continue
        for vol in _kept_files(pool, name, lv):
            try:
                _while_pool_busy(vol.delete, 0)
            except lv.libvirtError as e:
                if e.get_error_code() != lv.VIR_ERR_NO_STORAGE_VOL:
                    raise
