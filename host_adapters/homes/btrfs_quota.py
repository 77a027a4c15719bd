"""`quota_backend = btrfs`: each home a subvolume whose qgroup carries the limit.

The subvolumes nested in a home are found and opened through the kernel's own
trees (ioctls), never by parsing a path a user named.
"""

import errno
import fcntl
import os
import re
import stat
import struct

from common.errors import CommandError, Conflict, HostError, HostUnavailable
from host_adapters import subp
from host_adapters.homes.quota import (QuotaBackend, check_id, check_size_gb, host_errors, refuse_mounts_below,
                                       remove_tree)

# Every subvolume's root directory has this inode number (BTRFS_FIRST_FREE_OBJECTID).
_SUBVOL_ROOT_INO = 256
# ioctls from linux/btrfs.h: INO_LOOKUP _IOWR(0x94, 18, 4096 bytes), SUBVOL_GETFLAGS
# _IOR(0x94, 25, u64), SUBVOL_SETFLAGS _IOW(0x94, 26, u64), GET_SUBVOL_ROOTREF
# _IOWR(0x94, 61, 4096 bytes), INO_LOOKUP_USER _IOWR(0x94, 62, 4096 bytes).
# They answer from the kernel's own trees, so no user-chosen name is ever parsed.
_IOC_INO_LOOKUP = 0xD0009412
_IOC_SUBVOL_GETFLAGS = 0x80089419
_IOC_SUBVOL_SETFLAGS = 0x4008941A
_IOC_GET_SUBVOL_ROOTREF = 0xD000943D
_IOC_INO_LOOKUP_USER = 0xD000943E
_SUBVOL_RDONLY = 1 << 1
_ROOTREF_SLOTS = 255
_VOL_NAME_MAX = 255

_QGROUP_ROW = re.compile(r"^(\d+/\d+)\s+(\d+)\s+(\d+)\s+(\d+|none)\s+(\d+|none)(?:\s|$)")


def _open_dir(path: str, *, dir_fd: int | None = None) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _subvol_id(fd: int) -> int:
    """The id of the subvolume holding the open directory fd."""
    args = bytearray(struct.pack("=QQ4080s", 0, _SUBVOL_ROOT_INO, b""))
    fcntl.ioctl(fd, _IOC_INO_LOOKUP, args)
    return struct.unpack_from("=Q", args)[0]


def _clear_readonly(fd: int) -> None:
    # A user may flag their own subvolumes read-only; nothing below a read-only
    # subvolume can then be deleted.
    flags = struct.unpack("=Q", fcntl.ioctl(fd, _IOC_SUBVOL_GETFLAGS, bytes(8)))[0]
    if flags & _SUBVOL_RDONLY:
        fcntl.ioctl(fd, _IOC_SUBVOL_SETFLAGS, struct.pack("=Q", flags & ~_SUBVOL_RDONLY))


def _child_subvolumes(fd: int) -> list[tuple[int, int]]:
    """(subvolume id, inode of the directory holding it) for each subvolume directly inside fd's."""
    found: list[tuple[int, int]] = []
    min_treeid = 0
    while True:
        args = bytearray(4096)
        struct.pack_into("=Q", args, 0, min_treeid)
        more = False
        try:
            fcntl.ioctl(fd, _IOC_GET_SUBVOL_ROOTREF, args)
        except OSError as e:
            if e.errno != errno.EOVERFLOW:  # more than one buffer's worth: ask again
                raise
            more = True
        count = args[8 + 16 * _ROOTREF_SLOTS]
        found.extend(struct.unpack_from("=QQ", args, 8 + 16 * i) for i in range(count))
        if not more:
            return found
        min_treeid = struct.unpack_from("=Q", args, 0)[0]


def _child_path(fd: int, sid: int, dirid: int) -> str:
    """Where subvolume sid sits, relative to the root of fd's subvolume."""
    args = bytearray(4096)
    struct.pack_into("=QQ", args, 0, dirid, sid)
    fcntl.ioctl(fd, _IOC_INO_LOOKUP_USER, args)
    name = bytes(args[16 : 16 + _VOL_NAME_MAX + 1]).split(b"\0", 1)[0]
    dirpath = bytes(args[16 + _VOL_NAME_MAX + 1 :]).split(b"\0", 1)[0]  # "" or "a/b/"
    return os.fsdecode(dirpath + name)


def _open_beneath(root_fd: int, relpath: str) -> int | None:
    """Open relpath below root_fd one component at a time, never through a symlink or '..'."""
    fd = os.dup(root_fd)
    try:
        for part in relpath.split("/"):
            if part in ("", ".", ".."):
                return None
            try:
                child = _open_dir(part, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = child
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def parse_qgroup_rows(text: str) -> dict[str, tuple[int, int | None]]:
    """`btrfs qgroup show -re --raw` -> {qgroupid: (referenced bytes, max referenced bytes or None)}.

    The last column holds subvolume paths, which users name: a path with a
    newline could forge a row, so a qgroup id seen twice is an error.
    """
    table: dict[str, tuple[int, int | None]] = {}
    for line in text.splitlines():
        m = _QGROUP_ROW.match(line)
        if not m:
            continue
        qgroupid, referenced, limit = m.group(1), m.group(2), m.group(4)
        if qgroupid in table:
            raise HostError(f"ambiguous btrfs qgroup listing: {qgroupid} appears twice")
        table[qgroupid] = (int(referenced), None if limit == "none" else int(limit))
    return table


def parse_qgroups(text: str) -> dict[str, int | None]:
    """`btrfs qgroup show -re --raw` -> {qgroupid: max referenced bytes or None}."""
    return {qgroupid: limit for qgroupid, (_used, limit) in parse_qgroup_rows(text).items()}


class BtrfsQuota(QuotaBackend):
    """Each home is a btrfs subvolume whose qgroup carries a referenced-bytes limit.

    Quotas are enabled on the filesystem the first time a limit is set.
    Removal deletes nested subvolumes a user made (clearing read-only flags
    first), the home subvolume, waits until the kernel has dropped them and
    destroys their qgroups, so no stale qgroup remains.

    Known limit of btrfs qgroups: data in a subvolume a user nests inside their
    home is counted in that subvolume's own qgroup, not the home's;
    `nested_subvolumes` lists such subvolumes so reconcile can report them.
    """

    name = "btrfs"
    reports_usage = True

    def __init__(self, *, sync_timeout: float = 600):
        self.sync_timeout = sync_timeout

    def check(self, home_root: str) -> None:
        try:
            subp.run(["btrfs", "filesystem", "df", home_root])
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"home_root {home_root} is not on a usable btrfs filesystem: {e}") from e

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        if os.path.lexists(path):
            raise Conflict(f"cannot create {path}: it already exists")
        subp.run(["btrfs", "subvolume", "create", path])
        try:
            with host_errors(f"set the mode of {path}"):
                os.chmod(path, 0o700)
        except BaseException:
            self.remove(path, uid=uid)
            raise

    def _open_subvolume(self, path: str) -> int:
        with host_errors(f"open {path}"):
            fd = _open_dir(path)
        if os.fstat(fd).st_ino != _SUBVOL_ROOT_INO:
            os.close(fd)
            raise HostError(f"{path} is not a btrfs subvolume, so no qgroup limit can apply to it alone")
        return fd

    def _subvolume_id(self, path: str) -> int:
        fd = self._open_subvolume(path)
        try:
            with host_errors(f"read the subvolume id of {path}"):
                return _subvol_id(fd)
        finally:
            os.close(fd)

    def _qgroup_rows(self, path: str) -> dict[str, tuple[int, int | None]] | None:
        """The qgroup rows of the filesystem holding path, or None while quotas are disabled."""
        argv = ["btrfs", "qgroup", "show", "-re", "--raw", path]
        proc = subp.run(argv, ok_codes=(0, 1))
        if proc.returncode == 1:
            if "not enabled" in proc.stderr:
                return None
            raise CommandError(argv, proc.returncode, proc.stderr)
        return parse_qgroup_rows(proc.stdout)

    def _qgroups(self, path: str) -> dict[str, int | None] | None:
        """The qgroup limits of the filesystem holding path, or None while quotas are disabled."""
        rows = self._qgroup_rows(path)
        return None if rows is None else {qgroupid: limit for qgroupid, (_used, limit) in rows.items()}

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        check_id("uid", uid)
        check_size_gb(size_gb)
        sid = self._subvolume_id(path)
        if self._qgroups(path) is None:
            subp.run(["btrfs", "quota", "enable", path])
        subp.run(["btrfs", "qgroup", "limit", f"{size_gb}G", f"0/{sid}", path])

    def get_limit(self, path: str, *, uid: int) -> int | None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_ino != _SUBVOL_ROOT_INO:
            return None  # no qgroup of its own
        sid = self._subvolume_id(path)
        table = self._qgroups(path)
        return None if table is None else table.get(f"0/{sid}")

    def _home_qgroup(self, path: str) -> str | None:
        """`0/<id>` of the subvolume at path; None when nothing is there or it is no subvolume."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_ino != _SUBVOL_ROOT_INO:
            return None
        return f"0/{self._subvolume_id(path)}"

    def get_usage(self, path: str, *, uid: int) -> int | None:
        return self.get_usages([(path, uid)])[path]

    def get_usages(self, homes: list[tuple[str, int]]) -> dict[str, int | None]:
        # One listing of the filesystem's qgroups serves every home: reading it per home
        # would read the whole table once for each.
        qgroups = {path: self._home_qgroup(path) for path, uid in homes if check_id("uid", uid) is not None}
        rows = None
        if any(q is not None for q in qgroups.values()):
            first = next(path for path, q in qgroups.items() if q is not None)
            rows = self._qgroup_rows(first)
        found: dict[str, int | None] = {}
        for path, qgroupid in qgroups.items():
            row = None if rows is None or qgroupid is None else rows.get(qgroupid)
            found[path] = None if row is None else row[0]
        return found

    def remove(self, path: str, *, uid: int | None) -> None:
        # A qgroup belongs to the subvolume, not to a uid: whoever owns the tree, only
        # its own qgroup (and those of subvolumes nested in it) go.
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or st.st_ino != _SUBVOL_ROOT_INO:
            remove_tree(path)  # not a subvolume: made before this backend was configured
            return
        refuse_mounts_below(path)
        parent = os.path.dirname(os.path.abspath(path))
        home_fd = self._open_subvolume(path)
        try:
            with host_errors(f"prepare {path} for deletion"):
                home_id = _subvol_id(home_fd)
                _clear_readonly(home_fd)
                nested = [sid for sid, _rel in self._nested_subvolumes(path, home_fd, clear_readonly=True)]
        finally:
            os.close(home_fd)
        # Deepest first: btrfs refuses to delete a subvolume that still holds others.
        for sid in reversed(nested):
            subp.run(["btrfs", "subvolume", "delete", "--subvolid", str(sid), path])
        subp.run(["btrfs", "subvolume", "delete", path])
        gone = [home_id, *nested]
        # The cleaner drops deleted subvolumes after a commit; their qgroups can
        # only be destroyed once that is done.
        subp.run(["btrfs", "filesystem", "sync", parent])
        subp.run(["btrfs", "subvolume", "sync", parent, *map(str, gone)], timeout=self.sync_timeout)
        self._destroy_qgroups(parent, gone)

    def nested_subvolumes(self, path: str) -> tuple[str, ...]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return ()
        if not stat.S_ISDIR(st.st_mode) or st.st_ino != _SUBVOL_ROOT_INO:
            return ()
        fd = self._open_subvolume(path)
        try:
            with host_errors(f"list the subvolumes nested in {path}"):
                return tuple(rel for _sid, rel in self._nested_subvolumes(path, fd, clear_readonly=False))
        finally:
            os.close(fd)

    def _nested_subvolumes(
        self, path: str, fd: int, *, clear_readonly: bool, prefix: str = ""
    ) -> list[tuple[int, str]]:
        """(id, path relative to the top) of the subvolumes below fd's, parents before children.

        Each is found through the kernel's root refs and opened below its
        parent one directory at a time, never through a symlink, and must have
        the id it was found under, so a user renaming things meanwhile can make
        this fail but never point it elsewhere. With clear_readonly, each one's
        read-only flag is cleared on the way (deletion needs that).
        """
        order: list[tuple[int, str]] = []
        for sid, dirid in _child_subvolumes(fd):
            rel = _child_path(fd, sid, dirid)
            child = _open_beneath(fd, rel)
            if child is None:
                raise HostError(f"cannot open the subvolume {sid} nested in {path}; it moved, try again")
            try:
                if os.fstat(child).st_ino != _SUBVOL_ROOT_INO or _subvol_id(child) != sid:
                    raise HostError(f"the subvolume {sid} nested in {path} moved; try again")
                if clear_readonly:
                    _clear_readonly(child)
                order.append((sid, prefix + rel))
                order.extend(
                    self._nested_subvolumes(
                        os.path.join(path, rel), child, clear_readonly=clear_readonly, prefix=f"{prefix}{rel}/"
                    )
                )
            finally:
                os.close(child)
        return order

    def _destroy_qgroups(self, path: str, ids: list[int]) -> None:
        table = self._qgroups(path)
        if table is None:
            return
        present = [f"0/{sid}" for sid in ids if f"0/{sid}" in table]
        if present:
            # Commit what the cleaner dropped, so the qgroups count nothing any more.
            subp.run(["btrfs", "filesystem", "sync", path])
        for qgroupid in present:
            # Newer kernels drop a deleted subvolume's qgroup themselves and may
            # win the race: a missing qgroup is fine, the check below decides.
            subp.run(["btrfs", "qgroup", "destroy", qgroupid, path], ok_codes=(0, 1))
        if present:
            table = self._qgroups(path) or {}
            stale = [q for q in present if q in table]
            if stale:
                raise HostError(f"btrfs qgroups {', '.join(stale)} remain after their subvolumes went")
