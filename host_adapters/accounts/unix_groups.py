"""UNIX groups: the interface every groups backend implements, and a fake.

Backends (`[groups] backend`): `CommandUnixGroups` (groupadd, gpasswd and
groupdel, on the host or inside a system root) in host_adapters/accounts/local_groups.py,
`LdapUnixGroups` (posixGroup entries in the LDAP directory) in
host_adapters/accounts/ldap_groups.py, and `FakeUnixGroups` here for fast tests.
"""

from collections.abc import Iterable

from common.errors import Conflict, HostError, InvalidInput, NotFound
from host_adapters.accounts.directory import FakeDirectory
from host_adapters.fail_on import FailOn
from host_adapters.names import check_group_name, check_username


class UnixGroups:
    """Secondary UNIX groups. Docstrings state what must hold after each call.

    Group names must pass names.check_group_name and member names
    names.check_username (else InvalidInput, before anything changes).
    """

    def check(self) -> str | None:
        """Raise HostUnavailable (naming the cause) if groups cannot be managed; may return a
        line saying where the groups live."""
        raise NotImplementedError

    def get(self, name: str) -> list[str] | None:
        """The members of the group, or None if there is no such group."""
        raise NotImplementedError

    def gid(self, name: str) -> int | None:
        """The group's number, or None if there is no such group (guests get the same number)."""
        raise NotImplementedError

    def create(self, name: str, *, members: Iterable[str] = ()) -> None:
        """Create the group with exactly these members, its number from the adapter's gid range.

        Conflict if the group exists; InvalidInput for a bad name or a member
        that is not an account; HostError when the gid range is used up. All
        or nothing: on any failure no group remains.
        """
        raise NotImplementedError

    def add_members(self, name: str, members: Iterable[str]) -> None:
        """Afterwards every given user is a member; other members stay.

        NotFound if the group is missing; InvalidInput if a user is not an
        account (then membership is unchanged).
        """
        raise NotImplementedError

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        """Afterwards none of the given users is a member; removing a non-member is no error.

        NotFound if the group is missing.
        """
        raise NotImplementedError

    def set_members(self, name: str, members: Iterable[str]) -> None:
        """Afterwards the members are exactly the given users (none for an empty list).

        NotFound if the group is missing; InvalidInput if a user is not an account.
        """
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Afterwards the group does not exist. Succeeds when it is already gone.

        Conflict if it is some account's primary group.
        """
        raise NotImplementedError

    def list_groups(self) -> dict[str, list[str]]:
        """Every group (name -> members) in the system root, private groups included."""
        raise NotImplementedError


def check_members(members: Iterable[str]) -> list[str]:
    """Validated member names, duplicates dropped, order kept."""
    if isinstance(members, (str, bytes)) or not isinstance(members, Iterable):
        raise InvalidInput("members must be a list of usernames")
    return list(dict.fromkeys(check_username(m) for m in members))


def unknown_users_error(unknown: list[str]) -> InvalidInput:
    return InvalidInput(f"no such user: {', '.join(unknown)}")


class FakeUnixGroups(FailOn, UnixGroups):
    """In-memory groups sharing state with a FakeDirectory, as real groups share
    /etc/group with the accounts' private groups.

    `users` names extra accounts that may be members (like directory accounts
    gpasswd sees through NSS). Set `fail_on[method_name] = exception` to make a
    method raise it before changing anything.
    """

    def __init__(self, *, directory: FakeDirectory | None = None, users: Iterable[str] = (),
                 gid_range: tuple[int, int] = (20000, 29999)):
        self.directory = directory if directory is not None else FakeDirectory()
        self.users = set(users)
        self.fail_on: dict[str, Exception] = {}
        self.gid_range = gid_range
        self.gids: dict[str, int] = {}  # numbers of groups made here, as groupadd would pick them

    @property
    def groups(self) -> dict[str, list[str]]:
        return self.directory.groups

    def _require_accounts(self, members: list[str]) -> None:
        unknown = [m for m in members if m not in self.users and m not in self.directory.accounts]
        if unknown:
            raise unknown_users_error(unknown)

    def _existing(self, name: str) -> list[str]:
        if name not in self.groups:
            raise NotFound(f"group {name} does not exist")
        return self.groups[name]

    def check(self) -> str | None:  # the interface's signature: a backend may say where groups live
        return FailOn.check(self)

    def get(self, name: str) -> list[str] | None:
        check_group_name(name)
        self._maybe_fail("get")
        members = self.groups.get(name)
        return None if members is None else list(members)

    def gid(self, name: str) -> int | None:
        check_group_name(name)
        self._maybe_fail("gid")
        if name not in self.groups:
            return None
        account = self.directory.accounts.get(name)
        if account is not None:
            return account.gid
        return self.gids.setdefault(name, self.gid_range[0] + len(self.gids))

    def create(self, name: str, *, members: Iterable[str] = ()) -> None:
        check_group_name(name)
        members = check_members(members)
        self._maybe_fail("create")
        if name in self.groups:
            raise Conflict(f"group {name} already exists")
        self._require_accounts(members)
        low, high = self.gid_range
        if low + len(self.gids) > high:
            raise HostError(f"no free group number left in {low}-{high}; widen [groups] gid_min/gid_max")
        self.groups[name] = list(members)
        self.gids.setdefault(name, low + len(self.gids))

    def add_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        self._maybe_fail("add_members")
        current = self._existing(name)
        self._require_accounts(members)
        current.extend(m for m in members if m not in current)

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        self._maybe_fail("remove_members")
        current = self._existing(name)
        current[:] = [m for m in current if m not in members]

    def set_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        self._maybe_fail("set_members")
        self._existing(name)
        self._require_accounts(members)
        self.groups[name] = list(members)

    def delete(self, name: str) -> None:
        check_group_name(name)
        self._maybe_fail("delete")
        if name in self.directory.accounts:
            raise Conflict(f"group {name} is the primary group of an account")
        self.groups.pop(name, None)

    def list_groups(self) -> dict[str, list[str]]:
        self._maybe_fail("list_groups")
        return {name: list(members) for name, members in self.groups.items()}
