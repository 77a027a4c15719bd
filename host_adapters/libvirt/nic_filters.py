"""Which rules each guest NIC gets (network/guest_firewall.py says what they guarantee), by name
with their parameters: a FilterRef, as reconcile compares them (same_nics).

Every NIC gets CLEAN with its address as `IP`; with `[network] isolate_guests` the private
NIC gets ISOLATED instead, which also names its gateway and subnet. The domain keeps each
NIC's FilterRef in its metadata (xml.py: nic_rules_of); rules_of turns one into the NicRules
the host's table holds, keyed by the NIC's tap.

The names are those of the nwfilters earlier versions defined (the same guarantees), so a
domain of an earlier version (its <filterref>, which libvirt still applies) is as wanted.
"""

import dataclasses
import ipaddress

from host_adapters.guests.guest import GuestSpec, Nic
from host_adapters.hypervisor import FilterRef, NicDevice
from host_adapters.network.guest_firewall import NicRules, is_tap, tap_name
from host_adapters.libvirt import xml as domain_xml

CLEAN = "cloud-controller-clean"
# What earlier versions gave a NIC instead of CLEAN, with the same parameter: the same guarantees.
_EARLIER_CLEAN = "clean-traffic"
ISOLATED = "cloud-controller-isolated"


def filter_for(nic: Nic) -> FilterRef:
    """The filter of one NIC, with its parameters (sorted: the domain XML's order is not ours)."""
    if not nic.isolated:
        return FilterRef(CLEAN, (("IP", nic.address),))
    net = ipaddress.IPv4Interface(f"{nic.address}/{nic.prefix}").network
    return FilterRef(ISOLATED, tuple(sorted((
        ("IP", nic.address), ("GATEWAY", str(nic.gateway)),
        ("SUBNET", str(net.network_address)), ("SUBNET_PREFIX", str(net.prefixlen)),
    ))))


def rules_of(tap: str, mac: str, ref: FilterRef) -> NicRules | None:
    """The NicRules of the NIC `mac` on the tap `tap` with rules `ref`; None for rules of
    another name (nothing this version writes)."""
    params = dict(ref.parameters)
    if ref.name == CLEAN and "IP" in params:
        return NicRules(tap=tap, mac=mac, address=params["IP"])
    if ref.name == ISOLATED and {"IP", "GATEWAY", "SUBNET", "SUBNET_PREFIX"} <= params.keys():
        return NicRules(tap=tap, mac=mac, address=params["IP"], gateway=params["GATEWAY"],
                        subnet=f"{params['SUBNET']}/{params['SUBNET_PREFIX']}")
    return None


def guest_rules(guest: GuestSpec, tag: str | None) -> tuple[NicRules, ...]:
    """The NicRules of every NIC of `guest` on the host tagged `tag` (guest_firewall.host_tag)."""
    return tuple(r for r in (rules_of(tap_name(n.mac, tag), n.mac, filter_for(n)) for n in guest.nics)
                 if r is not None)


def nic_devices_for(guest: GuestSpec) -> tuple[NicDevice, ...]:
    """The NICs a domain has for `guest`, each with its filter (filter_for)."""
    return tuple(NicDevice(mac=n.mac, network=n.network, bridge=n.bridge, filter=filter_for(n)) for n in guest.nics)


def same_nics(found: tuple[NicDevice, ...], wanted: tuple[NicDevice, ...]) -> bool:
    """Whether a domain's NICs (sorted alike) are those wanted. A NIC an earlier version gave
    libvirt's clean-traffic, with the filter parameters wanted for CLEAN, is as wanted: same
    guarantees, and rewriting every domain of a host at an upgrade would buy nothing."""
    def as_now(nic: NicDevice) -> NicDevice:
        if nic.filter is not None and nic.filter.name == _EARLIER_CLEAN:
            return dataclasses.replace(nic, filter=FilterRef(CLEAN, nic.filter.parameters))
        return nic

    return tuple(as_now(n) for n in found) == tuple(wanted)


def domain_rules(xml: str) -> tuple[NicRules, ...]:
    """The NicRules of a domain's NICs that have a tap of ours and rules in its metadata (a
    domain of an earlier version has neither: libvirt's nwfilter filters it). The one reading
    of a domain's rules: the controller's (libvirt/firewall.py) and the hook's
    (guest_rules_hook.py)."""
    kept = domain_xml.nic_rules_of(xml)
    found = []
    for nic in domain_xml.interfaces_of(xml):
        ref = kept.get(nic.mac)
        if ref is not None and nic.target_dev and is_tap(nic.target_dev):
            rules = rules_of(nic.target_dev, nic.mac, ref)
            if rules is not None:
                found.append(rules)
    return tuple(found)
