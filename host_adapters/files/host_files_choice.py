"""Which channel reaches a hypervisor host's files (host_files.py), from its libvirt URI.

- libvirt's test driver (`test:///default`, `test+unix://...`): memory, as its host is;
- this machine (`qemu:///system`, `qemu+unix:///system`, or any transport to a loopback
  address or `localhost`, such as `qemu+tcp://127.0.0.1:16509/system`, to this machine's
  own host name, or to an address of one of its interfaces): the files directly;
- `qemu+ssh://[user@]host[:port]/...` (libssh and libssh2 too): ssh as that user (root by
  default) to that port;
- any other remote transport (`qemu+tls://host/...`, `qemu+tcp://host/...`): ssh to the
  host as root on ssh's own port: such a host needs the head node's root key accepted
  there for its consoles (docs/guests.md).

Kept apart from factory.py (which uses it beside its other checks of a URI) because the
libvirt adapter chooses its default channel here, and factory.py imports the adapter.
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from common.errors import InvalidInput
from host_adapters.files.fake_host_files import FakeHostFiles
from host_adapters.files.host_files import HostFiles
from host_adapters.files.local_host_files import LocalHostFiles
from host_adapters.files.ssh_host_files import SshHostFiles

_SSH = ("ssh", "libssh", "libssh2")


def is_this_machine(hostname: str) -> bool:
    """Whether a URI's host is this machine, without asking DNS (which may hang): a loopback
    name or address, this machine's own host name, or an address of one of its interfaces
    (an address binds only where it is an interface's)."""
    name = hostname.lower().rstrip(".")
    if name in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    own = socket.gethostname().lower()
    if name in (own, own.split(".")[0]) or (name.startswith(own + ".") if "." not in own else False):
        return True
    try:
        address = ipaddress.ip_address(hostname)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
        return True
    except OSError:
        return False


def host_files_for(uri: str) -> HostFiles:
    """The channel to the files of the host that `uri` reaches."""
    parts = urlsplit(uri)
    if parts.scheme.partition("+")[0] == "test":
        return FakeHostFiles()
    hostname = parts.hostname
    if not hostname or is_this_machine(hostname):
        return LocalHostFiles()
    return ssh_channel_for(uri)


def ssh_channel_for(uri: str) -> SshHostFiles:
    """ssh to the host of a remote `uri`: as its user on its port for `qemu+ssh://` (libssh,
    libssh2), else as root on ssh's own port."""
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"libvirt URI {uri!r} has no valid port") from None
    if parts.scheme.partition("+")[2].lower() in _SSH:
        return SshHostFiles(parts.hostname, user=parts.username or None, port=port)
    return SshHostFiles(parts.hostname, user="root")
