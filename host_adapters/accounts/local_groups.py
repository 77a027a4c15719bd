"""UNIX groups with the shadow tools: `groupadd`, `gpasswd` and `groupdel` (`[groups] backend = local`).

`CommandUnixGroups(root)` acts on the host when root is empty, or inside the
system root `root` (see host_adapters/accounts/sysroot.py).
"""

import logging
from collections.abc import Iterable

from common.errors import CommandError, Conflict, ControllerError, HostError, NotFound
from host_adapters import subp
from host_adapters.accounts import sysroot
from host_adapters.names import check_group_name
from host_adapters.accounts.unix_groups import UnixGroups, check_members, unknown_users_error

log = logging.getLogger(__name__)

# Exit codes of shadow's tools that mean a state conflict rather than a host fault.
_GROUPADD_NAME_IN_USE = 9
_GROUPADD_NO_FREE_GID = 4  # without -g: no free number left in GID_MIN..GID_MAX
_GROUPDEL_NO_SUCH_GROUP = 6
_GROUPDEL_PRIMARY_GROUP = 8


class CommandUnixGroups(UnixGroups):
    """groupadd, gpasswd and groupdel, with reads parsed from etc/group.

    Members must be accounts in the root's etc/passwd (on the host, any account
    NSS knows, as gpasswd asks NSS there). Adding or removing members runs one
    gpasswd per user and puts back the users already changed if one fails.
    """

    def __init__(self, root: str | None = None, *, gid_range: tuple[int, int] | None = None):
        self.root = sysroot.normalize_root(root)
        # None: the system root's login.defs decides; else groupadd is told this range,
        # kept apart from the accounts' private groups (`[groups] gid_min`, `gid_max`).
        self.gid_range = gid_range

    def _groupadd(self, name: str) -> list[str]:
        limits = []
        if self.gid_range is not None:
            limits = ["-K", f"GID_MIN={self.gid_range[0]}", "-K", f"GID_MAX={self.gid_range[1]}"]
        return ["groupadd", *sysroot.root_args("-R", self.root), *limits, name]

    def _groupdel(self, name: str) -> list[str]:
        return ["groupdel", *sysroot.root_args("-R", self.root), name]

    def _gpasswd(self, *args: str) -> list[str]:
        return ["gpasswd", *sysroot.root_args("-Q", self.root), *args]

    def check(self) -> str | None:
        sysroot.check_root(
            self.root, binaries=("groupadd", "gpasswd", "groupdel"), files=("group",)
        )

    def get(self, name: str) -> list[str] | None:
        entry = sysroot.find_group(self.root, check_group_name(name))
        return None if entry is None else list(entry.members)

    def gid(self, name: str) -> int | None:
        entry = sysroot.find_group(self.root, check_group_name(name))
        return None if entry is None else entry.gid

    def _existing(self, name: str) -> list[str]:
        members = self.get(name)
        if members is None:
            raise NotFound(f"group {name} does not exist")
        return members

    def _require_accounts(self, members: list[str]) -> None:
        unknown = sysroot.unknown_users(self.root, members)
        if unknown:
            raise unknown_users_error(unknown)

    def create(self, name: str, *, members: Iterable[str] = ()) -> None:
        check_group_name(name)
        members = check_members(members)
        with sysroot.lock(self.root):
            if self.get(name) is not None:
                raise Conflict(f"group {name} already exists")
            self._require_accounts(members)
            try:
                subp.run(self._groupadd(name))
            except CommandError as e:
                if e.returncode == _GROUPADD_NAME_IN_USE:
                    # Known to NSS (e.g. LDAP) though absent from the group file.
                    raise Conflict(f"group {name} already exists") from None
                if e.returncode == _GROUPADD_NO_FREE_GID and self.gid_range is not None:
                    low, high = self.gid_range
                    raise HostError(f"no free group number left in {low}-{high}; "
                                    "widen [groups] gid_min/gid_max") from None
                raise
            if not members:
                return
            try:
                subp.run(self._gpasswd("-M", ",".join(members), name))
            except Exception:
                self._undo_create(name)
                raise

    def _undo_create(self, name: str) -> None:
        try:
            subp.run(self._groupdel(name), ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))
        except ControllerError as e:
            # The caller gets the original error; this one only helps the admin clean up.
            log.error("could not remove group %s after a failed create: %s", name, e.message)

    def add_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        with sysroot.lock(self.root):
            current = self._existing(name)
            self._require_accounts(members)
            new = [m for m in members if m not in current]
            self._apply(name, new, "-a", undo="-d")

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        with sysroot.lock(self.root):
            current = self._existing(name)
            gone = [m for m in members if m in current]
            self._apply(name, gone, "-d", undo="-a")

    def _apply(self, name: str, users: list[str], flag: str, *, undo: str) -> None:
        """One gpasswd per user; on a failure the users already done are put back."""
        done = []
        try:
            for user in users:
                subp.run(self._gpasswd(flag, user, name))
                done.append(user)
        except Exception:
            for user in reversed(done):
                try:
                    subp.run(self._gpasswd(undo, user, name))
                except ControllerError as e:
                    log.error("could not undo %s %s on group %s: %s", flag, user, name, e.message)
            raise

    def set_members(self, name: str, members: Iterable[str]) -> None:
        check_group_name(name)
        members = check_members(members)
        with sysroot.lock(self.root):
            self._existing(name)
            self._require_accounts(members)
            subp.run(self._gpasswd("-M", ",".join(members), name))

    def delete(self, name: str) -> None:
        check_group_name(name)
        with sysroot.lock(self.root):
            try:
                subp.run(self._groupdel(name), ok_codes=(0, _GROUPDEL_NO_SUCH_GROUP))
            except CommandError as e:
                if e.returncode == _GROUPDEL_PRIMARY_GROUP:
                    raise Conflict(f"group {name} is the primary group of an account") from None
                raise

    def list_groups(self) -> dict[str, list[str]]:
        return {g.name: list(g.members) for g in sysroot.read_group(self.root)}



# -- bulk (loading a sandbox at scale; not part of the UnixGroups interface) ----------------
def create_many(groups_adapter: CommandUnixGroups, groups: list[tuple[str, list[str]]]) -> dict[str, int]:
    """Create many groups at once in a scratch system root: (name, members) each, with
    gids from the adapter's range as groupadd would pick them (the lowest free ones),
    written as groupadd + gpasswd -M write them. All or nothing; returns name -> gid.

    For loading a sandbox at scale (one write of group and gshadow instead of a
    groupadd and a gpasswd each); HostError on the host itself ([unix] root empty).
    """
    if groups_adapter.root is None:
        raise HostError("bulk group creation is only for a scratch system root ([unix] root)")
    checked = [(check_group_name(name), check_members(members)) for name, members in groups]
    with sysroot.lock(groups_adapter.root):
        existing = sysroot.read_group(groups_adapter.root)
        names = [name for name, _ in checked]
        clash = sorted({g.name for g in existing} & set(names))
        if clash or len(set(names)) != len(names):
            raise Conflict(f"group {clash[0] if clash else 'named twice'} already exists")
        groups_adapter._require_accounts(sorted({m for _, members in checked for m in members}))
        if groups_adapter.gid_range is not None:
            low, high = groups_adapter.gid_range
        else:
            defs = sysroot.login_defs(groups_adapter.root)
            low, high = int(defs.get("GID_MIN", 1000)), int(defs.get("GID_MAX", 60000))
        used = {g.gid for g in existing}
        free = (gid for gid in range(low, high + 1) if gid not in used)
        gids = {}
        for name, _ in checked:
            gid = next(free, None)
            if gid is None:
                raise HostError(f"no free group number left in {low}-{high}; widen [groups] gid_min/gid_max")
            gids[name] = gid
        sysroot.append_entries(groups_adapter.root, {
            "group": [sysroot.group_line(name, gids[name], tuple(members)) for name, members in checked],
            "gshadow": [sysroot.gshadow_line(name, tuple(members)) for name, members in checked],
        })
    return gids
