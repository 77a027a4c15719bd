"""The guests' NIC rules as nftables text (guest_firewall.py says what they guarantee), and
the table's elements read back from `nft -j list table`.

One table on each host, `bridge cloud_controller`: the bridge family sees every frame a
bridge port receives or sends, and a guest's tap is a port of its network's bridge. Four
base chains catch the ports named `cc-*` (our taps; nothing else on a host is named so):

- `sent` on prerouting: frames a port receives, that is what the guest sends;
- `sent_to_host` on input: frames a port hands to the host. Everything there already went
  through prerouting, except the frames to the reserved group addresses 01:80:c2:00:00:02
  to 0d, which the bridge hands up without prerouting and learns the source MAC of after
  this hook: the same checks (`from_guest`) drop them before the bridge learns a MAC the
  guest does not own. Frames to ...:00 (with STP on) and ...:0e meet no hook at all: the
  bridge must not learn from them (bridge_ports.py);
- `between_ports` on forward: frames the bridge passes from one port to another (isolation);
- `received` on postrouting: frames leaving by a port, to the guest.

The rules are the same for every NIC; each NIC's MAC and address are elements of the sets,
keyed by its tap, so a NIC's part is written and removed without touching any other's. What
no element allows is dropped.

A transaction (batch) first makes the table, its sets and chains (`add` of what exists is no
error), flushes the chains and writes their rules again, so a table an admin emptied, or one
of an earlier version, is whole again after it; then it adds and removes elements. A removal
adds the element first: `delete element` of a missing one would fail the transaction, and a
removal must not fail for an element already gone.
"""

import json

from common.errors import HostError
from host_adapters.network.guest_firewall import NicRules, is_tap

FAMILY, TABLE = "bridge", "cloud_controller"
_T = f"{FAMILY} {TABLE}"

# name: key type
SETS = {
    "nic_source": "ifname . ether_addr . ipv4_addr",  # what a tap may send from: its MAC and address
    "nic_mac": "ifname . ether_addr",  # its MAC (DHCP requests from 0.0.0.0, ARP)
    "nic_address": "ifname . ipv4_addr",  # its address (ARP it sends, ARP asking for it)
    "isolated": "ifname",  # taps of isolated NICs
    "isolated_gateway": "ifname . ipv4_addr",  # what they may reach of their subnet
    "isolated_subnet": "ifname . ipv4_addr",  # their subnet (an interval)
}
_INTERVAL = {"isolated_subnet"}

# Ethernet/IPv4 ARP only: hardware type 1, protocol IPv4, address lengths 6 and 4.
_ARP_IPV4 = "arp htype 1 arp ptype ip arp hlen 6 arp plen 4"

CHAINS = {
    # Base chains, before anything else of the bridge family (priority -300 is the lowest
    # named one, "filter" is -200); policy accept: only our taps are ours to filter.
    "sent": ("type filter hook prerouting priority -300; policy accept;", [
        'iifname "cc-*" jump from_guest',
    ]),
    # What a guest sends to the host itself (DHCP to the network's dnsmasq, DNS, ARP, IPv4 to
    # the gateway) passes from_guest here a second time, as it did in prerouting.
    "sent_to_host": ("type filter hook input priority -300; policy accept;", [
        'iifname "cc-*" jump from_guest',
    ]),
    # Layer 2 isolation: whatever the IPv4 destination (another address of a guest, routed
    # through that guest's MAC), no frame between an isolated tap and another tap of ours.
    # The gateway is the bridge itself (input) or a port not ours: still reached.
    "between_ports": ("type filter hook forward priority -300; policy accept;", [
        'iifname @isolated oifname "cc-*" drop',
        'iifname "cc-*" oifname @isolated drop',
    ]),
    "received": ("type filter hook postrouting priority -300; policy accept;", [
        'oifname "cc-*" jump to_guest',
    ]),
    "from_guest": (None, [
        "iifname @isolated jump isolation",
        # A guest is never a DHCP server (a rogue offer on a provisioning network boots the
        # nodes from it); DHCPv6 replies are IPv6, dropped below with all of IPv6.
        "ether type ip udp sport 67 udp dport 68 drop",
        "ether type ip iifname . ether saddr . ip saddr @nic_source accept",
        # DHCP before the guest has its address.
        "ether type ip ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 "
        "iifname . ether saddr @nic_mac accept",
        f"ether type arp {_ARP_IPV4} iifname . ether saddr @nic_mac iifname . arp saddr ether @nic_mac "
        "iifname . arp saddr ip @nic_address accept",
        # Everything else: IPv6, VLAN tags, other MACs, other addresses, other protocols.
        "drop",
    ]),
    # An isolated NIC's IPv4 to its subnet: its gateway only; nothing to broadcast or multicast.
    # "return" goes on in from_guest, where the source is checked.
    "isolation": (None, [
        "ether type ip iifname . ip daddr @isolated_gateway return",
        "ether type ip iifname . ip daddr @isolated_subnet drop",
        "ether type ip ip daddr 224.0.0.0/4 drop",
        "ether type ip ip daddr 255.255.255.255 drop",
    ]),
    # Unicast only to the NIC's own MAC: frames the bridge floods (an unknown or aged-out
    # destination) or sends to a port that took another's MAC are not the guest's to read.
    "to_guest": (None, [
        "ether type ip oifname . ether daddr @nic_mac accept",
        "ether type ip ether daddr & 01:00:00:00:00:00 == 01:00:00:00:00:00 accept",  # group addresses
        f"ether type arp {_ARP_IPV4} oifname . arp daddr ip @nic_address accept",
        "drop",
    ]),
}


def _elements(nic: NicRules) -> dict[str, list[str]]:
    tap = f'"{nic.tap}"'  # is_tap: letters, digits and dashes only
    found = {
        "nic_source": [f"{tap} . {nic.mac} . {nic.address}"],
        "nic_mac": [f"{tap} . {nic.mac}"],
        "nic_address": [f"{tap} . {nic.address}"],
    }
    if nic.isolated:
        found["isolated"] = [tap]
        found["isolated_gateway"] = [f"{tap} . {nic.gateway}"]
        found["isolated_subnet"] = [f"{tap} . {nic.subnet}"]
    return found


def base() -> list[str]:
    """The table, its sets and chains, and the chains' rules written afresh."""
    lines = [f"add table {_T}"]
    for name, key in SETS.items():
        flags = " flags interval;" if name in _INTERVAL else ""
        lines.append(f"add set {_T} {name} {{ type {key};{flags} }}")
    for name, (hook, _) in CHAINS.items():
        lines.append(f"add chain {_T} {name}" + (f" {{ {hook} }}" if hook else ""))
    for name in CHAINS:
        lines.append(f"flush chain {_T} {name}")
    for name, (_, rules) in CHAINS.items():
        lines += [f"add rule {_T} {name} {rule}" for rule in rules]
    return lines


def batch(add: tuple[NicRules, ...] = (), remove: tuple[NicRules, ...] = ()) -> str:
    """One transaction for `nft -f -`: the base, then `remove`'s elements gone, then `add`'s
    there (a NIC in both keeps its elements)."""
    lines = base()
    for nic in remove:
        for name, items in _elements(nic).items():
            joined = ", ".join(items)
            lines.append(f"add element {_T} {name} {{ {joined} }}")
            lines.append(f"delete element {_T} {name} {{ {joined} }}")
    for nic in add:
        for name, items in _elements(nic).items():
            lines.append(f"add element {_T} {name} {{ {', '.join(items)} }}")
    return "\n".join(lines) + "\n"


def list_argv() -> list[str]:
    return ["nft", "-j", "list", "table", FAMILY, TABLE]


def parse(listing: str) -> set[NicRules]:
    """The NICs whose elements a `nft -j list table` of the table holds (whole ones: each NIC's
    source element and, when isolated, its gateway and subnet)."""
    try:
        items = json.loads(listing).get("nftables", [])
    except (ValueError, AttributeError):
        raise HostError("nft listed the guests' table in a form this version does not read") from None
    sets: dict[str, list] = {}
    for item in items:
        s = item.get("set") if isinstance(item, dict) else None
        if isinstance(s, dict) and s.get("table") == TABLE:
            sets[s.get("name", "")] = s.get("elem", [])

    def parts(elem) -> list:
        if isinstance(elem, dict) and "elem" in elem:  # an element with flags or a timeout
            elem = elem["elem"].get("val")
        if isinstance(elem, dict) and "concat" in elem:
            return [_value(v) for v in elem["concat"]]
        return [_value(elem)]

    gateways = {p[0]: p[1] for p in map(parts, sets.get("isolated_gateway", [])) if len(p) == 2}
    subnets = {p[0]: p[1] for p in map(parts, sets.get("isolated_subnet", [])) if len(p) == 2}
    found = set()
    for tap, mac, address in (p for p in map(parts, sets.get("nic_source", [])) if len(p) == 3):
        if not is_tap(tap):
            continue
        found.add(NicRules(tap=tap, mac=mac, address=address, gateway=gateways.get(tap), subnet=subnets.get(tap))
                  if tap in gateways and tap in subnets else NicRules(tap=tap, mac=mac, address=address))
    return found


def _value(v) -> str:
    if isinstance(v, dict) and "prefix" in v:
        return f"{v['prefix']['addr']}/{v['prefix']['len']}"
    if isinstance(v, dict) and "range" in v:
        return "-".join(map(str, v["range"]))
    return str(v)
