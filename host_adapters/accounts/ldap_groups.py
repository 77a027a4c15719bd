"""UNIX groups as posixGroup entries in the LDAP directory (`[groups] backend = ldap`).

Every node whose NSS reads the directory (nslcd, sssd) sees these groups, where
groupadd's reach the head node alone. The groups share the directory's server,
bind and connection (host_adapters/accounts/ldap_directory.py); members are its accounts
(posixAccount entries below its people_ou), never whatever the head node's NSS
resolves.

Entry written for group NAME with number N:

    cn=NAME,<base>   objectClass posixGroup; cn = NAME, gidNumber = N,
                     memberUid = each member's username (absent when none)

`base` is `[groups] ldap_base`, by default the directory's groups_ou under its
base_dn (where the accounts' private groups are too, so a private group reads
as a group without members and cannot be deleted, as with groupadd).

Names: group and member names pass names.check_group_name/check_username (else
InvalidInput, before any request), and are still escaped in every DN
(escape_dn_chars) and filter (escape_filter_chars).

Numbers: N is the lowest number of `gid_range` no posixGroup below the
directory's base_dn holds. Two controllers may pick the same N at once: after
adding its entry a creator looks for every posixGroup holding N, and if one was
written before its own (entryCSN, else createTimestamp, then DN) it removes its
entry and takes the next number; the earliest writer never yields. A full range
is HostError (widen gid_min/gid_max).

Atomicity: a create is one add (the members in it), a member change one modify
(add or delete of the values concerned, or replace of them all), so a failure
leaves the group as it was. Server errors are HostError, a server that does not
answer HostUnavailable (both 503).
"""

import logging
from collections.abc import Iterable

import ldap
import ldap.dn
import ldap.filter

from common.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.accounts.ldap_directory import LdapDirectory
from host_adapters.names import check_group_name
from host_adapters.accounts.unix_groups import UnixGroups, check_members, unknown_users_error

log = logging.getLogger(__name__)

_GROUP_CLASSES = [b"top", b"posixGroup"]
# Losing the race for a gid this many times in a row means another tool writes
# clashing entries without this protocol.
_MAX_RACES = 20
# A member change retried when the group changed under it between the read and the modify.
_MAX_MODIFY_TRIES = 5


def _first(attrs: dict, name: str) -> str | None:
    for key, values in attrs.items():
        if key.lower() == name.lower() and values:
            return values[0].decode("utf-8")
    return None


def _members(attrs: dict) -> list[str]:
    for key, values in attrs.items():
        if key.lower() == "memberuid":
            return [v.decode("utf-8") for v in values]
    return []


def _norm_dn(dn: str) -> str:
    return ldap.dn.dn2str(ldap.dn.str2dn(dn)).lower()


class LdapUnixGroups(UnixGroups):
    """posixGroup entries under `base_dn`, gids from `gid_range`, members from `directory`."""

    def __init__(self, directory: LdapDirectory, *, base_dn: str | None = None,
                 gid_range: tuple[int, int] = (70000, 79999)):
        self._ldap = directory.entries
        base_dn = base_dn or self._ldap.groups_dn
        if not ldap.dn.is_dn(base_dn):
            raise InvalidInput(f"LDAP groups base {base_dn!r} is not a DN")
        low, high = gid_range
        if not 1 <= low <= high <= 4294967294:
            raise InvalidInput(f"gid range {low}-{high} is empty or out of 1-4294967294")
        self.base_dn = base_dn
        self.gid_range = gid_range

    def __repr__(self) -> str:
        return f"LdapUnixGroups(base_dn={self.base_dn!r}, uri={self._ldap.uri!r})"

    def _dn(self, name: str) -> str:
        return f"cn={ldap.dn.escape_dn_chars(name)},{self.base_dn}"

    def _read(self, name: str) -> dict | None:
        return self._ldap.read(self._dn(name), ["gidNumber", "memberUid", "objectClass"])

    # -- reads ---------------------------------------------------------------

    def check(self) -> str | None:
        with self._ldap.session(f"read of the groups base {self.base_dn}") as d:
            try:
                d.search(self.base_dn, "(objectClass=*)", ["1.1"], scope=ldap.SCOPE_BASE)
            except ldap.NO_SUCH_OBJECT:
                raise HostUnavailable(f"LDAP entry {self.base_dn} (the groups base) does not exist on "
                                      f"{d.uri}") from None
        low, high = self.gid_range
        # A passing check says where the groups live (`cloud-agent check` shows it).
        return f"groups: LDAP posixGroups under {self.base_dn} on {self._ldap.uri}, gids {low}-{high}"

    def get(self, name: str) -> list[str] | None:
        check_group_name(name)
        with self._ldap.session(f"read of group {name}"):
            attrs = self._read(name)
        return None if attrs is None else _members(attrs)

    def gid(self, name: str) -> int | None:
        check_group_name(name)
        with self._ldap.session(f"read of group {name}"):
            attrs = self._read(name)
        if attrs is None:
            return None
        try:
            return int(_first(attrs, "gidNumber") or "")
        except ValueError:
            raise HostError(f"LDAP entry {self._dn(name)} has no numeric gidNumber") from None

    def list_groups(self) -> dict[str, list[str]]:
        with self._ldap.session(f"search of {self.base_dn}") as d:
            found = d.search(self.base_dn, "(objectClass=posixGroup)", ["cn", "memberUid"])
        groups = {}
        for dn, attrs in found:
            rdn = ldap.dn.str2dn(dn)[0][0]
            name = rdn[1] if rdn[0].lower() == "cn" else _first(attrs, "cn")
            if name:
                groups[name] = _members(attrs)
        return groups

    # -- changes -------------------------------------------------------------

    def _require_accounts(self, members: list[str]) -> None:
        """Every member is a posixAccount of the directory (one search), else InvalidInput."""
        if not members:
            return
        wanted = "".join(f"(uid={ldap.filter.escape_filter_chars(m)})" for m in members)
        found = self._ldap.search(self._ldap.base_dn, f"(&(objectClass=posixAccount)(|{wanted}))", ["uid"])
        known = {_first(attrs, "uid") for _, attrs in found}
        unknown = [m for m in members if m not in known]
        if unknown:
            raise unknown_users_error(unknown)

    def create(self, name: str, *, members: Iterable[str] = ()) -> None:
        check_group_name(name)
        members = check_members(members)
        with self._ldap.session(f"create of group {name}") as d:
            flt = f"(&(objectClass=posixGroup)(cn={ldap.filter.escape_filter_chars(name)}))"
            for dn, _ in d.search(d.base_dn, flt, ["1.1"]):
                raise Conflict(f"group {name} already exists in the directory ({dn})")
            self._require_accounts(members)
            lost: set[int] = set()
            for _ in range(_MAX_RACES):
                number = self._free_gid(lost)
                entry = {"objectClass": _GROUP_CLASSES, "cn": [name.encode()], "gidNumber": [str(number).encode()]}
                if members:
                    entry["memberUid"] = [m.encode() for m in members]
                try:
                    d.add(self._dn(name), entry)
                except ldap.ALREADY_EXISTS:
                    raise Conflict(f"group {name} already exists in the directory") from None
                if self._keep(name, number):
                    return
                lost.add(number)
                log.info("gidNumber %d was taken concurrently; group %s tries the next one", number, name)
            raise HostError(f"could not allocate a gidNumber for group {name}: {_MAX_RACES} numbers in a row "
                            "were taken")

    def _free_gid(self, lost: set[int]) -> int:
        low, high = self.gid_range
        used = set(lost)
        for _, attrs in self._ldap.search(self._ldap.base_dn, "(objectClass=posixGroup)", ["gidNumber"]):
            try:
                used.add(int(_first(attrs, "gidNumber") or ""))
            except ValueError:
                continue
        number = next((n for n in range(low, high + 1) if n not in used), None)
        if number is None:
            raise HostError(f"no free group number left in {low}-{high}; widen [groups] gid_min/gid_max")
        return number

    def _keep(self, name: str, number: int) -> bool:
        """Whether our entry keeps `number`: no other posixGroup holding it was written first.
        When it does not, our entry is removed (a failure there leaves it for reconcile)."""
        mine = _norm_dn(self._dn(name))
        try:
            holders = self._ldap.search(
                self._ldap.base_dn,
                f"(&(objectClass=posixGroup)(gidNumber={ldap.filter.escape_filter_chars(str(number))}))",
                ["entryCSN", "createTimestamp"])
        except BaseException:
            self._remove_quietly(name)
            raise

        def written(item):
            dn, attrs = item
            return (_first(attrs, "entryCSN") or _first(attrs, "createTimestamp") or "", _norm_dn(dn))

        own = [h for h in holders if _norm_dn(h[0]) == mine]
        others = [h for h in holders if _norm_dn(h[0]) != mine]
        if own and not any(written(o) < written(own[0]) for o in others):
            return True
        self._remove_quietly(name)
        return False

    def _remove_quietly(self, name: str) -> None:
        try:
            self._ldap.delete(self._dn(name))
        except (ldap.LDAPError, HostError) as e:
            log.error("could not remove %s after a failed create (%s); reconcile will report it",
                      self._dn(name), e)

    def _change_members(self, name: str, members: Iterable[str], change, *, require: bool) -> None:
        """Read the members, apply change(current, members) -> modify list (or None: nothing to
        do) in one modify; retried when the group changed between the read and the modify."""
        check_group_name(name)
        members = check_members(members)
        with self._ldap.session(f"change of group {name}") as d:
            for _ in range(_MAX_MODIFY_TRIES):
                attrs = self._read(name)
                if attrs is None:
                    raise NotFound(f"group {name} does not exist")
                if require:
                    self._require_accounts(members)
                changes = change(_members(attrs), members)
                if not changes:
                    return
                try:
                    d.modify(self._dn(name), changes)
                    return
                except ldap.NO_SUCH_OBJECT:
                    raise NotFound(f"group {name} does not exist") from None
                except (ldap.TYPE_OR_VALUE_EXISTS, ldap.NO_SUCH_ATTRIBUTE):
                    continue  # changed under us (or our own first try was applied): read again
            raise HostError(f"group {name} kept changing under {_MAX_MODIFY_TRIES} tries")

    def add_members(self, name: str, members: Iterable[str]) -> None:
        def change(current, wanted):
            new = [m for m in wanted if m not in current]
            return [(ldap.MOD_ADD, "memberUid", [m.encode() for m in new])] if new else None

        self._change_members(name, members, change, require=True)

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        def change(current, wanted):
            gone = [m for m in wanted if m in current]
            return [(ldap.MOD_DELETE, "memberUid", [m.encode() for m in gone])] if gone else None

        self._change_members(name, members, change, require=False)

    def set_members(self, name: str, members: Iterable[str]) -> None:
        def change(current, wanted):
            if current == wanted:
                return None
            # An empty replace removes the attribute: a posixGroup without members.
            return [(ldap.MOD_REPLACE, "memberUid", [m.encode() for m in wanted])]

        self._change_members(name, members, change, require=True)

    def delete(self, name: str) -> None:
        check_group_name(name)
        with self._ldap.session(f"delete of group {name}") as d:
            attrs = self._read(name)
            if attrs is None:
                return
            gid = _first(attrs, "gidNumber") or ""
            if gid.isdigit():
                flt = f"(&(objectClass=posixAccount)(gidNumber={ldap.filter.escape_filter_chars(gid)}))"
                for dn, _ in d.search(d.base_dn, flt, ["1.1"]):
                    raise Conflict(f"group {name} is the primary group of an account ({dn})")
            d.delete(self._dn(name))
