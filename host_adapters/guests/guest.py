"""What a guest is told about itself: its name, its NICs, its users, their groups and homes.

The service layer decides these values (policy); the hypervisor adapter turns
them into domain devices and a NoCloud seed (host_adapters/guests/seed.py). Plain
frozen dataclasses, so two specs compare equal exactly when the guest would
get the same thing.
"""

import ipaddress
import os
import re
from dataclasses import dataclass, field

from common.errors import InvalidInput
from common.words import HOSTNAME_RULE, MAC_RULE
from host_adapters.names import check_group_name, check_pattern, check_username

_MAC = re.compile(r"^52:54:00(:[0-9a-f]{2}){3}$")
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_mac(value: object) -> str:
    """A locally administered QEMU-range MAC, lower case (52:54:00:xx:xx:xx)."""
    return check_pattern(value, _MAC, "MAC address", MAC_RULE)


def check_hostname(value: object) -> str:
    """One RFC 1123 label, lower case."""
    return check_pattern(value, _HOSTNAME, "hostname", HOSTNAME_RULE)


def _check_path(value: object, what: str) -> str:
    if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value or os.path.normpath(value) != value:
        raise InvalidInput(f"invalid {what} {value!r}: must be a normalized absolute path")
    if any(c in value for c in "\n\r'\"\\ \t$`"):
        # The path reaches the guest's fstab and a shell script in the seed.
        raise InvalidInput(f"invalid {what} {value!r}: quotes, blanks and backslashes are not allowed")
    return value


@dataclass(frozen=True)
class Nic:
    """One guest NIC with a static IPv4 address.

    Exactly one of `network` (a libvirt network: the private NIC) and `bridge`
    (a host bridge: the public NIC) is set. `isolated`: the guest may send nothing
    to the other addresses of this NIC's subnet but the gateway (a private NIC
    with a gateway only; host_adapters/libvirt/nic_filters.py).
    """

    mac: str
    address: str  # IPv4
    prefix: int
    gateway: str | None = None
    dns: tuple[str, ...] = ()
    network: str | None = None
    bridge: str | None = None
    isolated: bool = False

    def __post_init__(self):
        check_mac(self.mac)
        try:
            ipaddress.IPv4Interface(f"{self.address}/{self.prefix}")
            for other in (self.gateway, *self.dns):
                if other is not None:
                    ipaddress.IPv4Address(other)
        except (ValueError, TypeError) as e:
            raise InvalidInput(f"invalid NIC address: {e}") from None
        if (self.network is None) == (self.bridge is None):
            raise InvalidInput("a NIC needs exactly one of network and bridge")
        if self.isolated and (self.network is None or self.gateway is None):
            raise InvalidInput("only a private NIC with a gateway can be isolated")
        for name in (self.network, self.bridge):
            if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise InvalidInput(f"invalid network or bridge name {name!r}")


@dataclass(frozen=True)
class GuestGroup:
    """A UNIX group made through the API, with the gid it has on the head node."""

    name: str
    gid: int

    def __post_init__(self):
        check_group_name(self.name)
        if isinstance(self.gid, bool) or not isinstance(self.gid, int) or self.gid < 1:
            raise InvalidInput(f"invalid gid {self.gid!r} of group {self.name}")


@dataclass(frozen=True)
class GuestUser:
    """A cluster account in the guest: same username, uid and primary gid as on the head node.

    `home` is the home directory (the volume's mount-point); `mounted` says
    whether the home volume is shared into the guest (the user has a volume).
    `groups` are names of GuestGroups of the spec. No password login.
    """

    username: str
    uid: int
    gid: int
    home: str
    mounted: bool
    groups: tuple[str, ...] = ()
    sudo: bool = False

    def __post_init__(self):
        check_username(self.username)
        for what, n in (("uid", self.uid), ("gid", self.gid)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidInput(f"invalid {what} {n!r} of user {self.username}")
        _check_path(self.home, f"home of {self.username}")
        for g in self.groups:
            check_group_name(g)


@dataclass(frozen=True, order=True)
class Share:
    """A head-node directory shared into the guest with virtiofs under `tag`."""

    tag: str
    source_dir: str

    def __post_init__(self):
        check_username(self.tag)
        _check_path(self.source_dir, "share directory")


@dataclass(frozen=True)
class GuestSpec:
    """Everything the guest gets from the controller besides its disk.

    Users and groups are sorted by name and NICs by MAC, so equal content
    means equal specs.
    """

    hostname: str
    nics: tuple[Nic, ...] = ()
    users: tuple[GuestUser, ...] = ()
    groups: tuple[GuestGroup, ...] = ()

    def __post_init__(self):
        check_hostname(self.hostname)
        object.__setattr__(self, "nics", tuple(sorted(self.nics, key=lambda n: n.mac)))
        object.__setattr__(self, "users", tuple(sorted(self.users, key=lambda u: u.username)))
        object.__setattr__(self, "groups", tuple(sorted(self.groups, key=lambda g: g.name)))
        names = [u.username for u in self.users]
        if len(set(names)) != len(names):
            raise InvalidInput("a user is given twice")
        known = {g.name for g in self.groups}
        for u in self.users:
            missing = set(u.groups) - known
            if missing:
                raise InvalidInput(f"user {u.username} is in unknown groups {sorted(missing)}")

    @property
    def shares(self) -> tuple[Share, ...]:
        """One virtiofs share per user whose home volume exists, tagged with the username."""
        return tuple(Share(u.username, u.home) for u in self.users if u.mounted)


@dataclass(frozen=True)
class Reservation:
    """A DHCP host entry of a libvirt network."""

    mac: str
    address: str
    hostname: str = field(default="")


# --- what the hypervisor adapters check and derive from a guest ----------------


def check_positive(**values: object) -> None:
    """Sizes (vCPUs, memory, disk, a base image's GiB): whole numbers of at least 1, bool refused."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, not {value!r}")


def check_guest(value: object) -> GuestSpec:
    if not isinstance(value, GuestSpec):
        raise InvalidInput(f"guest must be a GuestSpec, not {type(value).__name__}")
    return value


def reservations_for(guest: GuestSpec) -> tuple[Reservation, ...]:
    """The DHCP reservations an instance's private NICs need (public NICs are static only)."""
    return tuple(
        Reservation(mac=n.mac, address=n.address, hostname=guest.hostname) for n in guest.nics if n.network
    )
