"""System accounts: the interface every directory backend implements.

Backends: `LocalDirectory` (useradd/userdel, optionally inside a system root)
in host_adapters/accounts/local_directory.py, `LdapDirectory` (posixAccount entries) in
host_adapters/accounts/ldap_directory.py, and `FakeDirectory` for fast tests.
"""

from dataclasses import dataclass, replace

from common.errors import Conflict, HostError, InvalidInput, NotFound
from host_adapters.fail_on import FailOn
from host_adapters.names import check_username


@dataclass(frozen=True)
class PosixAccount:
    username: str
    uid: int
    gid: int  # gid of the user's private group, which has the same name
    home: str
    shell: str
    # Whether lock_account locked it (the account expired on day 1 of 1970:
    # shadow's expire field or LDAP's shadowExpire is 1).
    locked: bool = False


# The expiry day lock_account sets, as days since 1970-01-01. Day 1, not 0: an
# expire field of 0 is read differently by different tools.
LOCKED_EXPIRE_DAY = 1


class Directory:
    """Where system accounts live. Docstrings state what must hold after each call."""

    def check(self) -> None:
        """Raise HostUnavailable (with a message naming the cause) if the directory cannot be used."""
        raise NotImplementedError

    def create_account(self, username: str, *, home: str, uid: int | None = None) -> PosixAccount:
        """Create the account and its private group (same name) and return it.

        `uid` None lets the backend allocate one: a number above every number
        it ever allocated or was given (a stored high-water mark that only
        grows), so a new account never inherits the files of a removed one.
        A given uid raises the mark when it is above it. Raises InvalidInput
        for a bad username, Conflict if the username, its group name or the
        uid is taken, HostError when the allocation range is used up. All or
        nothing: on any failure neither the account nor the group remains.
        """
        raise NotImplementedError

    def get_account(self, username: str) -> PosixAccount | None:
        """The account with that username, or None."""
        raise NotImplementedError

    def get_account_by_uid(self, uid: int) -> PosixAccount | None:
        """The account with that uid, or None."""
        raise NotImplementedError

    def system_account(self, username: str) -> bool:
        """Whether username names one of the system's own accounts: an account the host's
        directory already holds with a uid below the first uid this backend gives out
        (local: login.defs' UID_MIN; LDAP: `uid_min`, in the directory and in the head
        node's own account files). Changes nothing."""
        raise NotImplementedError

    def delete_account(self, username: str) -> None:
        """Remove the account and its private group. Succeeds when they are already gone."""
        raise NotImplementedError

    def lock_account(self, username: str) -> None:
        """Afterwards nobody can log in as the account: it is expired (day 1 of 1970)
        and, where it has one, its password is locked. Uid, files and groups stay.
        Succeeds when it is locked already; NotFound if there is no such account."""
        raise NotImplementedError

    def unlock_account(self, username: str) -> None:
        """Undo lock_account: the expiry and password lock it set are removed. An
        account it did not lock (other expiry, or none) is left as it is. NotFound
        if there is no such account."""
        raise NotImplementedError


def check_home(home: object) -> str:
    """An absolute path that cannot break a passwd line."""
    if not isinstance(home, str) or not home.startswith("/") or any(c in home for c in ":\n\0"):
        raise InvalidInput(f"invalid home directory {home!r}: must be an absolute path without ':'")
    return home


def check_uid(uid: object) -> int | None:
    """None (let the backend allocate) or a uid other than root's and the invalid -1."""
    if uid is None:
        return None
    if isinstance(uid, bool) or not isinstance(uid, int) or not 1 <= uid <= 4294967294:
        raise InvalidInput(f"invalid uid {uid!r}: must be an integer from 1 to 4294967294")
    return uid


class FakeDirectory(FailOn, Directory):
    """In-memory accounts with uids allocated from `first_uid` upward, above
    `uid_mark` (the highest number ever allocated or given), up to `last_uid`.

    `groups` (name -> members) holds the private groups and is shared with a
    FakeUnixGroups built on this directory, as /etc/group is on a real host.
    Set `fail_on[method_name] = exception` to make a method raise it before
    changing anything.
    """

    def __init__(self, *, shell: str = "/bin/bash", first_uid: int = 10000, last_uid: int = 60000):
        self.shell = shell
        self.first_uid = first_uid
        self.last_uid = last_uid
        self.uid_mark = first_uid - 1
        self.accounts: dict[str, PosixAccount] = {}
        self.groups: dict[str, list[str]] = {}
        self.fail_on: dict[str, Exception] = {}

    def create_account(self, username: str, *, home: str, uid: int | None = None) -> PosixAccount:
        check_username(username)
        check_home(home)
        check_uid(uid)
        self._maybe_fail("create_account")
        if username in self.accounts:
            raise Conflict(f"username {username} is already in use")
        if username in self.groups:
            raise Conflict(f"a group named {username} already exists")
        used = {a.uid for a in self.accounts.values()}
        if uid in used:
            raise Conflict(f"uid {uid} is already in use")
        if uid is None:
            uid = self.uid_mark + 1
            while uid in used:
                uid += 1
            if uid > self.last_uid:
                raise HostError(f"no free uid left in {self.first_uid}-{self.last_uid}")
        if self.first_uid <= uid <= self.last_uid:
            self.uid_mark = max(self.uid_mark, uid)
        account = PosixAccount(username=username, uid=uid, gid=uid, home=home, shell=self.shell)
        self.accounts[username] = account
        self.groups[username] = []
        return account

    def get_account(self, username: str) -> PosixAccount | None:
        check_username(username)
        self._maybe_fail("get_account")
        return self.accounts.get(username)

    def get_account_by_uid(self, uid: int) -> PosixAccount | None:
        if check_uid(uid) is None:
            raise InvalidInput("uid must be given")
        self._maybe_fail("get_account_by_uid")
        return next((a for a in self.accounts.values() if a.uid == uid), None)

    def system_account(self, username: str) -> bool:
        check_username(username)
        self._maybe_fail("system_account")
        account = self.accounts.get(username)
        return account is not None and account.uid < self.first_uid

    def delete_account(self, username: str) -> None:
        check_username(username)
        self._maybe_fail("delete_account")
        if self.accounts.pop(username, None) is None:
            # Without the account a group of that name may be anyone's: leave it.
            return
        self.groups.pop(username, None)
        for members in self.groups.values():
            if username in members:
                members.remove(username)

    def _set_locked(self, username: str, locked: bool) -> None:
        check_username(username)
        self._maybe_fail("lock_account" if locked else "unlock_account")
        account = self.accounts.get(username)
        if account is None:
            raise NotFound(f"no account {username}")
        self.accounts[username] = replace(account, locked=locked)

    def lock_account(self, username: str) -> None:
        self._set_locked(username, True)

    def unlock_account(self, username: str) -> None:
        self._set_locked(username, False)
