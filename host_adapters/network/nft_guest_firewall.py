"""The guests' NIC rules in an nftables table of the host (nft_ruleset.py), written by `nft -f -`.

Where the command runs (guest_firewall_choice.py picks the channel by the libvirt reached):
- this machine: in the network namespace that holds the guests' bridges. That is the
  namespace of the libvirt daemon serving the host's URI, found from the peer credentials of
  its unix socket (`sockets`, tried in order) when its /proc entry can be read (as an
  unconfined root can: a libvirtd in a namespace of its own, as the tests start one, is
  entered with `nsenter --net`). Under the shipped systemd unit (no CAP_SYS_PTRACE) or in a
  container (the daemon's PID is not in ours) that entry cannot be read: then the rules go to
  our own namespace only if the guests' bridge (`locate`) is in it. A namespace that is
  neither read nor proven is an error, never "ours": rules written where no tap is would be
  read back there and look fine.
- another host: over ssh as root (SshHostFiles.argv), the channel its console files use.

Whatever the channel, `present()` lists the guests' taps where the rules go, so the driver
checks after each start, and the host check for every running guest, that the taps are
where their rules are.
"""

import json
import os
import shlex
import socket
import struct
from collections.abc import Sequence

from common.errors import CommandError, HostError, HostUnavailable
from host_adapters import subp
from host_adapters.network import bridge_ports, nft_ruleset
from host_adapters.network.guest_firewall import HOOK_PATH, GuestFirewall, NicRules, is_tap
from host_adapters.files.ssh_host_files import SshHostFiles

NFT_TIMEOUT = 30.0  # seconds for one transaction or listing, ssh's connection included
_NOT_INSTALLED = 127
_HERE = "this machine"


def daemon_pid(path: str) -> int | None:
    """The PID of the process listening on the unix socket `path`; None when nothing answers,
    or when that process is not in our PID namespace (the kernel then says 0)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid = struct.unpack("3i", creds)[0]
    return pid if pid > 0 else None


def namespace_prefix(sockets: Sequence[str]) -> list[str] | None:
    """`nsenter --net=...` into the network namespace of the daemon behind the first socket
    that answers when it is not ours, [] when it is ours, None when that cannot be read (no
    daemon answers, its PID is not in our namespace, or /proc refuses us)."""
    for path in sockets:
        pid = daemon_pid(path)
        if pid is None:
            continue
        ns = f"/proc/{pid}/ns/net"
        try:
            if os.readlink(ns) == os.readlink("/proc/self/ns/net"):
                return []
        except OSError:
            return None  # gone meanwhile, or not ours to read
        return ["nsenter", f"--net={ns}", "--"]
    return None


def _interfaces_here() -> set[str]:
    """The network interfaces of this process's own namespace (no program started)."""
    return {name for _, name in socket.if_nameindex()}


class NftGuestFirewall(GuestFirewall):
    """`sockets`: this machine's libvirt sockets to find the daemon's namespace by (local);
    `ssh`: the channel to another host (remote). One of the two."""

    def __init__(self, *, sockets: Sequence[str] = (), ssh: SshHostFiles | None = None,
                 timeout: float = NFT_TIMEOUT):
        self.sockets, self.ssh, self.timeout = tuple(sockets), ssh, timeout
        self.where = ssh.where if ssh is not None else _HERE
        self.bridges: tuple[str, ...] = ()

    def locate(self, bridges: Sequence[str]) -> None:
        self.bridges = tuple(bridge_ports.check_bridge_name(b) for b in bridges)

    def _prefix(self) -> list[str]:
        """The argv prefix that runs a command where the guests' bridges are (local only)."""
        found = namespace_prefix(self.sockets)
        if found is not None:
            return found
        here = _interfaces_here()
        if self.bridges and all(b in here for b in self.bridges):
            return []
        named = ", ".join(self.bridges) or "(none known yet: the host check names it)"
        raise HostUnavailable(
            "cannot tell which network namespace holds the guests' bridges on this machine: libvirt's "
            f"daemon cannot be looked up from here, and its bridge {named} is not in this process's "
            "namespace; run the service in the network namespace of libvirtd")

    def _argv(self, args: list[str], prefix: list[str] | None = None) -> list[str]:
        if self.ssh is not None:
            return self.ssh.argv(" ".join(shlex.quote(a) for a in args))
        return [*(self._prefix() if prefix is None else prefix), *args]

    def _run(self, what: str, args: list[str], text: str | None = None, prefix: list[str] | None = None) -> str:
        argv = self._argv(args, prefix)
        try:
            return subp.run(argv, input=text, timeout=self.timeout).stdout
        except CommandError as e:
            detail = (e.stderr or "").strip().splitlines()[-3:] or [f"exit code {e.returncode}"]
            if e.returncode == _NOT_INSTALLED or "command not found" in (e.stderr or ""):
                raise HostUnavailable(f"cannot {what} on {self.where}: {args[0]} is not installed there "
                                      "(Debian: the packages nftables and iproute2)") from None
            if self.ssh is not None and e.returncode == 255:
                raise HostUnavailable(f"cannot {what} on {self.where} over ssh ({detail[-1]}): the guests' "
                                      "network rules are written over ssh as root; accept the head node's "
                                      "root ssh key there") from None
            raise HostError(f"cannot {what} on {self.where}: {' '.join(detail)}") from None
        except HostUnavailable as e:  # subp: the program is missing here
            raise HostUnavailable(f"cannot {what} on {self.where}: {e.message} "
                                  "(Debian: the packages nftables, iproute2 and util-linux)") from None

    def allow(self, nics: tuple[NicRules, ...]) -> None:
        self._run("write the guests' network rules", ["nft", "-f", "-"], nft_ruleset.batch(add=tuple(nics)))

    def forget(self, nics: tuple[NicRules, ...]) -> None:
        if nics:
            self._run("remove guests' network rules", ["nft", "-f", "-"], nft_ruleset.batch(remove=tuple(nics)))

    def replace(self, old: tuple[NicRules, ...], new: tuple[NicRules, ...]) -> None:
        kept = set(new)
        gone = tuple(n for n in old if n not in kept)
        self._run("replace guests' network rules", ["nft", "-f", "-"], nft_ruleset.batch(add=tuple(new), remove=gone))

    def allowed(self) -> set[NicRules]:
        try:
            listing = self._run("list the guests' network rules", nft_ruleset.list_argv())
        except HostError as e:
            if "No such file or directory" in e.message:
                return set()  # no table yet
            raise
        return nft_ruleset.parse(listing)

    def present(self, taps: Sequence[str]) -> set[str]:
        wanted = {t for t in taps if is_tap(t)}
        if not wanted:
            return set()
        if self.ssh is None:
            prefix = self._prefix()
            if not prefix:
                return wanted & _interfaces_here()
        else:
            prefix = None
        listing = self._run("list the guests' taps", ["ip", "-j", "link", "show"], prefix=prefix)
        try:
            names = {link.get("ifname") for link in json.loads(listing or "[]")}
        except (ValueError, AttributeError):
            raise HostError(f"ip listed the interfaces of {self.where} in a form this version does not read") from None
        return wanted & names

    def seal(self, bridges: Sequence[str]) -> None:
        for bridge in bridges:
            show = bridge_ports.show_argv(bridge)
            if not bridge_ports.learns_link_local(self._run(f"read bridge {bridge}", show)):
                continue
            self._run(f"stop bridge {bridge} learning from link-local frames", bridge_ports.seal_argv(bridge))
            if bridge_ports.learns_link_local(self._run(f"read bridge {bridge}", show)):
                raise HostUnavailable(f"bridge {bridge} on {self.where} still learns MAC addresses from "
                                      "link-local frames (no_linklocal_learn): this kernel is too old")

    def hooked(self) -> bool:
        if self.ssh is None:
            # The hook is read by libvirtd from this machine's /etc, which the service sees too.
            return os.access(HOOK_PATH, os.X_OK)
        try:
            self._run("look for the libvirt hook", ["test", "-x", HOOK_PATH])
        except HostUnavailable:
            raise
        except HostError:
            return False
        return True
