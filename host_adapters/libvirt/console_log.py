"""The kept serial console of a libvirt domain: log files in a folder no libvirt pool
holds, read and removed through the host's files channel (host_adapters/files/host_files.py).

The domain's serial port logs to `<console folder>/<prefix>console-<id>.log` with
append='off'. QEMU's output goes through virtlogd (qemu.conf `stdio_handler =
"logd"`, the default): it starts the file afresh at every start of QEMU (removing
its rotated copies too) and rotates it at its `max_size`, keeping `max_backups`
copies `<name>.0` (the newest), `<name>.1`... (virtlogd.conf): so every kept file
is of the last run and the whole is bounded. A reset keeps QEMU, hence the file.

Why no pool. Every byte of these files is the guest's, and libvirt probes each file of a
pool as a disk image whenever it refreshes the pool (an admin's `pool-refresh`, its own
start of the pool, libvirtd's start): a qcow2-looking header makes libvirtd open, as root,
a backing path the guest chose (a FIFO there hangs the pool, and every request that touches
it). So the console folder is `<storage pool folder>-console` (mode 0700, root), which no
pool holds: the controller makes the folder, reads the end of its files and removes them
through the host's files channel (direct file access on this machine, ssh to another;
files/host_files_choice.py), which opens only regular files and parses nothing.

Before, the folder was the storage pool `<storage pool>-console`: forget_legacy_pool
undefines such a pool (its folder and files are kept, so the domains logging there go on)
when the adapter meets the host (a create, a check).

The functions take the connection, the pools, the channel and the names they need from the
adapter (driver.py).
"""

import logging
import posixpath
import xml.etree.ElementTree as ET

from common.errors import ControllerError, HostError
from host_adapters.guests.console import ConsoleMark, ConsoleOutput, start_of_tail
from host_adapters.files.host_files import HostFiles, check_folder
from host_adapters.libvirt.connection import _while_pool_busy

log = logging.getLogger(__name__)

SUFFIX = "-console"
# The rotated copies read and removed: virtlogd's default max_backups. A host whose virtlogd
# keeps more leaves the older copies in the console folder after a delete (docs/guests.md).
KEPT_COPIES = 3
# Pool types whose volumes are files in the pool's folder.
_FILE_POOLS = ("dir", "fs", "netfs")


def legacy_pool_name(storage_pool: str) -> str:
    """The console pool an earlier version made beside the storage pool."""
    return f"{storage_pool}{SUFFIX}"


def file_name(prefix: str, instance_id: str) -> str:
    return f"{prefix}console-{instance_id}.log"


def names(name: str) -> list[str]:
    """The file and its kept copies, oldest first."""
    return [*(f"{name}.{n}" for n in reversed(range(KEPT_COPIES))), name]


def _pool_folder(pool) -> str | None:
    root = ET.fromstring(pool.XMLDesc(0))
    folder = root.findtext("target/path")
    return folder if root.get("type") in _FILE_POOLS and folder else None


def folder_of(storage) -> str | None:
    """The console folder of the storage pool `storage` (a virStoragePool): its folder with
    SUFFIX appended; None where its volumes are no files of a folder (no console is kept)."""
    folder = _pool_folder(storage)
    if folder is None:
        return None
    folder = folder.rstrip("/")
    try:
        return check_folder(f"{folder}{SUFFIX}")
    except ControllerError:
        raise HostError(f"storage pool {storage.name()!r} has a folder the controller does not use: "
                        f"{folder!r}") from None


def forget_legacy_pool(conn, storage_pool: str, lv) -> bool:
    """Undefine the pool `<storage pool>-console` an earlier version made for the consoles:
    stopped (a dir pool's stop leaves its folder alone) and forgotten, never deleted, so its
    files stay where the domains' definitions name them. True when there was one."""
    try:
        pool = conn.storagePoolLookupByName(legacy_pool_name(storage_pool))
    except lv.libvirtError as e:
        if e.get_error_code() == lv.VIR_ERR_NO_STORAGE_POOL:
            return False
        raise
    folder = _pool_folder(pool)
    try:
        persistent = pool.isPersistent()  # a transient pool is gone once stopped
        if pool.isActive():
            pool.destroy()
        if persistent:
            pool.undefine()
    except lv.libvirtError as e:
        # Gone or stopped meanwhile (another process of the controller met it too).
        if e.get_error_code() not in (lv.VIR_ERR_NO_STORAGE_POOL, lv.VIR_ERR_OPERATION_INVALID):
            raise
    log.warning("undefined the libvirt storage pool %s (the serial consoles, folder %s; its files are kept): "
                "no guest-written file is kept in a storage pool any more", legacy_pool_name(storage_pool), folder)
    return True


def log_path(folder: str | None, prefix: str, instance_id: str) -> str | None:
    """Where the domain's serial port logs to: a file of the console folder, or None (no
    console is kept)."""
    return posixpath.join(folder, file_name(prefix, instance_id)) if folder else None


def read(files: HostFiles, folder: str | None, dom, *, name: str, max_bytes: int,
         since: ConsoleMark | None) -> ConsoleOutput:
    """The last max_bytes of the kept output (after `since` when it is of this run) of the
    domain `dom` (None: it has no domain), whose console file is `name` in `folder` (None: no
    console is kept), read through `files`."""
    run = str(dom.ID()) if dom is not None and dom.isActive() else None
    kept = names(name)
    sizes = files.sizes(folder, kept) if folder is not None else [None] * len(kept)
    present = [(each, size) for each, size in zip(kept, sizes) if size is not None]
    total = sum(size for _each, size in present)
    want = total - start_of_tail(total, max_bytes, since, run)
    parts = []
    for each, size in reversed(present):  # newest first, from the end
        if want <= 0:
            break
        take = min(want, size)
        if take:
            parts.append(files.read(folder, each, size - take, take))
        want -= take
    mark = ConsoleMark(run=run, size=total) if run is not None else None
    return ConsoleOutput(data=b"".join(reversed(parts)), mark=mark)


def remove(files: HostFiles, folder: str | None, name: str) -> None:
    """Delete the console file `name` and its kept copies from the console folder. Succeeds
    when they are gone."""
    if folder is not None:
        files.remove(folder, names(name))


def remove_legacy_volumes(storage, name: str, lv) -> None:
    """Delete the console files that instances defined before the console folder left in the
    storage pool, as the volumes libvirt knows there (no refresh)."""
    for each in names(name):
        try:
            vol = storage.storageVolLookupByName(each)
            _while_pool_busy(vol.delete, 0)
        except lv.libvirtError as e:
            if e.get_error_code() != lv.VIR_ERR_NO_STORAGE_VOL:
                raise
