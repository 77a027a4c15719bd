"""System accounts in the local account files, made with `useradd` and removed with `userdel`.

`LocalDirectory(root)` acts on the host when root is empty, or inside the
system root `root` (see host_adapters/accounts/sysroot.py). Home directories are made
by the volume adapter, so `useradd -M` never creates one.

Uids are never reused. useradd alone picks the highest used uid + 1, which
hands a removed newest account's uid (and its files elsewhere on the cluster)
to the next account. So the controller passes `-u N` itself: N is above a
high-water mark kept in the system root (`/var/lib/cloud-controller/uid-mark`
on the host, `ROOT/var/lib/...` in a scratch root) and above every uid of
login.defs' UID_MIN..UID_MAX range in use; the mark only grows. A lock file
beside it (flock) keeps two processes (the server and `cloud-agent`) from
picking the same N; useradd refusing N (a uid only NSS knows) moves on to N+1.

Locking (`lock_account`) is `usermod -L -e 1`: the password is locked and the
account expired since 1970-01-02, which PAM and sshd refuse for every kind of
login (keys too); `unlock_account` undoes both, but only on an account whose
expiry is that day, so an expiry an admin set is left alone.
"""

import contextlib
import fcntl
import logging
import os
import pwd
import time

from common.errors import CommandError, Conflict, ControllerError, HostError, InvalidInput, NotFound
from host_adapters import subp
from host_adapters.accounts import sysroot
from host_adapters.accounts.directory import LOCKED_EXPIRE_DAY, Directory, PosixAccount, check_home, check_uid
from host_adapters.names import check_username

log = logging.getLogger(__name__)

_USERADD_UID_IN_USE = 4
_USERADD_NAME_IN_USE = 9  # the username or, with -U, the group name
_USERDEL_NO_SUCH_USER = 6
_USERDEL_USER_BUSY = 8
_USERMOD_NO_SUCH_USER = 6
_GROUPDEL_NO_SUCH_GROUP = 6
# useradd's own defaults when login.defs does not say.
_DEFAULT_UID_MIN, _DEFAULT_UID_MAX = 1000, 60000
# uids only NSS knows (e.g. LDAP) that useradd refuses, skipped in a row before giving up.
_MAX_NSS_SKIPS = 100


def _account(entry: sysroot.PasswdEntry, shadow: sysroot.ShadowEntry | None = None) -> PosixAccount:
    return PosixAccount(
        username=entry.name, uid=entry.uid, gid=entry.gid, home=entry.home, shell=entry.shell,
        locked=shadow is not None and shadow.expire == LOCKED_EXPIRE_DAY,
    )


class UidMark:
    """The highest uid ever allocated or given in one system root, in a file of its own.

    `hold()` takes an exclusive flock on a lock file beside it for the whole
    read-allocate-record sequence; `read()` and `record()` are used inside it.
    """

    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def hold(self):
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
            fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise HostError(f"cannot open the uid mark lock {self.path}.lock: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def read(self) -> int:
        """The mark, 0 when none was recorded yet."""
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as e:
            raise HostError(f"cannot read the uid mark {self.path}: {getattr(e, 'strerror', None) or e}") from None
        if not text.isdigit():
            raise HostError(f"the uid mark {self.path} holds {text[:20]!r}, not a number; "
                            "set it to the highest uid ever given out")
        return int(text)

    def record(self, uid: int) -> None:
        """Raise the mark to uid (never lower it); written whole or not at all."""
        if uid <= self.read():
            return
        tmp = f"{self.path}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(f"{uid}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            raise HostError(f"cannot record the uid mark {self.path}: {e.strerror}") from None


class LocalDirectory(Directory):
    def __init__(self, root: str | None = None, shell: str = "/bin/bash"):
        self.root = sysroot.normalize_root(root)
        if not isinstance(shell, str) or not shell.startswith("/") or set(shell) & set(":\n\0"):
            raise InvalidInput(f"invalid shell {shell!r}: must be an absolute path without ':'")
        self.shell = shell
        self.uid_mark = UidMark(sysroot.state_file(self.root, "uid-mark"))

    def _r(self) -> list[str]:
        return sysroot.root_args("-R", self.root)

    def check(self) -> None:
        sysroot.check_root(
            self.root, binaries=("useradd", "userdel", "usermod", "groupdel"), files=("passwd", "group")
        )

    def get_account(self, username: str) -> PosixAccount | None:
        entry = sysroot.find_user(self.root, check_username(username))
        return None if entry is None else _account(entry, sysroot.find_shadow(self.root, username))

    def get_account_by_uid(self, uid: int) -> PosixAccount | None:
        if check_uid(uid) is None:
            raise InvalidInput("uid must be given")
        entry = next((u for u in sysroot.read_passwd(self.root) if u.uid == uid), None)
        return None if entry is None else _account(entry, sysroot.find_shadow(self.root, entry.name))

    def system_account(self, username: str) -> bool:
        check_username(username)
        first, _last = self._uid_range()
        entry = sysroot.find_user(self.root, username)
        if entry is not None:
            return entry.uid < first
        if self.root is None:
            # On the host, NSS may know it from elsewhere (a directory's service accounts).
            try:
                return pwd.getpwnam(username).pw_uid < first
            except KeyError:
                return False
        return False

    def _uid_range(self) -> tuple[int, int]:
        defs = sysroot.login_defs(self.root)
        try:
            return (int(defs.get("UID_MIN", _DEFAULT_UID_MIN)), int(defs.get("UID_MAX", _DEFAULT_UID_MAX)))
        except ValueError:
            raise HostError(f"UID_MIN or UID_MAX in {sysroot.etc_file(self.root, 'login.defs')} "
                            "is not a number") from None

    def _next_uid(self, low: int, high: int, skip: set[int]) -> int:
        """The lowest uid above the mark and above every uid in use in low..high."""
        in_use = {u.uid for u in sysroot.read_passwd(self.root)}
        highest = max((u for u in in_use if low <= u <= high), default=0)
        candidate = max(self.uid_mark.read(), highest, low - 1) + 1
        # On the host, a uid only NSS knows (a directory account) is in use too.
        on_host = self.root is None
        while candidate in in_use or candidate in skip or (on_host and sysroot.nss_knows(pwd.getpwuid, candidate)):
            candidate += 1
        if candidate > high:
            raise HostError(f"no uid left above the highest ever given out in {low}-{high} "
                            f"(UID_MIN/UID_MAX of {sysroot.etc_file(self.root, 'login.defs')})")
        return candidate

    def create_account(self, username: str, *, home: str, uid: int | None = None) -> PosixAccount:
        check_username(username)
        check_home(home)
        check_uid(uid)
        with sysroot.lock(self.root), self.uid_mark.hold():
            self._refuse_taken(username, uid)
            low, high = self._uid_range()
            skipped: set[int] = set()
            while True:
                number = uid if uid is not None else self._next_uid(low, high, skipped)
                try:
                    self._useradd(username, home, number)
                    break
                except CommandError as e:
                    # A uid known only to NSS (e.g. LDAP): an allocated one is skipped.
                    if e.returncode != _USERADD_UID_IN_USE:
                        raise
                    if uid is not None:
                        raise Conflict(f"uid {uid} is already in use") from None
                    skipped.add(number)
                    if len(skipped) >= _MAX_NSS_SKIPS:
                        raise HostError(f"useradd refused {len(skipped)} free-looking uids in a row "
                                        f"(last {number}): check NSS for clashing accounts") from None
            account = self.get_account(username)
            if account is None:
                raise HostError(f"useradd reported success but {username} is not in the passwd file")
            if low <= account.uid <= high:
                self.uid_mark.record(account.uid)
        return account

    def _useradd(self, username: str, home: str, uid: int) -> None:
        argv = ["useradd", *self._r(), "-U", "-M", "-d", home, "-s", self.shell, "-u", str(uid), username]
        try:
            subp.run(argv)
        except Exception as e:
            # Names or ids known only to NSS (e.g. LDAP) are refused here, before any change.
            if isinstance(e, CommandError) and e.returncode == _USERADD_UID_IN_USE:
                raise
            if isinstance(e, CommandError) and e.returncode == _USERADD_NAME_IN_USE:
                raise Conflict(f"username or group name {username} is already in use") from None
            self._remove_leftovers(username)
            raise

    def _usermod(self, username: str, *args: str) -> None:
        try:
            subp.run(["usermod", *self._r(), *args, username])
        except CommandError as e:
            if e.returncode == _USERMOD_NO_SUCH_USER:
                raise NotFound(f"no account {username}") from None
            raise

    def lock_account(self, username: str) -> None:
        self._set_locked(username, True)

    def unlock_account(self, username: str) -> None:
        self._set_locked(username, False)

    def _set_locked(self, username: str, locked: bool) -> None:
        check_username(username)
        with sysroot.lock(self.root):
            account = self.get_account(username)
            if account is None:
                raise NotFound(f"no account {username}")
            if account.locked == locked:
                return
            if locked:
                self._usermod(username, "-L", "-e", str(LOCKED_EXPIRE_DAY))
            else:
                # -e "" removes the expiry; -U drops the "!" -L put before the password
                # (on an account without a password usermod leaves "!" and says so).
                self._usermod(username, "-U", "-e", "")

    def _refuse_taken(self, username: str, uid: int | None) -> None:
        users = sysroot.read_passwd(self.root)
        if any(u.name == username for u in users):
            raise Conflict(f"username {username} is already in use")
        if sysroot.find_group(self.root, username) is not None:
            raise Conflict(f"a group named {username} already exists")
        if uid is not None and any(u.uid == uid for u in users):
            raise Conflict(f"uid {uid} is already in use")

    def _remove_leftovers(self, username: str) -> None:
        """After a failed useradd, remove what it may have written (both were absent before)."""
        try:
            if sysroot.find_user(self.root, username) is not None:
                subp.run(["userdel", *self._r(), username], ok_codes=(0, _USERDEL_NO_SUCH_USER))
            if sysroot.find_group(self.root, username) is not None:
                subp.run(["groupdel", *self._r(), username], ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))
        except ControllerError as e:
            # The caller gets the useradd error; this one only helps the admin clean up.
            log.error("could not remove leftovers of account %s: %s", username, e.message)

    def delete_account(self, username: str) -> None:
        check_username(username)
        with sysroot.lock(self.root):
            account = self.get_account(username)
            if account is None:
                # Without the account a group of that name may be anyone's: leave it.
                return
            try:
                subp.run(["userdel", *self._r(), username], ok_codes=(0, _USERDEL_NO_SUCH_USER))
            except CommandError as e:
                if e.returncode == _USERDEL_USER_BUSY:
                    raise Conflict(f"account {username} is in use by running processes") from None
                raise
            # userdel keeps the private group when USERGROUPS_ENAB is off or the
            # group has other members; it is still this account's group.
            group = sysroot.find_group(self.root, username)
            if group is not None and group.gid == account.gid:
                subp.run(["groupdel", *self._r(), username], ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))


# -- bulk (loading a sandbox at scale; not part of the Directory interface) ----------------
def create_accounts(directory: LocalDirectory, accounts: list[tuple[str, str]]) -> list[PosixAccount]:
    """Create many accounts at once in a scratch system root: (username, home) each, in
    order, as `useradd -U -M` would (a private group whose gid is the uid, no password),
    with uids allocated above the mark like create_account. All or nothing.

    One write of passwd, group, shadow and gshadow instead of a useradd each (a sandbox
    loaded with 10,000 accounts); HostError on the host itself ([unix] root empty).
    """
    if directory.root is None:
        raise HostError("bulk account creation is only for a scratch system root ([unix] root)")
    for username, home in accounts:
        check_username(username)
        check_home(home)
    with sysroot.lock(directory.root), directory.uid_mark.hold():
        users = sysroot.read_passwd(directory.root)
        taken_names = {u.name for u in users} | {g.name for g in sysroot.read_group(directory.root)}
        wanted = [name for name, _ in accounts]
        clash = sorted(taken_names & set(wanted))
        if clash:
            raise Conflict(f"username or group name {clash[0]} is already in use")
        if len(set(wanted)) != len(wanted):
            raise InvalidInput("a username is given twice")
        low, high = directory._uid_range()
        used = {u.uid for u in users} | {g.gid for g in sysroot.read_group(directory.root)}
        number = max(directory.uid_mark.read(), max((u for u in used if low <= u <= high), default=0), low - 1)
        made, day = [], int(time.time() // 86400)
        for username, home in accounts:
            number += 1
            while number in used:
                number += 1
            if number > high:
                raise HostError(f"no uid left for {len(accounts)} accounts in {low}-{high}")
            made.append(PosixAccount(username=username, uid=number, gid=number, home=home, shell=directory.shell,
                                     locked=False))
        sysroot.append_entries(directory.root, {
            "passwd": [sysroot.passwd_line(a.username, a.uid, a.gid, a.home, a.shell) for a in made],
            "group": [sysroot.group_line(a.username, a.gid) for a in made],
            "shadow": [sysroot.shadow_line(a.username, day) for a in made],
            "gshadow": [sysroot.gshadow_line(a.username) for a in made],
        })
        if made:
            directory.uid_mark.record(made[-1].uid)
    return made
