"""Quota backends for home volumes: the interface, `NoQuota`, `BtrfsQuota`,
`XfsQuota`, `SetQuota` and `FakeQuota`.

A backend owns the whole life of one home directory's storage, not only its
limit, because on btrfs the home must be born a subvolume (a qgroup limit
applies per subvolume) and must die as one. The calls, in the order
`homes.DirectoryHomeVolumes` makes them:

- `make_home(path, *, uid)`: create the empty directory (btrfs: subvolume),
  root-owned, mode 0700, and tie it to the uid's accounting (xfs: project).
- `set_limit(path, *, uid, size_gb)`: set or change the hard limit.
- `get_limit(path, *, uid) -> int | None`: the hard limit in bytes, None if none.
- `remove(path, *, uid)`: remove the tree without following symlinks out of
  it, then the quota. uid is the one recorded for the volume, never read from
  the tree (root in a guest can chown it); None leaves per-uid quotas as they are.
- `nested_subvolumes(path)`: subvolumes a user made inside the home (btrfs
  only), whose data the home's limit does not count.

Sizes: one "GB" is one GiB (2**30 bytes), the unit btrfs, xfs_quota and
setquota mean by a `G`/`g` suffix; limits are hard limits only, no soft limit
and no grace period.

The config key `[volumes] quota_backend` maps through `make_quota_backend`.
"""

import errno
import fcntl
import os
import re
import shutil
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from common.errors import CommandError, Conflict, HostError, HostUnavailable, InvalidInput
from host_adapters import subp

GIB = 1 << 30
KIB = 1 << 10
# Largest uid/gid/project id; 2**32 - 1 is the kernel's "no id".
MAX_ID = 4294967294


class QuotaBackend:
    """How one home directory is made, limited and removed. Docstrings are the contract."""

    name = "abstract"
    enforces_limits = True  # False only where no limit is ever applied
    # Whether the limit holds whoever writes in the home. Root in a guest writes through
    # the home's share as host uid 0: a limit on the tree (btrfs qgroup, xfs project)
    # counts that, a limit on the user's uid (setquota) does not.
    binds_every_writer = True

    def check(self, home_root: str) -> None:
        """Raise HostUnavailable, naming the cause, if homes under home_root cannot get quotas."""
        raise NotImplementedError

    def make_home(self, path: str, *, uid: int) -> None:
        """Create path as an empty directory owned by root, mode 0700, accounted to uid.

        Raises Conflict if path exists. All or nothing: on failure nothing is left at path.
        """
        raise NotImplementedError

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        """Set (or change) the hard limit of the home at path to size_gb GiB."""
        raise NotImplementedError

    def get_limit(self, path: str, *, uid: int) -> int | None:
        """The hard limit in bytes that applies to the home at path, or None if there is none."""
        raise NotImplementedError

    def remove(self, path: str, *, uid: int | None) -> None:
        """Remove the tree at path and its quota. Succeeds when both are already gone.

        uid is the uid recorded for the home (the tree's owner may be anyone by now);
        None when none was recorded: the tree goes, a per-uid quota stays as it is.

        Never follows a symlink out of the tree (a symlink is removed, not its
        target) and refuses (HostError) to remove a tree with a mount point in it.
        """
        raise NotImplementedError

    def nested_subvolumes(self, path: str) -> tuple[str, ...]:
        """Paths, relative to the home at path, of subvolumes inside it whose data escapes its limit.

        Parents come before their children. Changes nothing and follows no
        symlink. () when nothing is at path, when it is not a subvolume, and
        for every backend whose filesystem has no subvolumes (all but btrfs),
        which is why this one method has a working default.
        """
        return ()


# --- plain directories -----------------------------------------------------


@contextmanager
def _host_errors(action: str) -> Iterator[None]:
    """Turn an OSError into the HostError callers expect, saying what was being done."""
    try:
        yield
    except FileExistsError as e:
        raise Conflict(f"cannot {action}: {e.filename or 'path'} already exists") from e
    except OSError as e:
        raise HostError(f"cannot {action}: {e.strerror or e}") from e


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_below(path: str) -> list[str]:
    """Mount points at or below path (from /proc/self/mountinfo)."""
    path = os.path.abspath(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                point = _unescape_mountinfo(fields[4])
                if point == path or point.startswith(path.rstrip("/") + "/"):
                    found.append(point)
    return found


def _refuse_mounts_below(path: str) -> None:
    # A bind mount inside a home (a shared data set, say) must never be wiped with it.
    mounts = mounts_below(path)
    if mounts:
        raise HostError(f"refusing to remove {path}: mount points inside it: {', '.join(mounts)}")


def make_plain_home(path: str) -> None:
    """mkdir path, mode 0700, root-owned; Conflict if it exists."""
    with _host_errors(f"create {path}"):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask


def remove_tree(path: str) -> None:
    """Remove path and everything below it without following any symlink; succeed if gone."""
    with _host_errors(f"remove {path}"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)  # a symlink goes, its target stays
            return
        _refuse_mounts_below(path)
        if not shutil.rmtree.avoids_symlink_attacks:
            raise HostError(f"refusing to remove {path}: this platform has no symlink-safe rmtree")
        shutil.rmtree(path)


def find_mount_point(path: str) -> str:
    """The mount point of the filesystem holding path (or its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def check_id(what: str, value: object) -> int:
    """A uid or gid: an int from 0 to MAX_ID (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InvalidInput(f"invalid {what} {value!r}: must be an integer from 0 to {MAX_ID}")
    return value


def check_size_gb(size_gb: object) -> int:
    """A volume size: a whole number of GB (GiB), at least 1 (bool refused)."""
    if isinstance(size_gb, bool) or not isinstance(size_gb, int) or size_gb < 1:
        raise InvalidInput(f"invalid volume size {size_gb!r}: must be a whole number of GB, at least 1")
    return size_gb


class NoQuota(QuotaBackend):
    """Plain directories and no limit at all (sandboxes, or filesystems quota does not reach)."""

    name = "none"
    enforces_limits = False

    def check(self, home_root: str) -> None:
        """Nothing to check: without quotas any directory will do."""

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        make_plain_home(path)

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        """Validates the arguments and records nothing: this backend enforces no limit."""
        check_id("uid", uid)
        check_size_gb(size_gb)

    def get_limit(self, path: str, *, uid: int) -> int | None:
        return None

    def remove(self, path: str, *, uid: int | None) -> None:
        remove_tree(path)


class FakeQuota(NoQuota):
    """Real directories (so DirectoryHomeVolumes can run on a temp dir) with in-memory limits.

    `limits` maps path -> bytes; tests may set `nested` (path -> relative
    paths) to stand for nested subvolumes. Set `fail_on[method_name] =
    exception` to make that method raise it before changing anything.
    """

    name = "fake"
    enforces_limits = True

    def __init__(self):
        self.limits: dict[str, int] = {}
        self.nested: dict[str, tuple[str, ...]] = {}
        self.fail_on: dict[str, Exception] = {}

    def _maybe_fail(self, method: str) -> None:
        error = self.fail_on.get(method)
        if error is not None:
            raise error

    def check(self, home_root: str) -> None:
        self._maybe_fail("check")

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        self._maybe_fail("make_home")
        make_plain_home(path)

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        check_id("uid", uid)
        check_size_gb(size_gb)
        self._maybe_fail("set_limit")
        if not os.path.isdir(path):
            raise HostError(f"cannot set a quota on {path}: no such directory")
        self.limits[path] = size_gb * GIB

    def get_limit(self, path: str, *, uid: int) -> int | None:
        self._maybe_fail("get_limit")
        return self.limits.get(path)

    def remove(self, path: str, *, uid: int | None) -> None:
        self._maybe_fail("remove")
        remove_tree(path)
        self.limits.pop(path, None)
        self.nested.pop(path, None)

    def nested_subvolumes(self, path: str) -> tuple[str, ...]:
        self._maybe_fail("nested_subvolumes")
        return self.nested.get(path, ())


# --- btrfs -----------------------------------------------------------------

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


def parse_qgroups(text: str) -> dict[str, int | None]:
    """`btrfs qgroup show -re --raw` -> {qgroupid: max referenced bytes or None}.

    The last column holds subvolume paths, which users name: a path with a
    newline could forge a row, so a qgroup id seen twice is an error.
    """
    table: dict[str, int | None] = {}
    for line in text.splitlines():
        m = _QGROUP_ROW.match(line)
        if not m:
            continue
        qgroupid, limit = m.group(1), m.group(4)
        if qgroupid in table:
            raise HostError(f"ambiguous btrfs qgroup listing: {qgroupid} appears twice")
        table[qgroupid] = None if limit == "none" else int(limit)
    return table


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
            with _host_errors(f"set the mode of {path}"):
                os.chmod(path, 0o700)
        except BaseException:
            self.remove(path, uid=uid)
            raise

    def _open_subvolume(self, path: str) -> int:
        with _host_errors(f"open {path}"):
            fd = _open_dir(path)
        if os.fstat(fd).st_ino != _SUBVOL_ROOT_INO:
            os.close(fd)
            raise HostError(f"{path} is not a btrfs subvolume, so no qgroup limit can apply to it alone")
        return fd

    def _subvolume_id(self, path: str) -> int:
        fd = self._open_subvolume(path)
        try:
            with _host_errors(f"read the subvolume id of {path}"):
                return _subvol_id(fd)
        finally:
            os.close(fd)

    def _qgroups(self, path: str) -> dict[str, int | None] | None:
        """The qgroup table of the filesystem holding path, or None while quotas are disabled."""
        argv = ["btrfs", "qgroup", "show", "-re", "--raw", path]
        proc = subp.run(argv, ok_codes=(0, 1))
        if proc.returncode == 1:
            if "not enabled" in proc.stderr:
                return None
            raise CommandError(argv, proc.returncode, proc.stderr)
        return parse_qgroups(proc.stdout)

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
        _refuse_mounts_below(path)
        parent = os.path.dirname(os.path.abspath(path))
        home_fd = self._open_subvolume(path)
        try:
            with _host_errors(f"prepare {path} for deletion"):
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
            with _host_errors(f"list the subvolumes nested in {path}"):
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


# --- xfs project quota -----------------------------------------------------

# xfs_quota splits its -c command on whitespace itself; these would change its meaning.
_XFS_UNSAFE = re.compile(r"[\s'\"\\]")


class XfsQuota(QuotaBackend):
    """XFS project quota: each home is a project tree whose id is derived from the uid.

    `mount_point` is the XFS filesystem (mounted with prjquota) holding the
    homes; project id = uid + project_id_offset. xfs_quota reports many
    errors only on stderr with exit code 0, so any stderr output is a failure.
    """

    name = "xfs"

    def __init__(self, *, mount_point: str, project_id_offset: int = 0):
        self.mount_point = mount_point
        self.project_id_offset = project_id_offset

    def project_id(self, uid: int) -> int:
        pid = check_id("uid", uid) + self.project_id_offset
        if not 1 <= pid <= MAX_ID:
            raise InvalidInput(f"uid {uid} gives the unusable xfs project id {pid}")
        return pid

    def _xfs(self, command: str) -> str:
        argv = ["xfs_quota", "-x", "-c", command, self.mount_point]
        proc = subp.run(argv)
        if proc.stderr.strip():
            raise CommandError(argv, proc.returncode, proc.stderr)
        return proc.stdout

    def _check_path(self, path: str) -> None:
        if _XFS_UNSAFE.search(path):
            raise HostError(f"xfs_quota cannot be given the path {path!r} (whitespace or quotes)")
        if os.path.commonpath([self.mount_point, os.path.abspath(path)]) != self.mount_point:
            raise HostError(f"{path} is not on the xfs filesystem {self.mount_point}")

    def check(self, home_root: str) -> None:
        try:
            self._check_path(home_root)
            state = self._xfs("state -p")
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"xfs project quota unusable for {home_root}: {e}") from e
        if not re.search(r"Enforcement:\s*ON", state):
            raise HostUnavailable(f"project quota is not enforced on {self.mount_point} (mount with prjquota)")

    def make_home(self, path: str, *, uid: int) -> None:
        pid = self.project_id(uid)
        self._check_path(path)
        make_plain_home(path)
        try:
            self._xfs(f"project -s -p {path} {pid}")
        except BaseException:
            remove_tree(path)
            raise

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        check_size_gb(size_gb)
        self._xfs(f"limit -p bhard={size_gb}g {self.project_id(uid)}")

    def get_limit(self, path: str, *, uid: int) -> int | None:
        out = self._xfs(f"quota -p -N -n -v -b {self.project_id(uid)}")
        # device, used, soft, hard, ... in KiB; a long device name wraps the line.
        tokens = out.split()
        if len(tokens) < 4:
            return None
        try:
            hard = int(tokens[3])
        except ValueError:
            raise HostError(f"cannot read the xfs_quota output: {out.strip()!r}") from None
        return hard * KIB or None

    def remove(self, path: str, *, uid: int | None) -> None:
        pid = None if uid is None else self.project_id(uid)
        remove_tree(path)
        if pid is not None:
            self._xfs(f"limit -p bhard=0 {pid}")


# --- user quota (ext4 and others) ------------------------------------------


# What a uid gets on the filesystem once its home is removed (SetQuota.remove).
DENY_KIB = 1
DENY_INODES = 1


class SetQuota(QuotaBackend):
    """Classic user quota set with setquota on `filesystem` (its mount point).

    The limit is the uid's over the whole filesystem, so files the user owns
    elsewhere on it count too. After `remove` the uid keeps the smallest
    limits there are (DENY_KIB, DENY_INODES), never "unlimited".
    """

    name = "setquota"
    binds_every_writer = False  # files another uid writes (guest root: uid 0) count elsewhere

    def __init__(self, *, filesystem: str):
        self.filesystem = filesystem

    def check(self, home_root: str) -> None:
        try:
            proc = subp.run(["quotaon", "-p", "-u", self.filesystem], ok_codes=(0, 1))
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"user quota unusable on {self.filesystem}: {e}") from e
        # quotaon -p exits 1 when quota is on; the printed state decides.
        if not re.search(r"^user quota on .* is on$", proc.stdout, re.MULTILINE):
            raise HostUnavailable(f"user quota is off on {self.filesystem} (mount with usrquota, run quotaon)")
        if os.path.commonpath([self.filesystem, os.path.abspath(home_root)]) != self.filesystem:
            raise HostUnavailable(f"home_root {home_root} is not on {self.filesystem}")

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        make_plain_home(path)

    def _setquota(self, uid: int, hard_kib: int, hard_inodes: int = 0) -> None:
        # block-soft block-hard inode-soft inode-hard; 0 means "no limit".
        subp.run(["setquota", "-u", str(check_id("uid", uid)), "0", str(hard_kib), "0", str(hard_inodes),
                  self.filesystem])

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        self._setquota(uid, check_size_gb(size_gb) * GIB // KIB)

    def get_limit(self, path: str, *, uid: int) -> int | None:
        argv = ["quota", "-u", "-v", "-w", "-p", f"--filesystem={self.filesystem}", str(check_id("uid", uid))]
        # quota exits 1 when the user is over a limit.
        out = subp.run(argv, ok_codes=(0, 1)).stdout
        lines = [line.split() for line in out.splitlines() if line.strip()]
        rows = [row for header, row in zip(lines, lines[1:]) if header[0] == "Filesystem"]
        if not rows:
            return None  # "Disk quotas for user #N (uid N): none"
        # filesystem, blocks (a '*' when over), soft, hard, ... in KiB
        if len(rows[0]) < 4 or not rows[0][3].isdigit():
            raise HostError(f"cannot read the quota output: {out.strip()!r}")
        return int(rows[0][3]) * KIB or None

    def remove(self, path: str, *, uid: int | None) -> None:
        if uid is not None:
            check_id("uid", uid)
        remove_tree(path)
        if uid is None:
            return
        # Zero would mean "unlimited": the account outlives its volume, and a uid
        # without a home must not fill the filesystem from elsewhere on it (a
        # scratch or shared directory). The smallest limits setquota can express
        # (1 KiB, 1 inode) leave it nothing; a new volume sets its own limit.
        self._setquota(uid, DENY_KIB, DENY_INODES)


BACKEND_CLASSES: dict[str, type[QuotaBackend]] = {
    "none": NoQuota, "btrfs": BtrfsQuota, "xfs": XfsQuota, "setquota": SetQuota,
}
BACKENDS = tuple(BACKEND_CLASSES)


def guest_root_escapes(name: str) -> bool:
    """Whether root in a guest can write past the limits the backend `name` sets (setquota)."""
    cls = BACKEND_CLASSES[name]
    return cls.enforces_limits and not cls.binds_every_writer


def make_quota_backend(name: str, *, home_root: str) -> QuotaBackend:
    """The backend `[volumes] quota_backend = name` asks for, for homes under home_root."""
    if name == "none":
        return NoQuota()
    if name == "btrfs":
        return BtrfsQuota()
    if name == "xfs":
        return XfsQuota(mount_point=find_mount_point(home_root))
    if name == "setquota":
        return SetQuota(filesystem=find_mount_point(home_root))
    raise InvalidInput(f"unknown quota_backend {name!r}: must be one of {', '.join(BACKENDS)}")
