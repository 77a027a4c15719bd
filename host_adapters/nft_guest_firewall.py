"""The guests' NIC rules in an nftables table of the host (nft_ruleset.py), written by `nft -f -`.

Where the command runs:
- this machine: in the network namespace of the libvirt daemon that serves the host's URI,
  found from the peer credentials of its unix socket (`sockets`, tried in order). The guests'
  bridges are in the daemon's namespace, and it differs from ours in a container, or when a
  libvirtd was started in a namespace of its own (as the tests do); then `nsenter --net`
  enters it. With no socket answering, `nft` runs here as it is.
- another host: over ssh as root (SshHostFiles.argv), the channel its console files use.
"""

import os
import shlex
import socket
import struct
from collections.abc import Sequence

from common.errors import CommandError, HostError, HostUnavailable
from host_adapters import nft_ruleset, subp
from host_adapters.guest_firewall import GuestFirewall, NicRules
from host_adapters.ssh_host_files import SshHostFiles

NFT_TIMEOUT = 30.0  # seconds for one transaction or listing, ssh's connection included
_NOT_INSTALLED = 127


def daemon_pid(path: str) -> int | None:
    """The PID of the process listening on the unix socket `path`; None when nothing answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid = struct.unpack("3i", creds)[0]
    return pid if pid > 0 else None


def namespace_prefix(sockets: Sequence[str]) -> list[str]:
    """`nsenter --net=...` into the network namespace of the daemon behind the first socket
    that answers, when it is not ours; nothing otherwise."""
    for path in sockets:
        pid = daemon_pid(path)
        if pid is None:
            continue
        ns = f"/proc/{pid}/ns/net"
        try:
            if os.readlink(ns) == os.readlink("/proc/self/ns/net"):
                return []
        except OSError:
            return []  # gone meanwhile, or not ours to read: the namespace we are in
        return ["nsenter", f"--net={ns}", "--"]
    return []


class NftGuestFirewall(GuestFirewall):
    """`sockets`: this machine's libvirt sockets to find the daemon's namespace by (local);
    `ssh`: the channel to another host (remote). One of the two."""

    def __init__(self, *, sockets: Sequence[str] = (), ssh: SshHostFiles | None = None,
                 timeout: float = NFT_TIMEOUT):
        self.sockets, self.ssh, self.timeout = tuple(sockets), ssh, timeout
        self.where = ssh.where if ssh is not None else "this machine"

    def _argv(self, nft_args: list[str]) -> list[str]:
        if self.ssh is not None:
            return self.ssh.argv(" ".join(shlex.quote(a) for a in nft_args))
        return [*namespace_prefix(self.sockets), *nft_args]

    def _run(self, what: str, nft_args: list[str], text: str | None = None) -> str:
        try:
            return subp.run(self._argv(nft_args), input=text, timeout=self.timeout).stdout
        except CommandError as e:
            detail = (e.stderr or "").strip().splitlines()[-3:] or [f"exit code {e.returncode}"]
            if e.returncode == _NOT_INSTALLED or "command not found" in (e.stderr or ""):
                raise HostUnavailable(f"cannot {what} on {self.where}: nft is not installed there "
                                      "(Debian: the package nftables)") from None
            if self.ssh is not None and e.returncode == 255:
                raise HostUnavailable(f"cannot {what} on {self.where} over ssh ({detail[-1]}): the guests' "
                                      "network rules are written over ssh as root; accept the head node's "
                                      "root ssh key there") from None
            raise HostError(f"cannot {what} on {self.where}: {' '.join(detail)}") from None
        except HostUnavailable as e:  # subp: the program is missing here
            raise HostUnavailable(f"cannot {what} on {self.where}: {e.message} "
                                  "(Debian: the packages nftables and util-linux)") from None

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
