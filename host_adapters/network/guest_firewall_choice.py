"""Which GuestFirewall writes the NIC rules of a hypervisor host, from its libvirt URI.

Decided by how the URI reaches libvirt, never by what its host name or address looks like:
a name can mean another machine in another DNS domain, and an address can bind here
without being this machine's (`net.ipv4.ip_nonlocal_bind=1` on HA head nodes), which would
send a remote host's rules to the head node's table.

- libvirt's test driver: the fake, in memory (its guests run nowhere);
- a unix socket (`qemu:///system`, `qemu+unix:///...`) or a TCP/TLS/ssh transport to a
  loopback address or `localhost`: a libvirt of this kernel, so `nft` here, in the network
  namespace of the daemon behind the URI's unix socket (`?socket=`) or behind the system
  daemon's sockets (SYSTEM_SOCKETS) (nft_guest_firewall.py: where, exactly);
- any other host, even one that names this machine: `nft` over ssh as root (or as the user
  of a `qemu+ssh://` URI). Name the head node's own libvirt `qemu:///system`.
"""

import ipaddress
from urllib.parse import parse_qs, urlsplit

from host_adapters.network.fake_guest_firewall import FakeGuestFirewall
from host_adapters.network.guest_firewall import GuestFirewall
from host_adapters.network.nft_guest_firewall import NftGuestFirewall
from host_adapters.files.host_files_choice import ssh_channel_for

# The modular daemon's socket first (libvirt 9 and newer default to it), then libvirtd's.
SYSTEM_SOCKETS = ("/run/libvirt/virtqemud-sock", "/run/libvirt/libvirt-sock")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def reaches_this_kernel(hostname: str | None) -> bool:
    """Whether a URI with this host part reaches a libvirt of this machine's kernel: none (a
    unix socket), a loopback name or a loopback address. Nothing else is taken for it."""
    if not hostname:
        return True
    if hostname.lower().rstrip(".") in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def guest_firewall_for(uri: str) -> GuestFirewall:
    parts = urlsplit(uri)
    if parts.scheme.partition("+")[0] == "test":
        return FakeGuestFirewall()
    if reaches_this_kernel(parts.hostname):
        socket = parse_qs(parts.query).get("socket")
        return NftGuestFirewall(sockets=(socket[0],) if socket else SYSTEM_SOCKETS)
    return NftGuestFirewall(ssh=ssh_channel_for(uri))
