"""Home volumes: one directory per system account under a home root, with a hard quota.

`DirectoryHomeVolumes` makes `<home_root>/<username>` owned by the account's
uid and primary gid, mode 0700, and limits it through a quota backend
(the interface in host_adapters/homes/quota.py, one file per backend: none, btrfs,
xfs, setquota). `FakeHomeVolumes` keeps the same state in memory for fast tests. One GB is one GiB (2**30 bytes).
"""

import logging
import os
import re
import stat
from dataclasses import dataclass, field

from common.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.fail_on import FailOn
from host_adapters.names import check_username
from host_adapters.homes.quota import GIB, QuotaBackend, check_id, check_size_gb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HomeInfo:
    """What is on the host at a home's path, for reconcile.

    `limit_gb` is limit_bytes / GiB (so 2.0 == 2); `quota_expected` says whether
    the configured backend applies limits at all (False for quota_backend none).
    `nested_subvolumes` are paths, relative to the home, of subvolumes a user
    made inside it (btrfs only; () elsewhere): data there escapes the limit.
    """

    path: str
    exists: bool
    is_dir: bool = False
    uid: int | None = None
    gid: int | None = None
    mode: int | None = None  # permission bits, e.g. 0o700
    limit_bytes: int | None = None
    quota_expected: bool = False
    nested_subvolumes: tuple[str, ...] = ()
    limit_gb: float | None = field(init=False)

    def __post_init__(self):
        gb = None if self.limit_bytes is None else self.limit_bytes / GIB
        object.__setattr__(self, "limit_gb", gb)


RETIRED_PREFIX = ".retired-"
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# `.retired-<token>` or `.retired-<token>.<uid>`: the uid recorded for the volume rides in
# the name, which only root can change (home_root is root's, and no share reaches it),
# while the tree itself is the guest's to chown.
_RETIRED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(?:\.(0|[1-9][0-9]{0,9}))?$")


def retired_path(home_root: str, token: str, uid: int | None = None) -> str:
    """Where a home goes to be removed: a dot name, which no username can be, carrying the
    uid its quota is kept under (None: not known, the quota is then left as it is)."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise InvalidInput(f"invalid token {token!r}")
    name = RETIRED_PREFIX + token if uid is None else f"{RETIRED_PREFIX}{token}.{check_id('uid', uid)}"
    return os.path.join(home_root, name)


def check_retired(home_root: str, path: object) -> str:
    if (
        not isinstance(path, str)
        or os.path.dirname(path) != os.path.abspath(home_root)
        or not os.path.basename(path).startswith(RETIRED_PREFIX)
        or not _RETIRED_NAME.fullmatch(os.path.basename(path)[len(RETIRED_PREFIX):])
    ):
        raise InvalidInput(f"{path!r} is not a retired home under {home_root}")
    return path


def retired_uid(path: str) -> int | None:
    """The uid retired_path() recorded in a retired home's name; None if it recorded none."""
    m = _RETIRED_NAME.fullmatch(os.path.basename(path)[len(RETIRED_PREFIX):])
    if m is None or m.group(1) is None:
        return None
    return check_id("uid", int(m.group(1)))


class HomeVolumes:
    """Home directories with quotas. Docstrings state what must hold after each call."""

    home_root: str

    def check(self) -> None:
        """Raise HostUnavailable, naming the cause, if homes cannot be made.

        That is: home_root is missing or not writable, or the quota backend is unusable.
        """
        raise NotImplementedError

    def path(self, username: str) -> str:
        """`<home_root>/<username>`. Raises InvalidInput for a bad username, so it never leaves home_root."""
        return os.path.join(self.home_root, check_username(username))

    def create(self, username: str, *, uid: int, gid: int, size_gb: int) -> str:
        """Create the home owned by uid:gid, mode 0700, with a hard limit of size_gb GiB; return its path.

        Raises InvalidInput for a bad name, id or size, Conflict if the path
        exists. All or nothing: if any step fails (the quota too), nothing is
        left at the path.
        """
        raise NotImplementedError

    def resize(self, username: str, *, uid: int, size_gb: int) -> None:
        """Set the hard limit of an existing home to size_gb GiB. NotFound if there is no home."""
        raise NotImplementedError

    @property
    def reports_usage(self) -> bool:
        """Whether usage() can tell what a home uses (the quota backend keeps it: btrfs, xfs,
        setquota); False where it never can (quota backend none or command)."""
        raise NotImplementedError

    def usage(self, username: str, *, uid: int) -> int | None:
        """The bytes the home's limit counts now; None when reports_usage is False, there is
        no home, or the backend keeps no figure for it. Changes nothing."""
        raise NotImplementedError

    def usages(self, homes: list[tuple[str, int]]) -> dict[str, int | None]:
        """usage() of each (username, uid), keyed by username, read at once where the backend
        can (btrfs: one qgroup listing for every home)."""
        raise NotImplementedError

    def delete(self, username: str, *, uid: int) -> None:
        """Remove the home's whole tree and its quota. Succeeds when they are already gone.

        Never follows a symlink out of the tree, and refuses (HostError) while
        something is mounted inside it.
        """
        raise NotImplementedError

    def retire(self, username: str, *, token: str, uid: int | None) -> str | None:
        """Move the home out of the way in one atomic rename, to a path no username can take
        (`<home_root>/.retired-<token>.<uid>`), and return that path; None when there is no home.

        uid is the one recorded for the volume, whose quota purge() removes (never the
        tree's owner, which whoever had root in a guest could change); None when no uid
        was recorded. Its quota stays with it until purge(). The home's path is free at
        once, so a new volume can be made there while the old tree is removed in the background.
        """
        raise NotImplementedError

    def purge(self, path: str) -> None:
        """Remove a retired home (a path retire() returned) and the quota of the uid its name
        records (none when it records none). Succeeds when it is gone.

        InvalidInput for a path that is not a retired home of this home_root.
        """
        raise NotImplementedError

    def list_retired(self) -> list[str]:
        """Paths of retired homes not purged yet (a crash or a failure left them), sorted."""
        raise NotImplementedError

    def inspect(self, username: str) -> HomeInfo:
        """What is at the home's path now (exists False when nothing is).

        Changes nothing and follows no symlink; `nested_subvolumes` lists what
        the quota backend finds nested in the home.
        """
        raise NotImplementedError

    def repair_owner(self, username: str, *, uid: int, gid: int) -> None:
        """Make the home directory itself (not its content) owned by uid:gid, mode 0700.

        NotFound if there is no home; HostError if the path is not a directory.
        """
        raise NotImplementedError


class DirectoryHomeVolumes(HomeVolumes):
    """Real homes under `home_root`, made, limited and removed by `quota`."""

    def __init__(self, home_root: str, quota: QuotaBackend):
        self.home_root = os.path.abspath(home_root)
        self.quota = quota

    def check(self) -> None:
        root = self.home_root
        if not os.path.isdir(root):
            raise HostUnavailable(f"home_root {root} does not exist or is not a directory")
        if not os.access(root, os.W_OK | os.X_OK):
            raise HostUnavailable(f"home_root {root} is not writable")
        st = os.stat(root)
        if st.st_uid != 0 or st.st_mode & 0o022:
            # Homes are made and removed by path under it: a user who could write
            # there could swap a path for a symlink between our steps.
            raise HostUnavailable(f"home_root {root} must be owned by root and not writable by group or others")
        try:
            self.quota.check(root)
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(f"quota backend {self.quota.name} is unusable: {e.message}") from e

    def create(self, username: str, *, uid: int, gid: int, size_gb: int) -> str:
        path = self.path(username)
        check_id("uid", uid)
        check_id("gid", gid)
        check_size_gb(size_gb)
        if os.path.lexists(path):
            raise Conflict(f"home {path} already exists")
        self.quota.make_home(path, uid=uid)
        try:
            self._own(path, uid=uid, gid=gid)
            self.quota.set_limit(path, uid=uid, size_gb=size_gb)
        except BaseException as e:
            try:
                self.quota.remove(path, uid=uid)
            except Exception as cleanup:
                e.add_note(f"removing the half-made home {path} failed too: {cleanup}")
            raise
        return path

    @staticmethod
    def _own(path: str, *, uid: int, gid: int) -> None:
        try:
            # Through an fd opened without following symlinks, so only this directory changes.
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        except OSError as e:
            raise HostError(f"cannot set owner and mode of {path}: {e.strerror or e}") from e

    def resize(self, username: str, *, uid: int, size_gb: int) -> None:
        path = self.path(username)
        check_id("uid", uid)
        check_size_gb(size_gb)
        if os.path.islink(path) or not os.path.isdir(path):
            raise NotFound(f"no home volume at {path}")
        self.quota.set_limit(path, uid=uid, size_gb=size_gb)

    @property
    def reports_usage(self) -> bool:
        return self.quota.reports_usage

    def usage(self, username: str, *, uid: int) -> int | None:
        return self.usages([(username, uid)])[username]

    def usages(self, homes: list[tuple[str, int]]) -> dict[str, int | None]:
        paths = {username: self.path(username) for username, uid in homes if check_id("uid", uid) is not None}
        found: dict[str, int | None] = dict.fromkeys(paths)
        if not self.reports_usage:
            return found
        # Only real directories: never a symlink a user left at the path.
        present = [(paths[u], uid) for u, uid in homes if not os.path.islink(paths[u]) and os.path.isdir(paths[u])]
        used = self.quota.get_usages(present) if present else {}
        return {username: used.get(path) for username, path in paths.items()}

    def delete(self, username: str, *, uid: int) -> None:
        path = self.path(username)
        check_id("uid", uid)
        self.quota.remove(path, uid=uid)

    def retire(self, username: str, *, token: str, uid: int | None) -> str | None:
        path = self.path(username)
        target = retired_path(self.home_root, token, uid)
        try:
            os.rename(path, target)  # renames a symlink itself, never what it points to
        except FileNotFoundError:
            return None
        except OSError as e:
            raise HostError(f"cannot move {path} aside for deletion: {e.strerror or e}") from e
        return target

    def purge(self, path: str) -> None:
        check_retired(self.home_root, path)
        if not os.path.lexists(path):
            return
        # The uid recorded when it was retired, never the tree's owner: root in a guest
        # can chown the home, and removing "its" quota would then cut another uid's.
        uid = retired_uid(path)
        if uid is None:
            log.warning("%s records no uid (retired before uids were recorded): its tree is removed, "
                        "no quota is changed", path)
        self.quota.remove(path, uid=uid)

    def list_retired(self) -> list[str]:
        try:
            names = os.listdir(self.home_root)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(self.home_root, n) for n in names if n.startswith(RETIRED_PREFIX))

    def inspect(self, username: str) -> HomeInfo:
        path = self.path(username)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return HomeInfo(path=path, exists=False)
        except OSError as e:
            raise HostError(f"cannot inspect {path}: {e.strerror or e}") from e
        is_dir = stat.S_ISDIR(st.st_mode)
        limit = self.quota.get_limit(path, uid=st.st_uid) if is_dir else None
        nested = self.quota.nested_subvolumes(path) if is_dir else ()
        return HomeInfo(
            path=path,
            exists=True,
            is_dir=is_dir,
            uid=st.st_uid,
            gid=st.st_gid,
            mode=stat.S_IMODE(st.st_mode),
            limit_bytes=limit,
            quota_expected=self.quota.enforces_limits,
            nested_subvolumes=nested,
        )

    def repair_owner(self, username: str, *, uid: int, gid: int) -> None:
        path = self.path(username)
        check_id("uid", uid)
        check_id("gid", gid)
        if not os.path.lexists(path):
            raise NotFound(f"no home volume at {path}")
        self._own(path, uid=uid, gid=gid)


@dataclass
class FakeHome:
    uid: int
    gid: int
    size_gb: int
    mode: int = 0o700
    nested_subvolumes: tuple[str, ...] = ()
    used_bytes: int = 0  # what the limit counts (tests set it)


class FakeHomeVolumes(FailOn, HomeVolumes):
    """In-memory homes under a notional home_root; nothing touches the disk.

    `homes` maps username -> FakeHome(uid, gid, size_gb, mode,
    nested_subvolumes, used_bytes); tests may change those to simulate drift. Set
    `fail_on[method_name] = exception` to make that method raise it (after
    validating its arguments, before changing anything).
    """

    def __init__(self, home_root: str = "/home"):
        self.home_root = os.path.abspath(home_root)
        self.retired: dict[str, "FakeHome"] = {}
        self.homes: dict[str, FakeHome] = {}
        self.fail_on: dict[str, Exception] = {}

    def create(self, username: str, *, uid: int, gid: int, size_gb: int) -> str:
        path = self.path(username)
        check_id("uid", uid)
        check_id("gid", gid)
        check_size_gb(size_gb)
        self._maybe_fail("create")
        if username in self.homes:
            raise Conflict(f"home {path} already exists")
        self.homes[username] = FakeHome(uid=uid, gid=gid, size_gb=size_gb)
        return path

    def resize(self, username: str, *, uid: int, size_gb: int) -> None:
        path = self.path(username)
        check_id("uid", uid)
        check_size_gb(size_gb)
        self._maybe_fail("resize")
        if username not in self.homes:
            raise NotFound(f"no home volume at {path}")
        self.homes[username].size_gb = size_gb

    @property
    def reports_usage(self) -> bool:
        return True

    def usage(self, username: str, *, uid: int) -> int | None:
        return self.usages([(username, uid)])[username]

    def usages(self, homes: list[tuple[str, int]]) -> dict[str, int | None]:
        for username, uid in homes:
            self.path(username)
            check_id("uid", uid)
        self._maybe_fail("usages")
        return {username: None if username not in self.homes else self.homes[username].used_bytes
                for username, _uid in homes}

    def delete(self, username: str, *, uid: int) -> None:
        self.path(username)
        check_id("uid", uid)
        self._maybe_fail("delete")
        self.homes.pop(username, None)

    def retire(self, username: str, *, token: str, uid: int | None) -> str | None:
        self.path(username)
        target = retired_path(self.home_root, token, uid)
        self._maybe_fail("retire")
        home = self.homes.pop(username, None)
        if home is None:
            return None
        self.retired[target] = home
        return target

    def purge(self, path: str) -> None:
        check_retired(self.home_root, path)
        self._maybe_fail("purge")
        self.retired.pop(path, None)

    def list_retired(self) -> list[str]:
        self._maybe_fail("list_retired")
        return sorted(self.retired)

    def inspect(self, username: str) -> HomeInfo:
        path = self.path(username)
        self._maybe_fail("inspect")
        home = self.homes.get(username)
        if home is None:
            return HomeInfo(path=path, exists=False)
        return HomeInfo(
            path=path,
            exists=True,
            is_dir=True,
            uid=home.uid,
            gid=home.gid,
            mode=home.mode,
            limit_bytes=home.size_gb * GIB,
            quota_expected=True,
            nested_subvolumes=home.nested_subvolumes,
        )

    def repair_owner(self, username: str, *, uid: int, gid: int) -> None:
        path = self.path(username)
        check_id("uid", uid)
        check_id("gid", gid)
        self._maybe_fail("repair_owner")
        home = self.homes.get(username)
        if home is None:
            raise NotFound(f"no home volume at {path}")
        home.uid, home.gid, home.mode = uid, gid, 0o700
