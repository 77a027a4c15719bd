"""The guests' NIC rules in the real kernel: NftGuestFirewall writing its nftables table into
the network namespace of a "daemon" (a process listening on a unix socket, as libvirtd does),
where a bridge has veth ports named as our taps, each with a "guest" namespace behind it.

What is checked is what a guest can send and receive (guest_firewall.py): frames are sent
from the guests' namespaces by their own kernels (UDP) or raw (ARP), and seen, or not, by a
receiver in another guest or on the bridge itself.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from common.errors import HostError
from host_adapters.guest_firewall import NicRules, tap_name
from host_adapters.nft_guest_firewall import NftGuestFirewall, daemon_pid, namespace_prefix
from host_adapters.nft_ruleset import FAMILY, TABLE

pytestmark = [pytest.mark.real_commands, pytest.mark.integration]

GATEWAY, SUBNET = "10.77.0.1", "10.77.0.0/24"
TAG = "0a1b2"


def _run(*argv, check=True, timeout=20, input=None):
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout, input=input)


class Guest:
    def __init__(self, ns: str, mac: str, address: str):
        self.ns, self.mac, self.address = ns, mac, address
        self.tap = tap_name(mac, TAG)

    def rules(self, *, isolated: bool = False) -> NicRules:
        if isolated:
            return NicRules(tap=self.tap, mac=self.mac, address=self.address, gateway=GATEWAY, subnet=SUBNET)
        return NicRules(tap=self.tap, mac=self.mac, address=self.address)

    def python(self, code: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.ns, sys.executable, "-c", code, *args, check=False, timeout=timeout)


class Lab:
    """A host namespace with bridge `br0` (the gateway's address) and a daemon in it; guests
    behind veths named as taps."""

    def __init__(self):
        self.id = uuid.uuid4().hex[:6]
        self.host = f"cc-fw-{self.id}"
        self.namespaces = [self.host]
        self.folder = tempfile.mkdtemp(prefix="cc-fw-")
        self.socket = os.path.join(self.folder, "daemon.sock")
        self.daemon = None
        _run("ip", "netns", "add", self.host)
        self.exec("ip", "link", "set", "lo", "up")
        self.exec("ip", "link", "add", "br0", "type", "bridge")
        self.exec("ip", "addr", "add", f"{GATEWAY}/24", "dev", "br0")
        self.exec("ip", "link", "set", "br0", "up")
        self.guests = [self.guest(n) for n in (1, 2)]
        # The "daemon": what NftGuestFirewall finds by the socket's peer, as it finds libvirtd.
        listen = ("import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\n"
                  "while True: s.accept()[0].close()")
        self.daemon = subprocess.Popen(["ip", "netns", "exec", self.host, sys.executable, "-c", listen, self.socket])
        deadline = time.monotonic() + 10
        while daemon_pid(self.socket) is None:
            assert time.monotonic() < deadline, "the test daemon did not listen"
            time.sleep(0.05)
        self.firewall = NftGuestFirewall(sockets=(self.socket,))

    def exec(self, *argv, check=True):
        return _run("ip", "netns", "exec", self.host, *argv, check=check)

    def guest(self, n: int) -> Guest:
        g = Guest(f"{self.host}-g{n}", f"52:54:00:00:00:{n:02x}", f"10.77.0.{10 + n}")
        _run("ip", "netns", "add", g.ns)
        self.namespaces.append(g.ns)
        self.exec("ip", "link", "add", g.tap, "type", "veth", "peer", "name", "eth0", "netns", g.ns)
        self.exec("ip", "link", "set", g.tap, "master", "br0")
        self.exec("ip", "link", "set", g.tap, "up")
        for argv in (("link", "set", "lo", "up"), ("link", "set", "eth0", "address", g.mac),
                     ("addr", "add", f"{g.address}/24", "dev", "eth0"), ("link", "set", "eth0", "up")):
            _run("ip", "netns", "exec", g.ns, "ip", *argv)
        return g

    def close(self):
        if self.daemon is not None:
            self.daemon.kill()
            self.daemon.wait(10)
        for ns in reversed(self.namespaces):
            _run("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def lab():
    for binary in ("ip", "nft", "nsenter"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing; scripts/setup-host.sh installs iproute2, nftables and util-linux")
    made = Lab()
    try:
        yield made
    finally:
        made.close()


_RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 4789))
s.settimeout(float(sys.argv[1]))
print("ready", flush=True)
try:
    print(s.recvfrom(100)[0].decode())
except socket.timeout:
    print("nothing")
"""

_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[3]:
    s.bind((sys.argv[3], 0))
for _ in range(10):  # the first may wait for ARP
    try:
        s.sendto(sys.argv[2].encode(), (sys.argv[1], 4789))
    except OSError:
        pass
    time.sleep(0.1)
"""


def delivered(sender: Guest, to: str, *, receiver_ns: str, source: str = "") -> bool:
    """Whether UDP from `sender` (from `source`, else its address) to `to` reaches a receiver
    in `receiver_ns`."""
    word = uuid.uuid4().hex[:8]
    recv = subprocess.Popen(["ip", "netns", "exec", receiver_ns, sys.executable, "-c", _RECEIVE, "3"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        sender.python(_SEND, to, word, source)
        out, _ = recv.communicate(timeout=10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return word in out


_ARP = """
import socket, struct, sys
mac = bytes.fromhex(sys.argv[1].replace(":", ""))
claimed = socket.inet_aton(sys.argv[2])
target = socket.inet_aton(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + claimed + b"\\0" * 6 + target
for _ in range(5):
    s.send(b"\\xff" * 6 + mac + b"\\x08\\x06" + arp)
"""

_SEE_ARP = """
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("br0", 0))
s.settimeout(0.2)
print("ready", flush=True)
claimed = socket.inet_aton(sys.argv[1])
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        frame = s.recv(100)
    except socket.timeout:
        continue
    if frame[28:32] == claimed:
        print("seen")
        break
else:
    print("nothing")
"""


def arp_seen(lab: Lab, sender: Guest, claimed: str) -> bool:
    """Whether an ARP request from `sender` naming `claimed` as its address reaches the bridge."""
    watch = subprocess.Popen(["ip", "netns", "exec", lab.host, sys.executable, "-c", _SEE_ARP, claimed, "2"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert watch.stdout.readline().strip() == "ready"
        sender.python(_ARP, sender.mac, claimed, GATEWAY)
        out, _ = watch.communicate(timeout=10)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    return "seen" in out


def test_a_nic_sends_only_from_its_own_mac_and_address(lab):
    g1, g2 = lab.guests
    # Before the table: the bridge passes everything (what a guest started elsewhere would do).
    assert delivered(g1, g2.address, receiver_ns=g2.ns)
    lab.firewall.allow(())  # the table, no NIC's elements: a NIC of ours sends nothing
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)
    lab.firewall.allow((g1.rules(), g2.rules()))
    assert delivered(g1, g2.address, receiver_ns=g2.ns)
    assert delivered(g2, g1.address, receiver_ns=g1.ns)
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)
    # Another address of the guest's own choosing.
    _run("ip", "netns", "exec", g1.ns, "ip", "addr", "add", "10.77.0.99/24", "dev", "eth0")
    assert not delivered(g1, g2.address, receiver_ns=g2.ns, source="10.77.0.99")
    # Another MAC.
    _run("ip", "netns", "exec", g1.ns, "ip", "link", "set", "eth0", "address", "52:54:00:00:00:77")
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)


def test_arp_names_only_the_nics_own_address(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(), g2.rules()))
    assert arp_seen(lab, g1, g1.address)
    assert not arp_seen(lab, g1, g2.address)  # claiming another guest's address


def test_an_isolated_nic_reaches_its_gateway_only(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(isolated=True), g2.rules()))
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)
    assert not delivered(g1, "10.77.0.255", receiver_ns=g2.ns)  # the subnet's broadcast
    assert delivered(g2, g1.address, receiver_ns=g1.ns)  # it still receives IPv4
    # Back to clean (set_guest): it reaches the other guest again.
    lab.firewall.replace((g1.rules(isolated=True),), (g1.rules(),))
    assert delivered(g1, g2.address, receiver_ns=g2.ns)


def test_the_table_is_written_in_the_daemons_namespace_and_read_back(lab):
    g1, g2 = lab.guests
    assert namespace_prefix((lab.socket,))[:2] == ["nsenter", f"--net=/proc/{daemon_pid(lab.socket)}/ns/net"]
    assert namespace_prefix((os.path.join(lab.folder, "none.sock"),)) == []
    assert lab.firewall.allowed() == set()
    wanted = {g1.rules(isolated=True), g2.rules()}
    lab.firewall.allow(tuple(wanted))
    lab.firewall.allow(tuple(wanted))  # again: no error, nothing doubled
    assert lab.firewall.allowed() == wanted
    listing = lab.exec("nft", "list", "set", FAMILY, TABLE, "nic_source").stdout
    assert listing.count(g1.tap) == 1
    # Not in this process's own namespace.
    assert _run("nft", "list", "table", FAMILY, TABLE, check=False).returncode != 0


def test_removal_is_whole_and_a_missing_element_is_no_error(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(isolated=True), g2.rules()))
    lab.firewall.forget((g1.rules(isolated=True),))
    assert lab.firewall.allowed() == {g2.rules()}
    assert "cc-" not in lab.exec("nft", "list", "set", FAMILY, TABLE, "isolated").stdout
    lab.firewall.forget((g1.rules(isolated=True),))  # already gone: no error
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)
    assert delivered(g2, GATEWAY, receiver_ns=lab.host)


def test_a_table_an_admin_emptied_is_whole_again_after_the_next_write(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(),))
    lab.exec("nft", "flush", "chain", FAMILY, TABLE, "from_guest")
    lab.exec("nft", "flush", "chain", FAMILY, TABLE, "to_guest")
    lab.firewall.allow((g2.rules(),))
    _run("ip", "netns", "exec", g1.ns, "ip", "addr", "add", "10.77.0.99/24", "dev", "eth0")
    assert not delivered(g1, g2.address, receiver_ns=g2.ns, source="10.77.0.99")
    assert delivered(g1, g2.address, receiver_ns=g2.ns)


def test_a_failed_transaction_is_a_host_error_and_changes_nothing(lab, monkeypatch):
    g1, _ = lab.guests
    lab.firewall.allow((g1.rules(),))
    from host_adapters import nft_ruleset

    real = nft_ruleset.batch
    monkeypatch.setattr(nft_ruleset, "batch", lambda **kw: real(**kw) + "add element bridge cloud_controller nope { 1 }\n")
    with pytest.raises(HostError, match="cannot write the guests' network rules on this machine"):
        lab.firewall.allow((lab.guests[1].rules(),))
    monkeypatch.undo()
    assert lab.firewall.allowed() == {g1.rules()}
