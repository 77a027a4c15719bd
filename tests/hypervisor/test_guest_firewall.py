"""The guests' NIC rules without a kernel: names, the nft text, the listing read back, where the
commands run (tests/hypervisor/test_nft_guest_firewall.py runs them)."""

import json
import os
import socket
import sys
import subprocess

import pytest

from common.errors import HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.network import nft_ruleset
from host_adapters.network.fake_guest_firewall import FakeGuestFirewall
from host_adapters.network.guest_firewall import GuestFirewall, NicRules, host_tag, is_tap, tap_name
from host_adapters.network.guest_firewall_choice import SYSTEM_SOCKETS, guest_firewall_for
from host_adapters.network.nft_guest_firewall import NftGuestFirewall
from host_adapters.files.ssh_host_files import SshHostFiles
from tests.fixtures.interfaces import assert_offers_the_interface

CLEAN = NicRules(tap="cc-0a1b2-123456", mac="52:54:00:12:34:56", address="10.213.0.5")
ISOLATED = NicRules(tap="cc-0a1b2-123457", mac="52:54:00:12:34:57", address="10.213.0.6",
                    gateway="10.213.0.1", subnet="10.213.0.0/16")


def test_a_tap_is_named_by_its_host_and_mac_within_linuxs_15_characters():
    tag = host_tag("qemu+tcp://127.0.0.1:16509/system")
    assert tag != host_tag("qemu+tcp://127.0.0.1:16510/system") and len(tag) == 5
    name = tap_name("52:54:00:AB:CD:EF", tag)
    assert name == f"cc-{tag}-abcdef" and len(name) == 15 and is_tap(name)
    assert tap_name("52:54:00:ab:cd:ef") == "cc-525400abcdef"
    for bad in ("52:54:00:ab:cd", "52:54:00:ab:cd:eg", "x; drop", None):
        with pytest.raises(InvalidInput):
            tap_name(bad, tag)
    with pytest.raises(InvalidInput):
        tap_name("52:54:00:ab:cd:ef", "ABCDE")
    assert not is_tap("vnet0") and not is_tap('cc-0a1b2-12345"') and not is_tap("cc-*")


@pytest.mark.parametrize("bad", [
    {"tap": 'cc-0a1b2-12345" ; flush ruleset'}, {"tap": "eth0"}, {"mac": "52:54:00:12:34"},
    {"address": "10.213.0.500"}, {"address": "10.213.0.5 } ; flush ruleset"}, {"address": "fe80::1"},
    {"gateway": "10.213.0.1"}, {"gateway": "x", "subnet": "10.213.0.0/16"},
    {"gateway": "10.213.0.1", "subnet": "10.213.0.1/16"},
])
def test_every_field_that_reaches_nft_is_checked(bad):
    values = dict(tap="cc-0a1b2-123456", mac="52:54:00:12:34:56", address="10.213.0.5") | bad
    with pytest.raises(InvalidInput):
        NicRules(**values)


def test_a_batch_writes_the_table_whole_then_removes_by_adding_first_then_adds():
    text = nft_ruleset.batch(add=(ISOLATED,), remove=(CLEAN,))
    lines = text.splitlines()
    assert lines[0] == "add table bridge cloud_controller"
    # Every chain flushed and written again in the same transaction.
    for chain in nft_ruleset.CHAINS:
        assert f"flush chain bridge cloud_controller {chain}" in lines
    assert lines.index("add rule bridge cloud_controller from_guest drop") > lines.index(
        "flush chain bridge cloud_controller from_guest")
    removed = 'element bridge cloud_controller nic_source { "cc-0a1b2-123456" . 52:54:00:12:34:56 . 10.213.0.5 }'
    assert lines.index(f"add {removed}") + 1 == lines.index(f"delete {removed}")
    assert 'add element bridge cloud_controller isolated_subnet { "cc-0a1b2-123457" . 10.213.0.0/16 }' in lines
    assert 'add element bridge cloud_controller isolated_gateway { "cc-0a1b2-123457" . 10.213.0.1 }' in lines
    assert not any("isolated " in line and "123456" in line for line in lines)
    # Our taps only, and what no element allows is dropped both ways.
    assert 'add rule bridge cloud_controller sent iifname "cc-*" jump from_guest' in lines
    assert 'add rule bridge cloud_controller received oifname "cc-*" jump to_guest' in lines
    assert "add rule bridge cloud_controller to_guest drop" in lines
    # What a port hands the host passes the same checks (link-local frames meet only this hook).
    assert ("add chain bridge cloud_controller sent_to_host { type filter hook input priority -300; "
            "policy accept; }") in lines
    assert 'add rule bridge cloud_controller sent_to_host iifname "cc-*" jump from_guest' in lines
    # Isolation between ports, both ways, whatever the IPv4 inside.
    assert ("add chain bridge cloud_controller between_ports { type filter hook forward priority -300; "
            "policy accept; }") in lines
    assert 'add rule bridge cloud_controller between_ports iifname @isolated oifname "cc-*" drop' in lines
    assert 'add rule bridge cloud_controller between_ports iifname "cc-*" oifname @isolated drop' in lines
    # No DHCP reply from a guest, even from its own address; unicast to a guest for its MAC only.
    rules = [line.removeprefix("add rule bridge cloud_controller ") for line in lines]
    dhcp_reply = rules.index("from_guest ether type ip udp sport 67 udp dport 68 drop")
    assert dhcp_reply < rules.index("from_guest ether type ip iifname . ether saddr . ip saddr @nic_source accept")
    assert "to_guest ether type ip oifname . ether daddr @nic_mac accept" in rules
    assert not any(rule.startswith("to_guest") and rule.endswith("ether type ip accept") for rule in rules)


def test_the_listing_is_read_back_as_whole_nics():
    def elem(*parts):
        return {"concat": list(parts)}

    listing = {"nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"table": {"family": "bridge", "name": "cloud_controller"}},
        {"set": {"table": "cloud_controller", "name": "nic_source", "elem": [
            elem(CLEAN.tap, CLEAN.mac, CLEAN.address), elem(ISOLATED.tap, ISOLATED.mac, ISOLATED.address),
            elem("vnet0", "52:54:00:00:00:01", "10.0.0.1")]}},
        {"set": {"table": "cloud_controller", "name": "isolated", "elem": [ISOLATED.tap]}},
        {"set": {"table": "cloud_controller", "name": "isolated_gateway", "elem": [
            elem(ISOLATED.tap, ISOLATED.gateway)]}},
        {"set": {"table": "cloud_controller", "name": "isolated_subnet", "elem": [
            elem(ISOLATED.tap, {"prefix": {"addr": "10.213.0.0", "len": 16}})]}},
    ]}
    assert nft_ruleset.parse(json.dumps(listing)) == {CLEAN, ISOLATED}
    assert nft_ruleset.parse(json.dumps({"nftables": []})) == set()
    with pytest.raises(HostError):
        nft_ruleset.parse("not json")


def test_the_implementations_offer_the_interface():
    assert_offers_the_interface(FakeGuestFirewall, GuestFirewall)
    assert_offers_the_interface(NftGuestFirewall, GuestFirewall)


def test_which_firewall_a_uri_gets():
    assert isinstance(guest_firewall_for("test:///default"), FakeGuestFirewall)
    local = guest_firewall_for("qemu:///system")
    assert isinstance(local, NftGuestFirewall) and local.ssh is None and local.sockets == SYSTEM_SOCKETS
    assert guest_firewall_for("qemu+tcp://127.0.0.1:16509/system").sockets == SYSTEM_SOCKETS
    assert guest_firewall_for("qemu+unix:///system?socket=/srv/l.sock").sockets == ("/srv/l.sock",)
    remote = guest_firewall_for("qemu+ssh://admin@node1:2222/system")
    assert remote.ssh is not None and remote.ssh.where == "admin@node1" and remote.ssh.port == 2222
    assert guest_firewall_for("qemu+tls://node2/system").ssh.user == "root"
    assert guest_firewall_for("qemu+tls://localhost/system").ssh is None
    assert guest_firewall_for("qemu+tcp://[::1]:16509/system").ssh is None


def test_a_name_or_an_address_of_this_machine_is_reached_over_ssh_not_taken_for_it():
    """Only a unix socket or loopback is this kernel's libvirt: the machine's own host name
    could be another machine's short name, and an address binds here when it is not ours
    (net.ipv4.ip_nonlocal_bind)."""
    own = socket.gethostname()
    assert guest_firewall_for(f"qemu+tls://{own}/system").ssh.where == f"root@{own}"
    assert guest_firewall_for("qemu+tls://10.20.30.40/system").ssh.where == "root@10.20.30.40"


@pytest.mark.real_commands
@pytest.mark.integration
def test_with_nonlocal_bind_a_remote_address_still_gets_its_rules_over_ssh():
    """In a network namespace of the test's where any IPv4 address binds."""
    ns = f"cc-nlb-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_nonlocal_bind=1"],
                       check=True, timeout=20)
        code = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.20.30.40', 0)); "
                "from host_adapters.network.guest_firewall_choice import guest_firewall_for as f; "
                "print(f('qemu+tls://10.20.30.40/system').where)")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "root@10.20.30.40"  # the address bound, and still not "this machine"
    finally:
        subprocess.run(["ip", "netns", "delete", ns], timeout=20)


def test_over_ssh_nft_reads_the_transaction_from_stdin_as_one_quoted_command(monkeypatch):
    ran = []

    def fake_run(argv, **kwargs):
        ran.append((argv, kwargs.get("input")))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subp, "_run", fake_run)
    fw = NftGuestFirewall(ssh=SshHostFiles("node1", user="root"))
    fw.allow((CLEAN,))
    [(argv, text)] = ran
    assert argv[:1] == ["ssh"] and argv[-3:] == ["--", "node1", "nft -f -"]
    assert text == nft_ruleset.batch(add=(CLEAN,))
    fw.forget(())  # nothing to remove: no command
    assert len(ran) == 1


def _here() -> NftGuestFirewall:
    """A local firewall whose guests' bridge is in this namespace (lo stands in for it)."""
    fw = NftGuestFirewall(sockets=())
    fw.locate(("lo",))
    return fw


def test_a_host_without_nft_is_unavailable_with_the_package_named(monkeypatch):
    def missing(argv, **kwargs):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(subp, "_run", missing)
    with pytest.raises(HostUnavailable, match="nftables"):
        _here().allow((CLEAN,))

    def refused(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 255, "", "Permission denied (publickey).")

    monkeypatch.setattr(subp, "_run", refused)
    with pytest.raises(HostUnavailable, match="root ssh key"):
        NftGuestFirewall(ssh=SshHostFiles("node1")).allow((CLEAN,))

    def failed(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "Error: Could not process rule: No such file or directory")

    monkeypatch.setattr(subp, "_run", failed)
    assert _here().allowed() == set()  # no table yet
    with pytest.raises(HostError, match="cannot write the guests' network rules on this machine"):
        _here().allow((CLEAN,))


def test_the_fake_keeps_the_rules_and_fails_when_told():
    fw = FakeGuestFirewall()
    fw.allow((CLEAN, ISOLATED))
    fw.replace((ISOLATED,), (ISOLATED.__class__(tap=ISOLATED.tap, mac=ISOLATED.mac, address=ISOLATED.address),))
    assert fw.allowed() == {CLEAN, NicRules(tap=ISOLATED.tap, mac=ISOLATED.mac, address=ISOLATED.address)}
    fw.forget((CLEAN,))
    fw.forget((CLEAN,))
    fw.fail = HostError("down")
    with pytest.raises(HostError):
        fw.allow((CLEAN,))
