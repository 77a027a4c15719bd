"""What a guest NIC may send and receive, kept by the controller on each hypervisor host.

The guest's root controls what its NICs send, so the host filters each NIC's frames where
the guest cannot reach: in the bridge the NIC's tap is a port of. The rules are the same
for every NIC; what differs is kept per NIC as its NicRules (its tap, MAC and IPv4 address,
and for an isolated NIC its gateway and subnet). The guarantees (docs/decisions.md, "Guest
network rules"):

- from the guest: IPv4 only from its own MAC and address (or a DHCP request from 0.0.0.0),
  ARP (Ethernet/IPv4 only) only naming its own MAC and address; nothing else (no IPv6,
  hence no DHCPv6 nor router advertisement, no VLAN tags, no other protocol). No DHCP
  server reply (UDP 67 to 68), even from its own address. These checks also meet the
  frames a port hands to the host itself, link-local group frames (01:80:c2:00:00:02 to
  0d) among them, before the bridge learns their source MAC;
- to the guest: unicast IPv4 to its own MAC only (not what the bridge floods, nor what
  reaches its port for a MAC it took), IPv4 to group addresses, and ARP asking for its
  address; nothing else;
- an isolated NIC also sends nothing to the rest of its subnet but its gateway, and nothing
  to broadcast or multicast addresses; and no frame passes between its tap and another
  guest's tap on the bridge, either way, whatever address is inside (the gateway, the
  bridge itself or a port not a guest's, is still reached);
- the bridges with guest taps learn no MAC from link-local frames (bridge_ports.py): STP
  frames (with STP on) and LLDP frames reach no hook of the table.

A NIC with no rules written sends nothing (fail closed). The implementations: an nftables
table on the host (nft_guest_firewall.py, whose text is nft_ruleset.py) and a fake in memory
(fake_guest_firewall.py); guest_firewall_choice.py picks one for a libvirt URI.

Why not libvirt's nwfilter, which earlier versions used: libvirt applies a NIC's filter with
about 60 firewall commands, one NIC at a time for the whole host, which set the pace of a
burst of creates (docs/performance.md). One nft transaction writes a NIC's rules in a few
milliseconds, and transactions of many NICs run side by side.
"""

import abc
import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from common.errors import InvalidInput

# The libvirt qemu hook that writes a guest's rules inside each start of its domain
# (libvirt/guest_rules_hook.py); libvirt runs every executable of this folder, in name order.
HOOK_PATH = "/etc/libvirt/hooks/qemu.d/cloud-controller"

# The tap of a guest NIC: "cc-", then the host's tag and the MAC's last 6 hex digits (tap_name).
# Linux allows 15 characters for an interface's name.
TAP_PREFIX = "cc-"
_TAP = re.compile(r"cc-(?:[0-9a-f]{5}-[0-9a-f]{6}|[0-9a-f]{12})")
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")


def host_tag(uri: str) -> str:
    """5 hex digits of a host's libvirt URI, part of its taps' names: two libvirt daemons of
    one machine share its network, and a guest moved between them (or rebuilt on one while
    the QEMU of the other still holds its tap) needs a name of its own on each."""
    return hashlib.sha256(uri.encode()).hexdigest()[:5]


def tap_name(mac: str, tag: str | None = None) -> str:
    """The tap of the NIC with `mac` on the host tagged `tag` (host_tag): 15 characters at most."""
    mac = check_mac(mac)
    digits = mac.replace(":", "")
    if tag is None:
        return TAP_PREFIX + digits
    if not re.fullmatch(r"[0-9a-f]{5}", tag):
        raise InvalidInput(f"not a host tag: {tag!r}")
    return f"{TAP_PREFIX}{tag}-{digits[6:]}"


def is_tap(name: str) -> bool:
    return isinstance(name, str) and bool(_TAP.fullmatch(name))


def check_mac(mac: str) -> str:
    if not isinstance(mac, str) or not _MAC.fullmatch(mac.lower()):
        raise InvalidInput(f"not a MAC address: {mac!r}")
    return mac.lower()


@dataclass(frozen=True)
class NicRules:
    """One NIC's part of the rules. `gateway` and `subnet` (an IPv4 network) are set for an
    isolated NIC only."""

    tap: str
    mac: str
    address: str
    gateway: str | None = None
    subnet: str | None = None

    def __post_init__(self):
        # Every field reaches the host's nft as text: checked here, once, for every implementation.
        if not is_tap(self.tap):
            raise InvalidInput(f"not a guest tap name: {self.tap!r}")
        object.__setattr__(self, "mac", check_mac(self.mac))
        object.__setattr__(self, "address", str(_ipv4(self.address, "address")))
        if (self.gateway is None) != (self.subnet is None):
            raise InvalidInput("an isolated NIC has both a gateway and a subnet")
        if self.gateway is not None:
            object.__setattr__(self, "gateway", str(_ipv4(self.gateway, "gateway")))
            try:
                net = ipaddress.IPv4Network(self.subnet)
            except (ValueError, TypeError):
                raise InvalidInput(f"not an IPv4 subnet: {self.subnet!r}") from None
            object.__setattr__(self, "subnet", str(net))

    @property
    def isolated(self) -> bool:
        return self.gateway is not None


def _ipv4(value, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except (ValueError, TypeError):
        raise InvalidInput(f"not an IPv4 {what}: {value!r}") from None


class GuestFirewall(abc.ABC):
    """The NIC rules of one hypervisor host."""

    @abc.abstractmethod
    def allow(self, nics: tuple[NicRules, ...]) -> None:
        """Write the rules of `nics`, and the table they belong to when missing or changed, in
        one transaction: all or nothing. Idempotent. Called before a guest starts."""

    @abc.abstractmethod
    def forget(self, nics: tuple[NicRules, ...]) -> None:
        """Remove the rules of `nics`; those already gone are no error. Called after a guest's
        domain is removed."""

    @abc.abstractmethod
    def replace(self, old: tuple[NicRules, ...], new: tuple[NicRules, ...]) -> None:
        """Remove the rules of `old` and write those of `new`, in one transaction."""

    @abc.abstractmethod
    def allowed(self) -> set[NicRules]:
        """The NIC rules the host holds now (for checks and tests)."""

    @abc.abstractmethod
    def present(self, taps: Sequence[str]) -> set[str]:
        """Which of `taps` exist where the rules are written: a running guest's tap missing
        there means its rules went somewhere its frames never pass."""

    @abc.abstractmethod
    def seal(self, bridges: Sequence[str]) -> None:
        """Make `bridges` learn no MAC address from link-local frames (bridge_ports.py);
        HostUnavailable where that cannot be done."""

    @abc.abstractmethod
    def hooked(self) -> bool:
        """Whether the host runs the libvirt hook that writes a guest's rules inside every
        start of its domain (libvirt/guest_rules_hook.py), whoever starts it."""

    def locate(self, bridges: Sequence[str]) -> None:
        """The guests' bridges on the host, where an implementation needs them to find where
        the rules go (nft_guest_firewall.py)."""
