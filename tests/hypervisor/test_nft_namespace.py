"""Where NftGuestFirewall writes on this machine, on the real kernel: the namespace of the
libvirt daemon when its /proc entry can be read; otherwise its own namespace only when the
guests' bridge is there, else an error (never "ours" by default). And the taps and bridges it
reads where it writes (present, seal).

The lab (test_nft_guest_firewall.py) is a namespace with bridge br0, "guests" on veths named
as taps, and a "daemon" listening on a unix socket in it.
"""

import os
import subprocess
import sys

import pytest

from common.errors import HostUnavailable
from host_adapters.network.nft_guest_firewall import NftGuestFirewall, namespace_prefix
from host_adapters.network.nft_ruleset import FAMILY, TABLE
from tests.hypervisor.test_nft_guest_firewall import lab  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.real_commands, pytest.mark.integration]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run in a child: write one NIC's rules with sockets=argv[1] and the bridge argv[2], print
# what happened.
_WRITE = """
import sys
from common.errors import ControllerError
from host_adapters.network.guest_firewall import NicRules
from host_adapters.network.nft_guest_firewall import NftGuestFirewall, namespace_prefix
fw = NftGuestFirewall(sockets=(sys.argv[1],))
fw.locate((sys.argv[2],))
print("prefix", namespace_prefix(fw.sockets))
try:
    fw.allow((NicRules(tap=sys.argv[3], mac=sys.argv[4], address=sys.argv[5]),))
    print("written", sorted(r.tap for r in fw.allowed()))
except ControllerError as e:
    print("refused", e.message)
"""


def _child(argv_prefix, lab, bridge: str) -> str:
    g1 = lab.guests[0]
    done = subprocess.run([*argv_prefix, sys.executable, "-c", _WRITE, lab.socket, bridge, g1.tap, g1.mac, g1.address],
                          capture_output=True, text=True, timeout=60, cwd=_ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _table_in(lab) -> str:
    return lab.exec("nft", "list", "set", FAMILY, TABLE, "nic_source", check=False).stdout


def test_without_ptrace_the_daemons_namespace_is_not_read_and_nothing_is_written_elsewhere(lab):
    """The shipped unit keeps no CAP_SYS_PTRACE: /proc/<libvirtd>/ns/net is refused. The rules
    must then not go to the service's own namespace, where no guest bridge is."""
    no_ptrace = ["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"]
    out = _child(no_ptrace, lab, "br0")
    assert "prefix None" in out
    assert "refused" in out and "br0 is not in this process's namespace" in out
    assert lab.guests[0].tap not in _table_in(lab)


def test_without_ptrace_but_inside_the_bridges_namespace_the_rules_are_written_there(lab):
    """The service in libvirtd's namespace (a container, or the head node itself): its bridge is here."""
    inside = ["ip", "netns", "exec", lab.host, "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"]
    out = _child(inside, lab, "br0")
    assert "prefix None" in out  # the daemon's entry still cannot be read
    assert f"written ['{lab.guests[0].tap}']" in out
    assert lab.guests[0].tap in _table_in(lab)


def test_a_readable_daemon_namespace_is_entered(lab):
    assert namespace_prefix((lab.socket,))[:2] == ["nsenter", f"--net=/proc/{namespace_pid(lab)}/ns/net"]
    out = _child([], lab, "no-such-br")  # the bridge hint is not needed then
    assert f"written ['{lab.guests[0].tap}']" in out


def namespace_pid(lab) -> int:
    from host_adapters.network.nft_guest_firewall import daemon_pid

    return daemon_pid(lab.socket)


def test_no_daemon_and_no_bridge_here_is_an_error_not_ours(lab):
    fw = NftGuestFirewall(sockets=(os.path.join(lab.folder, "none.sock"),))
    with pytest.raises(HostUnavailable, match="cannot tell which network namespace"):
        fw.allow((lab.guests[0].rules(),))
    fw.locate(("cc-no-such",))
    with pytest.raises(HostUnavailable, match="cc-no-such is not in this process's namespace"):
        fw.present([lab.guests[0].tap])


def test_present_lists_the_taps_where_the_rules_go_and_seal_stops_link_local_learning(lab):
    g1, g2 = lab.guests
    fw = lab.firewall
    assert fw.present([g1.tap, g2.tap, "cc-fffff-ffffff"]) == {g1.tap, g2.tap}
    # This process's own namespace holds none of them: a firewall writing here would see that.
    here = NftGuestFirewall(sockets=())
    here.locate(("lo",))
    assert here.present([g1.tap, g2.tap]) == set()
    assert '"no_linklocal_learn":0' in lab.exec("ip", "-j", "-d", "link", "show", "dev", "br0").stdout.replace(" ", "")
    fw.seal(["br0"])
    assert '"no_linklocal_learn":1' in lab.exec("ip", "-j", "-d", "link", "show", "dev", "br0").stdout.replace(" ", "")
    fw.seal(["br0"])  # again: nothing to do, no error
