"""The guests' NIC rules in the real kernel: NftGuestFirewall writing its nftables table into
the network namespace of a "daemon" (a process listening on a unix socket, as libvirtd does),
where a bridge has veth ports named as our taps, each with a "guest" namespace behind it.

What is checked is what a guest can send and receive (guest_firewall.py): frames are sent
from the guests' namespaces by their own kernels (UDP) or raw (ARP, link-local frames, IPv4
to a MAC nobody has), and seen, or not, by a receiver in another guest or on the bridge itself.
"""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from common.errors import HostError
from host_adapters.network import bridge_ports, nft_ruleset
from host_adapters.network.guest_firewall import NicRules, tap_name
from host_adapters.network.nft_guest_firewall import NftGuestFirewall, daemon_pid, namespace_prefix
from host_adapters.network.nft_ruleset import FAMILY, TABLE

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
    behind veths named as taps. Each lab's MACs (hence taps) are its own. `close()` undoes
    whatever was made, even by a constructor that failed half-way (the fixture calls it)."""

    def __init__(self):
        self.id = uuid.uuid4().hex[:6]
        self.host = f"cc-fw-{self.id}"
        self.namespaces: list[str] = []
        self.guests: list[Guest] = []
        self.folder = tempfile.mkdtemp(prefix="cc-fw-")
        self.socket = os.path.join(self.folder, "daemon.sock")
        self.daemon = None
        self.firewall = None
        self.stp = False

    def start(self, *, guests: int = 2, stp: bool = False):
        self.stp = stp
        _run("ip", "netns", "add", self.host)
        self.namespaces.append(self.host)
        self.exec("ip", "link", "set", "lo", "up")
        self.exec("ip", "link", "add", "br0", "type", "bridge")
        self.exec("ip", "addr", "add", f"{GATEWAY}/24", "dev", "br0")
        self.exec("ip", "link", "set", "br0", "up")
        self.guests = [self.guest(n) for n in range(1, guests + 1)]
        if stp:
            self.stp_on()
        # The "daemon": what NftGuestFirewall finds by the socket's peer, as it finds libvirtd.
        listen = ("import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\n"
                  "while True: s.accept()[0].close()")
        self.daemon = subprocess.Popen(["ip", "netns", "exec", self.host, sys.executable, "-c", listen, self.socket])
        deadline = time.monotonic() + 10
        while daemon_pid(self.socket) is None:
            assert time.monotonic() < deadline, "the test daemon did not listen"
            time.sleep(0.05)
        self.firewall = NftGuestFirewall(sockets=(self.socket,))
        return self

    def exec(self, *argv, check=True):
        return _run("ip", "netns", "exec", self.host, *argv, check=check)

    def guest(self, n: int) -> Guest:
        # The MAC's last three bytes name the tap: two of them from the lab's id.
        mac = f"52:54:00:{self.id[:2]}:{self.id[2:4]}:{n:02x}"
        g = Guest(f"{self.host}-g{n}", mac, f"10.77.0.{10 + n}")
        _run("ip", "netns", "add", g.ns)
        self.namespaces.append(g.ns)
        self.exec("ip", "link", "add", g.tap, "type", "veth", "peer", "name", "eth0", "netns", g.ns)
        self.exec("ip", "link", "set", g.tap, "master", "br0")
        self.exec("ip", "link", "set", g.tap, "up")
        # A guest of the lab speaks only when a test makes it: with IPv6 on, its kernel sends
        # MLD reports and router solicitations from its MAC at random times for its first
        # seconds, and one of them between an attacker's frames puts its MAC back on its own
        # port just when a test reads where the bridge has it.
        _run("ip", "netns", "exec", g.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1")
        for argv in (("link", "set", "lo", "up"), ("link", "set", "eth0", "address", g.mac),
                     ("addr", "add", f"{g.address}/24", "dev", "eth0"), ("link", "set", "eth0", "up")):
            _run("ip", "netns", "exec", g.ns, "ip", *argv)
        return g

    def stp_on(self):
        """The kernel's STP on br0 (as libvirt's default network has it), with the shortest
        forward delay the kernel allows; returns once every port forwards."""
        self.exec("ip", "link", "set", "dev", "br0", "type", "bridge", "forward_delay", "200", "stp_state", "1")
        deadline = time.monotonic() + 15
        while True:
            ports = json.loads(self.exec("bridge", "-j", "link", "show").stdout)
            states = {p["ifname"]: p.get("state") for p in ports if p.get("master") == "br0"}
            if len(states) == len(self.guests) and set(states.values()) == {"forwarding"}:
                return
            assert time.monotonic() < deadline, f"br0's ports did not reach forwarding: {states}"
            time.sleep(0.2)

    def seal(self):
        """What the product does to every bridge with a guest tap: no learning from link-local frames."""
        self.exec(*bridge_ports.seal_argv("br0"))

    def port_of(self, mac: str) -> set[str]:
        """The ports br0's forwarding database has `mac` on."""
        entries = json.loads(self.exec("bridge", "-j", "fdb", "show", "br", "br0").stdout)
        return {e.get("ifname") for e in entries if e.get("mac") == mac}

    def close(self):
        if self.daemon is not None:
            self.daemon.kill()
            self.daemon.wait(10)
        for ns in reversed(self.namespaces):
            _run("ip", "netns", "delete", ns, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def lab(request):
    """A lab of 2 guests; `@pytest.mark.parametrize("lab", [{"guests": 3, "stp": True}],
    indirect=True)` asks for another."""
    for binary in ("ip", "bridge", "nft", "nsenter"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing; scripts/setup-host.sh installs iproute2, nftables and util-linux")
    made = Lab()
    try:
        yield made.start(**getattr(request, "param", {}))
    finally:
        made.close()


_RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.settimeout(float(sys.argv[1]))
print("ready", flush=True)
try:
    print(s.recvfrom(100)[0].decode())
except socket.timeout:
    print("nothing")
"""

# argv: to, word, source address ("" for the default), port, source port (0: any).
_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
if sys.argv[3] or sys.argv[5] != "0":
    s.bind((sys.argv[3], int(sys.argv[5])))
for _ in range(10):  # the first may wait for ARP
    try:
        s.sendto(sys.argv[2].encode(), (sys.argv[1], int(sys.argv[4])))
    except OSError:
        pass
    time.sleep(0.1)
"""


def in_ns(ns: str, code: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    return _run("ip", "netns", "exec", ns, sys.executable, "-c", code, *args, check=False, timeout=timeout)


def delivered(sender: Guest | str, to: str, *, receiver_ns: str, source: str = "", port: int = 4789,
              sport: int = 0) -> bool:
    """Whether UDP from `sender` (a guest or a namespace; from `source`, else its address, and
    from port `sport`, else any) to `to` reaches a receiver on `port` in `receiver_ns`."""
    word = uuid.uuid4().hex[:8]
    recv = subprocess.Popen(["ip", "netns", "exec", receiver_ns, sys.executable, "-c", _RECEIVE, "3", str(port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        in_ns(sender if isinstance(sender, str) else sender.ns, _SEND, to, word, source, str(port), str(sport))
        out, _ = recv.communicate(timeout=10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return word in out


# Frames carrying `word` that arrive on an interface (its own sends not counted), until stdin
# closes (at most 15 s). A packet socket sees every frame the interface receives, whatever its
# destination MAC: what a guest in promiscuous mode would read.
_COUNT = """
import select, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind((sys.argv[1], 0))
word = sys.argv[2].encode()
print("ready", flush=True)
count, deadline = 0, time.monotonic() + 15
while time.monotonic() < deadline:
    ready, _, _ = select.select([s, sys.stdin], [], [], 0.5)
    if s in ready:
        frame, where = s.recvfrom(2048)
        if where[2] != socket.PACKET_OUTGOING and word in frame:
            count += 1
    if sys.stdin in ready and not sys.stdin.read(1):
        break
print(count)
"""

# argv: interface, frame (hex), count (0: until stdin closes, at most 15 s), seconds between two.
_FRAMES = """
import select, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
frame, count, every = bytes.fromhex(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
print("ready", flush=True)
sent, deadline = 0, time.monotonic() + 15
while time.monotonic() < deadline and (count == 0 or sent < count):
    s.send(frame)
    sent += 1
    if count == 0 and select.select([sys.stdin], [], [], every)[0] and not sys.stdin.read(1):
        break
    if count:
        time.sleep(every)
"""


class Background:
    """A script run in a namespace that says "ready" and runs until its stdin closes."""

    def __init__(self, ns: str, code: str, *args: str):
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise AssertionError(f"a script in {ns} did not start")

    def stop(self) -> str:
        try:
            out, _ = self.proc.communicate(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return out.strip()


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def ipv4_udp(*, dst_mac: str, src_mac: str, source: str, to: str, sport: int, dport: int, payload: bytes) -> bytes:
    """An Ethernet frame holding an IPv4 UDP datagram (UDP checksum 0: none)."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                         socket.inet_aton(source), socket.inet_aton(to))
    total = sum(struct.unpack("!10H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    header = header[:10] + struct.pack("!H", ~total & 0xFFFF) + header[12:]
    return mac_bytes(dst_mac) + mac_bytes(src_mac) + b"\x08\x00" + header + udp


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


def test_an_isolated_nic_reaches_its_gateway_only_and_no_guest_reaches_it(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(isolated=True), g2.rules()))
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)
    assert not delivered(g1, "10.77.0.255", receiver_ns=g2.ns)  # the subnet's broadcast
    assert delivered(lab.host, g1.address, receiver_ns=g1.ns)  # the gateway reaches it
    assert not delivered(g2, g1.address, receiver_ns=g1.ns)  # another guest does not
    # Back to clean (set_guest): it reaches the other guest again, and is reached.
    lab.firewall.replace((g1.rules(isolated=True),), (g1.rules(),))
    assert delivered(g1, g2.address, receiver_ns=g2.ns)
    assert delivered(g2, g1.address, receiver_ns=g1.ns)


def test_the_table_is_written_in_the_daemons_namespace_and_read_back(lab):
    g1, g2 = lab.guests
    assert namespace_prefix((lab.socket,))[:2] == ["nsenter", f"--net=/proc/{daemon_pid(lab.socket)}/ns/net"]
    assert namespace_prefix((os.path.join(lab.folder, "none.sock"),)) is None  # unknown: not "ours"
    assert lab.firewall.allowed() == set()
    wanted = {g1.rules(isolated=True), g2.rules()}
    lab.firewall.allow(tuple(wanted))
    lab.firewall.allow(tuple(wanted))  # again: no error, nothing doubled
    assert lab.firewall.allowed() == wanted
    listing = lab.exec("nft", "list", "set", FAMILY, TABLE, "nic_source").stdout
    assert listing.count(g1.tap) == 1
    # Not in this process's own namespace (where a real run of the product may keep a table
    # of its own: only this lab's taps are looked for).
    here = _run("nft", "list", "table", FAMILY, TABLE, check=False)
    assert g1.tap not in here.stdout and g2.tap not in here.stdout


def test_removal_is_whole_and_a_missing_element_is_no_error(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(isolated=True), g2.rules()))
    lab.firewall.forget((g1.rules(isolated=True),))
    assert lab.firewall.allowed() == {g2.rules()}
    assert "cc-" not in lab.exec("nft", "list", "set", FAMILY, TABLE, "isolated").stdout
    lab.firewall.forget((g1.rules(isolated=True),))  # already gone: no error
    assert not delivered(g1, g2.address, receiver_ns=g2.ns)
    assert delivered(g2, GATEWAY, receiver_ns=lab.host)


def test_a_table_an_admin_emptied_or_an_older_version_made_is_whole_after_the_next_write(lab):
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(isolated=True),))
    for chain in nft_ruleset.CHAINS:
        lab.exec("nft", "flush", "chain", FAMILY, TABLE, chain)
    # An earlier version's table had no input nor forward chain.
    for chain in ("sent_to_host", "between_ports"):
        lab.exec("nft", "delete", "chain", FAMILY, TABLE, chain)
    lab.firewall.allow((g2.rules(),))
    for chain, (hook, rules) in nft_ruleset.CHAINS.items():
        listed = json.loads(lab.exec("nft", "-j", "list", "chain", FAMILY, TABLE, chain).stdout)["nftables"]
        assert sum("rule" in item for item in listed) == len(rules), chain  # each once
        if hook:
            [found] = [item["chain"] for item in listed if "chain" in item]
            assert found["hook"] == hook.split()[3]
    _run("ip", "netns", "exec", g1.ns, "ip", "addr", "add", "10.77.0.99/24", "dev", "eth0")
    assert not delivered(g1, g2.address, receiver_ns=g2.ns, source="10.77.0.99")
    _another_address(g1, g2, "192.0.2.20")
    assert not delivered(g1, "192.0.2.20", receiver_ns=g2.ns)  # layer 2 isolation is back
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)
    assert delivered(g2, GATEWAY, receiver_ns=lab.host)


def test_a_failed_transaction_is_a_host_error_and_changes_nothing(lab, monkeypatch):
    g1, _ = lab.guests
    lab.firewall.allow((g1.rules(),))
    real = nft_ruleset.batch
    monkeypatch.setattr(nft_ruleset, "batch", lambda **kw: real(**kw) + "add element bridge cloud_controller nope { 1 }\n")
    with pytest.raises(HostError, match="cannot write the guests' network rules on this machine"):
        lab.firewall.allow((lab.guests[1].rules(),))
    monkeypatch.undo()
    assert lab.firewall.allowed() == {g1.rules()}


def _another_address(sender: Guest, owner: Guest, address: str):
    """`owner` holds `address` besides its own (as on a public NIC, or a docker0), and `sender`
    routes to it through `owner`'s address on their shared subnet, hence to `owner`'s MAC."""
    _run("ip", "netns", "exec", owner.ns, "ip", "addr", "add", f"{address}/32", "dev", "lo")
    _run("ip", "netns", "exec", sender.ns, "ip", "route", "add", f"{address}/32", "via", owner.address)


def test_an_isolated_nic_reaches_no_other_address_of_another_guest(lab):
    g1, g2 = lab.guests
    _another_address(g1, g2, "192.0.2.20")
    lab.firewall.allow((g1.rules(), g2.rules()))
    assert delivered(g1, "192.0.2.20", receiver_ns=g2.ns)  # clean: the route works
    lab.firewall.replace((g1.rules(),), (g1.rules(isolated=True),))
    # The destination is outside its subnet, the frame goes to g2's MAC: dropped at layer 2.
    assert not delivered(g1, "192.0.2.20", receiver_ns=g2.ns)
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)


_BURST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    s.sendto(sys.argv[2].encode(), (sys.argv[1], 4790))
    time.sleep(float(sys.argv[4]))
"""

_SPEAK = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    s.sendto(b"hello", (sys.argv[1], 9))
    time.sleep(0.05)
"""

DATAGRAMS = 20


def link_local_attack(lab: Lab, attacker: Guest, victim: Guest, last_byte: str) -> tuple[int, int, set[str]]:
    """The attacker sends a frame to 01:80:c2:00:00:`last_byte` from the victim's MAC every
    10 ms while the host sends DATAGRAMS datagrams to the victim's address: how many each of
    them received, and the ports br0 had the victim's MAC on during the attack."""
    in_ns(victim.ns, _SPEAK, GATEWAY)  # the bridge learns the victim's MAC, the host its address's
    word = uuid.uuid4().hex[:12]
    frame = mac_bytes(f"01:80:c2:00:00:{last_byte}") + mac_bytes(victim.mac) + b"\x88\xcc" + bytes(46)
    counters, attack = [], None
    try:
        counters = [Background(attacker.ns, _COUNT, "eth0", word)]
        counters.append(Background(victim.ns, _COUNT, "eth0", word))
        attack = Background(attacker.ns, _FRAMES, "eth0", frame.hex(), "0", "0.01")
        time.sleep(0.2)  # the bridge has seen 20 of them
        in_ns(lab.host, _BURST, victim.address, word, str(DATAGRAMS), "0.02")
        ports = lab.port_of(victim.mac)
        time.sleep(0.1)
    finally:
        if attack is not None:
            attack.stop()
        counts = [b.stop() for b in counters]
    at_attacker, at_victim = map(int, counts)
    return at_attacker, at_victim, ports


@pytest.mark.parametrize("lab", [{"stp": False}, {"stp": True}], ids=["stp-off", "stp-on"], indirect=True)
@pytest.mark.parametrize("last_byte", ["00", "02", "0e"])
def test_link_local_frames_with_another_guests_mac_capture_nothing(lab, last_byte):
    """A guest sends STP (...:00), slow-protocol (...:02) or LLDP (...:0e) frames with the
    victim's MAC as source, so that the bridge moves the victim's MAC to the guest's port."""
    attacker, victim = lab.guests
    stp = lab.stp
    # Without the table nor the seal the attack works in this lab: what follows is no accident.
    got, _, ports = link_local_attack(lab, attacker, victim, last_byte)
    assert got > 0 and attacker.tap in ports
    # The table alone: unicast reaches a guest for its own MAC only. Where the frame meets a
    # hook (...:00 with STP off goes through prerouting, ...:02 through input) it is dropped
    # before the bridge learns from it; the others still move the entry (the victim loses
    # its traffic: hence the seal).
    lab.firewall.allow((attacker.rules(), victim.rules()))
    got, victim_got, ports = link_local_attack(lab, attacker, victim, last_byte)
    assert got == 0
    if last_byte == "02" or (last_byte == "00" and not stp):
        assert (victim_got, ports) == (DATAGRAMS, {victim.tap})
    # The table and the bridge sealed, as the product keeps every bridge with a guest tap.
    lab.seal()
    got, victim_got, ports = link_local_attack(lab, attacker, victim, last_byte)
    assert (got, victim_got, ports) == (0, DATAGRAMS, {victim.tap})


def test_a_guest_sends_no_dhcp_reply(lab):
    """A guest answers DHCP (UDP 67 to 68) from its own MAC and address, to the broadcast
    address or to a guest's: a rogue DHCP/PXE server."""
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(), g2.rules()))
    me = g1.address
    # The same datagram from another port is delivered: the receiver and the broadcast work.
    assert delivered(g1, "255.255.255.255", receiver_ns=g2.ns, source=me, port=68, sport=1067)
    assert not delivered(g1, "255.255.255.255", receiver_ns=g2.ns, source=me, port=68, sport=67)
    assert not delivered(g1, g2.address, receiver_ns=g2.ns, source=me, port=68, sport=67)


@pytest.mark.parametrize("lab", [{"guests": 3}], indirect=True)
def test_unicast_to_a_mac_nobody_has_reaches_no_guest(lab):
    """The bridge floods a frame whose destination MAC is in no forwarding entry to every
    port (an entry aged out, a MAC moved): no guest may read it."""
    g1, g2, g3 = lab.guests

    def seen(dst_mac: str) -> list[int]:
        word = uuid.uuid4().hex[:12].encode()
        frame = ipv4_udp(dst_mac=dst_mac, src_mac=g1.mac, source=g1.address, to=g2.address,
                         sport=4000, dport=4789, payload=word)
        watchers = []
        try:
            for g in (g2, g3):
                watchers.append(Background(g.ns, _COUNT, "eth0", word.decode()))
            in_ns(g1.ns, _FRAMES, "eth0", frame.hex(), "3", "0.05")
            time.sleep(0.2)
        finally:
            counts = [b.stop() for b in watchers]
        return [int(c) for c in counts]

    assert seen("52:54:00:aa:bb:cc") == [3, 3]  # without the table: flooded to every guest
    lab.firewall.allow(tuple(g.rules() for g in lab.guests))
    assert seen("52:54:00:aa:bb:cc") == [0, 0]
    assert seen(g2.mac) == [3, 0]


def test_a_guest_still_reaches_the_hosts_dhcp_dns_and_gateway(lab):
    """What a guest sends the host itself passes the input hook too (ARP: see
    test_arp_names_only_the_nics_own_address, whose receiver is on the bridge)."""
    g1, g2 = lab.guests
    lab.firewall.allow((g1.rules(), g2.rules()))
    # A DHCP request before the guest has its address (from 0.0.0.0), seen on the bridge
    # device, where the network's dnsmasq listens.
    word = uuid.uuid4().hex[:12]
    frame = ipv4_udp(dst_mac="ff:ff:ff:ff:ff:ff", src_mac=g1.mac, source="0.0.0.0", to="255.255.255.255",
                     sport=68, dport=67, payload=word.encode())
    watch = Background(lab.host, _COUNT, "br0", word)
    try:
        in_ns(g1.ns, _FRAMES, "eth0", frame.hex(), "3", "0.05")
        time.sleep(0.2)
    finally:
        count = watch.stop()
    assert count == "3"
    assert delivered(g1, GATEWAY, receiver_ns=lab.host, port=53)  # DNS
    assert delivered(g1, GATEWAY, receiver_ns=lab.host)


def test_a_bridge_learns_from_link_local_frames_until_sealed(lab):
    show = bridge_ports.show_argv("br0")
    assert bridge_ports.learns_link_local(lab.exec(*show).stdout)
    lab.seal()
    assert not bridge_ports.learns_link_local(lab.exec(*show).stdout)
    assert lab.exec("cat", "/sys/class/net/br0/bridge/no_linklocal_learn").stdout.strip() == "1"
    lab.seal()  # again: no error
    with pytest.raises(HostError, match="not a bridge"):
        bridge_ports.learns_link_local(lab.exec(*bridge_ports.show_argv(lab.guests[0].tap)).stdout)
