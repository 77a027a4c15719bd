"""Quota backends for home volumes: the interface every backend implements, the
helpers they share (units, id and size checks, plain directory trees) and `NoQuota`.

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
- `get_usage(path, *, uid) -> int | None` and `get_usages([(path, uid), ...])`:
  the bytes the limit counts now, where the backend can tell cheaply
  (`reports_usage`: btrfs, xfs, setquota; not none or command).

Sizes: one "GB" is one GiB (2**30 bytes), the unit btrfs, xfs_quota and
setquota mean by a `G`/`g` suffix; limits are hard limits only, no soft limit
and no grace period.

The backends, one file each: `btrfs_quota.py`, `xfs_quota.py`, `setquota.py`;
`fake_quota.py` for tests. The config key `[volumes] quota_backend` maps to one
through `quota_backends.make_quota_backend`.
"""

import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from common.errors import Conflict, HostError, InvalidInput

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
    # Whether get_usage can tell what a home uses, from what the quota tool keeps anyway
    # (no walk of the tree): False where it never can (none, command).
    reports_usage = False

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

    def get_usage(self, path: str, *, uid: int) -> int | None:
        """The bytes the home's limit counts now (btrfs: the qgroup's referenced bytes; xfs:
        the project's; setquota: the uid's on the filesystem), or None when the backend
        cannot tell (reports_usage False) or has no record for it. Changes nothing."""
        return None

    def get_usages(self, homes: list[tuple[str, int]]) -> dict[str, int | None]:
        """get_usage of each (path, uid), keyed by path; a backend that can read them all
        at once (btrfs: one qgroup listing) does."""
        return {path: self.get_usage(path, uid=uid) for path, uid in homes}


# --- plain directories -----------------------------------------------------


@contextmanager
def host_errors(action: str) -> Iterator[None]:
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


def refuse_mounts_below(path: str) -> None:
    # A bind mount inside a home (a shared data set, say) must never be wiped with it.
    mounts = mounts_below(path)
    if mounts:
        raise HostError(f"refusing to remove {path}: mount points inside it: {', '.join(mounts)}")


def make_plain_home(path: str) -> None:
    """mkdir path, mode 0700, root-owned; Conflict if it exists."""
    with host_errors(f"create {path}"):
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # whatever the umask


def remove_tree(path: str) -> None:
    """Remove path and everything below it without following any symlink; succeed if gone."""
    with host_errors(f"remove {path}"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)  # a symlink goes, its target stays
            return
        refuse_mounts_below(path)
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


class KibQuotaRows:
    """get_limit and get_usage for a backend whose `_quota_row(uid)` reads (used, hard limit)
    in KiB, or None without a quota (setquota's and xfs_quota's reports)."""

    def _quota_row(self, uid: int) -> tuple[int, int] | None:
        raise NotImplementedError

    def get_limit(self, path: str, *, uid: int) -> int | None:
        row = self._quota_row(uid)
        return None if row is None else row[1] * KIB or None

    def get_usage(self, path: str, *, uid: int) -> int | None:
        row = self._quota_row(uid)
        return None if row is None else row[0] * KIB


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
