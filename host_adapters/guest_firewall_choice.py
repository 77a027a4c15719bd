"""Which GuestFirewall writes the NIC rules of a hypervisor host, from its libvirt URI: the
host that the URI's console files channel reaches (host_files_choice.py) is the host whose
network the guests are on.

- libvirt's test driver: the fake, in memory (its guests run nowhere);
- this machine: `nft` here, in the network namespace of the libvirt daemon behind the URI's
  unix socket (`?socket=`), or behind the system daemon's sockets (SYSTEM_SOCKETS) for
  `qemu:///system` and for a TCP or TLS transport to this machine (its daemons share one
  network: a second libvirtd on this machine is a test's or a drill's);
- another host: `nft` over ssh as root (or as the user of a `qemu+ssh://` URI).
"""

from urllib.parse import parse_qs, urlsplit

from host_adapters.fake_guest_firewall import FakeGuestFirewall
from host_adapters.fake_host_files import FakeHostFiles
from host_adapters.guest_firewall import GuestFirewall
from host_adapters.host_files_choice import host_files_for
from host_adapters.nft_guest_firewall import NftGuestFirewall
from host_adapters.ssh_host_files import SshHostFiles

# The modular daemon's socket first (libvirt 9 and newer default to it), then libvirtd's.
SYSTEM_SOCKETS = ("/run/libvirt/virtqemud-sock", "/run/libvirt/libvirt-sock")


def guest_firewall_for(uri: str) -> GuestFirewall:
    files = host_files_for(uri)
    if isinstance(files, FakeHostFiles):
        return FakeGuestFirewall()
    if isinstance(files, SshHostFiles):
        return NftGuestFirewall(ssh=files)
    socket = parse_qs(urlsplit(uri).query).get("socket")
    return NftGuestFirewall(sockets=(socket[0],) if socket else SYSTEM_SOCKETS)
