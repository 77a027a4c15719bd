"""Which network filter libvirt applies to each guest NIC (issue 16, finding 8).

Guest root controls what its NICs send. Every NIC gets the project's
`cloud-controller-clean` filter with the NIC's address as `IP` (libvirt adds its
`MAC`): what libvirt's `clean-traffic` guarantees, in fewer rules. From the guest:
IPv4 only from its own MAC and address (or a DHCP request from 0.0.0.0), ARP only
naming its own MAC and address, nothing else. To the guest: IPv4, and ARP asking
for its address; nothing else. With `[network] isolate_guests` the private NIC
gets `cloud-controller-isolated` instead: that, and nothing sent to another
address of the private subnet but the gateway's (nor to broadcast or multicast
addresses). These filters are libvirt's nwfilter driver: ebtables rules on the
host, which the guest cannot touch.

Why not clean-traffic itself (PERF: docs/performance.md): libvirt applies a
filter one firewall command at a time, one NIC at a time (the serial step of a
burst of creates), and clean-traffic's seven filters make eight chains per NIC:
about 120 commands and 1.4 s of each domain start on a 2-core host. This filter
is one chain each way, all of its rules in libvirt's root chain: about 60
commands (half of them libvirt's own iptables clean-up) and 0.5 s.

The objects here are pure; the libvirt adapter defines PROJECT_FILTERS on a host
before a domain refers to them.
"""

import dataclasses
import ipaddress
import uuid

from host_adapters.guest import GuestSpec, Nic
from host_adapters.hypervisor import FilterRef, NicDevice
from host_adapters.libvirt.xml import FilterRule, NWFilter

CLEAN = "cloud-controller-clean"
# What earlier versions gave a NIC instead of CLEAN, with the same parameter: the same guarantees.
_EARLIER_CLEAN = "clean-traffic"
ISOLATED = "cloud-controller-isolated"
_NO_GUEST_TO_GUEST = "cloud-controller-no-guest-to-guest"


def filter_for(nic: Nic) -> FilterRef:
    """The filter of one NIC, with its parameters (sorted: the domain XML's order is not ours)."""
    if not nic.isolated:
        return FilterRef(CLEAN, (("IP", nic.address),))
    net = ipaddress.IPv4Interface(f"{nic.address}/{nic.prefix}").network
    return FilterRef(ISOLATED, tuple(sorted((
        ("IP", nic.address), ("GATEWAY", str(nic.gateway)),
        ("SUBNET", str(net.network_address)), ("SUBNET_PREFIX", str(net.prefixlen)),
    ))))


def _uuid(name: str) -> str:
    # Fixed per name: every host, and every `init`, defines the same filter.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cloud-controller:nwfilter:{name}"))


# Ordered: a filter after those it refers to. libvirt keeps the root chain's rules in priority
# order, and a frame's first accept or drop ends it. "out" is sent by the guest, "in" sent to
# it; $MAC is the NIC's, set by libvirt.
PROJECT_FILTERS = (
    NWFilter(CLEAN, _uuid(CLEAN), rules=(
        FilterRule("accept", "out", 100, (("srcmacaddr", "$MAC"), ("srcipaddr", "$IP"))),
        # DHCP before the guest has its address (clean-traffic's no-ip-spoofing allows the same).
        FilterRule("accept", "out", 110, (("srcmacaddr", "$MAC"), ("srcipaddr", "0.0.0.0"), ("protocol", "udp"))),
        FilterRule("accept", "out", 120, (("srcmacaddr", "$MAC"), ("arpsrcmacaddr", "$MAC"),
                                          ("arpsrcipaddr", "$IP")), protocol="arp"),
        FilterRule("accept", "in", 200, (("protocolid", "ipv4"),), protocol="mac"),
        FilterRule("accept", "in", 210, (("arpdstipaddr", "$IP"),), protocol="arp"),
        # Everything else, both ways: IPv6, other addresses, other MACs, other protocols.
        FilterRule("drop", "inout", 1000, protocol=None),
    )),
    # Sent by the guest, in an IPv4 chain of its own that runs before the root chain's rules
    # (priority -700): "return" lets a packet on to them, where its source is checked.
    NWFilter(_NO_GUEST_TO_GUEST, _uuid(_NO_GUEST_TO_GUEST), chain="ipv4-cciso", priority=-700, rules=(
        FilterRule("return", "out", 100, (("dstipaddr", "$GATEWAY"),)),
        FilterRule("drop", "out", 200, (("dstipaddr", "$SUBNET"), ("dstipmask", "$SUBNET_PREFIX"))),
        FilterRule("drop", "out", 300, (("dstipaddr", "224.0.0.0"), ("dstipmask", "4"))),
        FilterRule("drop", "out", 400, (("dstipaddr", "255.255.255.255"),)),
    )),
    NWFilter(ISOLATED, _uuid(ISOLATED), filterrefs=(CLEAN, _NO_GUEST_TO_GUEST)),
)


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
