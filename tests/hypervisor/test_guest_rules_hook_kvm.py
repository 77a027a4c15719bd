"""The libvirt hook (host_adapters/libvirt/guest_rules_hook.py) on a real libvirtd: domains of ours
started by libvirt itself, not by the controller (as `virsh start` or libvirt-guests at
boot would), after the guests' table was lost.

The hook must be installed (scripts/setup-host.sh, which the test command runs first) before
the libvirtd starts: libvirtd looks for hooks at its start only. A libvirtd that does not run
it fails these tests, never skips them.
"""

import glob
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from host_adapters import subp
from host_adapters.network import bridge_ports, nft_ruleset
from host_adapters.network.guest_firewall import HOOK_PATH, NicRules
from host_adapters.libvirt.driver import LibvirtHypervisor
from tests.fixtures.libvirtd import SYSTEM_URI, cleanup_hypervisor, in_netns, unique_prefix
from tests.hypervisor.test_hypervisor import guest_for, new_id

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

PROGRAM = Path(sys.executable).parent / "cloud-guest-rules"
QEMU_LOG_DIR = "/var/log/libvirt/qemu"
NOT_RUN = (f"the running libvirtd did not run the hook {HOOK_PATH}: run scripts/setup-host.sh, then make sure "
           "no libvirtd that started before the hook existed is running (libvirtd reads hooks at its start)")


def nft(*args: str, ok_codes=(0,)):
    return subp.run(in_netns(SYSTEM_URI, ["nft", *args]), ok_codes=ok_codes, timeout=30)


def table() -> tuple[set[str], set[NicRules]]:
    """The chains and the NIC rules of the guests' table in the test libvirtd's network namespace."""
    done = nft("-j", "list", "table", nft_ruleset.FAMILY, nft_ruleset.TABLE, ok_codes=(0, 1))
    if done.returncode:
        return set(), set()
    chains = {i["chain"]["name"] for i in json.loads(done.stdout)["nftables"] if "chain" in i}
    return chains, nft_ruleset.parse(done.stdout)


def delete_table() -> None:
    nft("delete", "table", nft_ruleset.FAMILY, nft_ruleset.TABLE, ok_codes=(0, 1))


@pytest.fixture
def others_rules(libvirtd_system):
    """The table's elements as they were (other tests' running domains'), written back at the end:
    these tests delete the table."""
    _, before = table()
    yield
    subp.run(in_netns(SYSTEM_URI, ["nft", "-f", "-"]), input=nft_ruleset.batch(add=tuple(before)), timeout=30)


@dataclass
class Defined:
    name: str
    dom: object
    rules: NicRules
    bridge: str


@pytest.fixture
def defined(libvirt_dir_pool, libvirt_private_network, guest_virt, others_rules):
    """A domain of ours, defined by the controller and not started: its NIC rules are in its metadata."""
    import libvirt

    if not os.access(HOOK_PATH, os.X_OK):
        pytest.fail(f"{HOOK_PATH} is not installed: run scripts/setup-host.sh before the libvirtd starts",
                    pytrace=False)
    prefix = unique_prefix()
    hv = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=prefix,
                           network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
                           virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode)
    conn = libvirt.open(SYSTEM_URI)
    try:
        base = hv.create_base_image(new_id(), size_gb=1)
        instance_id = new_id()
        guest = guest_for(hv)
        hv.receive(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest, disk=None,
                   start=False)
        [rules] = hv._guest_rules(guest)
        dom = conn.lookupByName(prefix + instance_id)
        assert not dom.isActive()
        bridge = conn.networkLookupByName(libvirt_private_network.name).bridgeName()
        yield Defined(name=prefix + instance_id, dom=dom, rules=rules, bridge=bridge)
    finally:
        cleanup_hypervisor(hv)
        conn.close()
        for log in glob.glob(f"{QEMU_LOG_DIR}/{glob.escape(prefix)}*.log"):
            os.unlink(log)


def ip(*args: str) -> str:
    return subp.run(in_netns(SYSTEM_URI, ["ip", *args]), timeout=30).stdout


def start_outside_the_controller(d: Defined) -> None:
    """`virsh start`: libvirt's own start, no rules written by anyone but the hook."""
    d.dom.create()
    chains, rules = table()
    if d.rules not in rules:
        d.dom.destroy()
        pytest.fail(NOT_RUN, pytrace=False)


def test_a_start_outside_the_controller_after_the_table_was_lost_writes_its_rules_and_seals_its_bridge(defined):
    """A host whose table was deleted (a reboot, `nft flush ruleset`): a domain started by
    libvirt itself would have run unfiltered. The hook makes the table whole with the
    domain's rules in its start, and its bridge learns nothing from link-local frames."""
    delete_table()
    ip("link", "set", "dev", defined.bridge, "type", "bridge", "no_linklocal_learn", "0")
    start_outside_the_controller(defined)
    try:
        chains, rules = table()
        assert chains == set(nft_ruleset.CHAINS)
        assert [r for r in rules if r.tap == defined.rules.tap] == [defined.rules]
        [tap] = json.loads(ip("-j", "link", "show", "dev", defined.rules.tap))
        assert tap["master"] == defined.bridge
        assert not bridge_ports.learns_link_local(ip("-j", "-d", "link", "show", "dev", defined.bridge))
    finally:
        defined.dom.destroy()
    # release: the stopped domain's elements are gone, the table stays.
    chains, rules = table()
    assert chains == set(nft_ruleset.CHAINS)
    assert [r for r in rules if r.tap == defined.rules.tap] == []


def test_the_boot_order_base_table_then_a_start_by_libvirt(defined):
    """At boot the unit loads the table empty before libvirt starts anything: the domain's tap
    would pass nothing; its start (libvirt-guests, autostart) writes its rules."""
    delete_table()
    subp.run(in_netns(SYSTEM_URI, [str(PROGRAM), "base"]), timeout=30)
    chains, rules = table()
    assert chains == set(nft_ruleset.CHAINS)
    assert [r for r in rules if r.tap == defined.rules.tap] == []
    start_outside_the_controller(defined)
    try:
        assert defined.rules in table()[1]
    finally:
        defined.dom.destroy()
    assert defined.rules not in table()[1]


def test_a_hook_that_cannot_write_aborts_the_start(defined):
    """A table nft cannot complete (here a set of the same name and another type): the domain
    does not start, and libvirt's error says why."""
    import libvirt

    delete_table()
    nft("add", "table", nft_ruleset.FAMILY, nft_ruleset.TABLE)
    nft("add", "set", nft_ruleset.FAMILY, nft_ruleset.TABLE, "nic_source", "{ type ifname; }")
    try:
        try:
            defined.dom.create()
        except libvirt.libvirtError as e:
            message = str(e)
        else:
            defined.dom.destroy()
            pytest.fail(f"{NOT_RUN}: the domain started", pytrace=False)
        if "cloud-guest-rules" not in message:
            pytest.fail(f"{NOT_RUN}; libvirt said: {message}", pytrace=False)
        assert (f"cloud-guest-rules: domain {defined.name}: cannot write its NICs' network rules: "
                "nft: Error: datatype mismatch") in message
        assert not defined.dom.isActive()
        assert defined.dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF
    finally:
        delete_table()

