"""Which network filter libvirt applies to each guest NIC (issue 16, finding 8).

Guest root controls what its NICs send. Every NIC gets libvirt's `clean-traffic`
filter with the NIC's address as `IP`: frames only from the NIC's own MAC, IPv4
only from its own address, no ARP spoofing, nothing but IPv4 and ARP. With
`[network] isolate_guests` the private NIC gets the project's filter instead:
clean-traffic, and nothing sent to another address of the private subnet but the
gateway's (nor to broadcast or multicast addresses). These filters are libvirt's
nwfilter driver: ebtables and iptables rules on the host, which the guest cannot
touch. The objects here are pure; the libvirt adapter defines PROJECT_FILTERS on a
host before a domain refers to them.
"""

import ipaddress
import uuid

from host_adapters.guest import GuestSpec, Nic
from host_adapters.hypervisor import FilterRef, NicDevice
from host_adapters.libvirt.xml import FilterRule, NWFilter

CLEAN_TRAFFIC = "clean-traffic"  # shipped with libvirt (Debian: libvirt-daemon-config-nwfilter)
ISOLATED = "cloud-controller-isolated"
_NO_GUEST_TO_GUEST = "cloud-controller-no-guest-to-guest"


def filter_for(nic: Nic) -> FilterRef:
    """The filter of one NIC, with its parameters (sorted: the domain XML's order is not ours)."""
    if not nic.isolated:
        return FilterRef(CLEAN_TRAFFIC, (("IP", nic.address),))
    net = ipaddress.IPv4Interface(f"{nic.address}/{nic.prefix}").network
    return FilterRef(ISOLATED, tuple(sorted((
        ("IP", nic.address), ("GATEWAY", str(nic.gateway)),
        ("SUBNET", str(net.network_address)), ("SUBNET_PREFIX", str(net.prefixlen)),
    ))))


def _uuid(name: str) -> str:
    # Fixed per name: every host, and every `init`, defines the same filter.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cloud-controller:nwfilter:{name}"))


# Ordered: a filter after those it refers to. Sent by the guest ("out"), in an IPv4 chain of
# its own that runs after clean-traffic's address checks (its "ipv4-ip" chain, -710) and
# before clean-traffic accepts the rest of IPv4 (-650): "return" lets a packet on to that.
PROJECT_FILTERS = (
    NWFilter(_NO_GUEST_TO_GUEST, _uuid(_NO_GUEST_TO_GUEST), chain="ipv4-cciso", priority=-700, rules=(
        FilterRule("return", "out", 100, (("dstipaddr", "$GATEWAY"),)),
        FilterRule("drop", "out", 200, (("dstipaddr", "$SUBNET"), ("dstipmask", "$SUBNET_PREFIX"))),
        FilterRule("drop", "out", 300, (("dstipaddr", "224.0.0.0"), ("dstipmask", "4"))),
        FilterRule("drop", "out", 400, (("dstipaddr", "255.255.255.255"),)),
    )),
    NWFilter(ISOLATED, _uuid(ISOLATED), filterrefs=(CLEAN_TRAFFIC, _NO_GUEST_TO_GUEST)),
)


def nic_devices_for(guest: GuestSpec) -> tuple[NicDevice, ...]:
    """The NICs a domain has for `guest`, each with its filter (filter_for)."""
    return tuple(NicDevice(mac=n.mac, network=n.network, bridge=n.bridge, filter=filter_for(n)) for n in guest.nics)
