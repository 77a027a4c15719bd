"""Instance addresses: the controller, not a hypervisor host, owns the pools.

Each instance gets a hostname, a MAC derived from its id and the lowest free
address of the private subnet (and of the public pool when configured), all
unique among live instances. The store picks them inside the transaction that
inserts the instance, so two concurrent creates never get the same one; a
deleted instance's addresses are free again with its row.
"""

import hashlib
import ipaddress
from dataclasses import dataclass

from controller.errors import Conflict, InvalidInput
from host_adapters.guests.guest import Nic


@dataclass(frozen=True)
class NetworkPlan:
    name: str
    subnet: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address  # the host's address on the private network
    public_bridge: str | None = None
    public_first: ipaddress.IPv4Address | None = None
    public_last: ipaddress.IPv4Address | None = None
    public_prefix: int | None = None
    public_gateway: ipaddress.IPv4Address | None = None
    public_dns: tuple[str, ...] = ()
    isolate_guests: bool = False  # private NICs reach the gateway only (host_adapters/libvirt/nic_filters.py)

    @property
    def has_public(self) -> bool:
        return self.public_bridge is not None


def _bad(key: str, why: str) -> InvalidInput:
    return InvalidInput(f"config [network] {key}: {why}")


def network_plan(config) -> NetworkPlan:
    """The [network] section, checked; InvalidInput names the bad key."""
    net = config.network  # typed and stripped by controller/config.py
    try:
        subnet = ipaddress.IPv4Network(net.subnet, strict=True)
    except ValueError as e:
        raise _bad("subnet", f"{net.subnet!r} is not an IPv4 network in CIDR form ({e})") from None
    if subnet.prefixlen > 29:
        raise _bad("subnet", f"{subnet} is too small")
    plan = dict(name=net.name, subnet=subnet, gateway=subnet.network_address + 1)
    if not plan["name"]:
        raise _bad("name", "a libvirt network name is required")
    plan["isolate_guests"] = net.isolate_guests
    bridge = net.public_bridge
    if bridge:
        try:
            first, _, last = net.public_pool.partition("-")
            first, last = ipaddress.IPv4Address(first.strip()), ipaddress.IPv4Address(last.strip())
        except ValueError:
            raise _bad("public_pool", "must be FIRST-LAST, two IPv4 addresses") from None
        if last < first:
            raise _bad("public_pool", "LAST is before FIRST")
        try:
            prefix = int(net.public_prefix)
            if not 1 <= prefix <= 32:
                raise ValueError
            gateway = ipaddress.IPv4Address(net.public_gateway) if net.public_gateway else None
            dns = tuple(str(ipaddress.IPv4Address(d.strip())) for d in net.public_dns.split(",") if d.strip())
        except ValueError:
            raise _bad("public_prefix", "public_prefix (1-32), public_gateway and public_dns must be valid") from None
        plan.update(public_bridge=bridge, public_first=first, public_last=last, public_prefix=prefix,
                    public_gateway=gateway, public_dns=dns)
    return NetworkPlan(**plan)


def mac_for(instance_id: str, used: set[str]) -> str:
    """52:54:00 (QEMU's range) and three bytes of a hash of the id; rehashed on a clash."""
    n = 0
    while True:
        digest = hashlib.sha256(f"{instance_id}:{n}".encode() if n else instance_id.encode()).digest()
        mac = "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])
        if mac not in used:
            return mac
        n += 1


def hostname_for(instance_id: str, used: set[str]) -> str:
    """`vm-` and the start of the id (hex), longer while it clashes."""
    hexid = instance_id.replace("-", "").lower()
    for length in range(8, len(hexid) + 1):
        name = f"vm-{hexid[:length]}"
        if name not in used:
            return name
    raise Conflict(f"no free hostname for instance {instance_id}")


def _lowest_free(candidates, used: set[str], what: str) -> str:
    for address in candidates:
        if str(address) not in used:
            return str(address)
    raise Conflict(f"no free {what} address: every address of the pool is in use")


def allocate(plan: NetworkPlan, instance_id: str, used: dict[str, set[str]]) -> dict:
    """The address columns of a new instance row, given what live instances use
    (keys: private_ip, public_ip, mac, hostname)."""
    private = (a for a in plan.subnet.hosts() if a != plan.gateway)
    row = {
        "hostname": hostname_for(instance_id, used["hostname"]),
        "mac": mac_for(instance_id, used["mac"]),
        "private_ip": _lowest_free(private, used["private_ip"], f"private ({plan.subnet})"),
        "public_ip": None,
        "public_mac": None,
    }
    if plan.has_public:
        first, last = int(plan.public_first), int(plan.public_last)
        pool = (ipaddress.IPv4Address(i) for i in range(first, last + 1))
        row["public_ip"] = _lowest_free(pool, used["public_ip"], f"public ({plan.public_first}-{plan.public_last})")
        row["public_mac"] = mac_for(instance_id + ":public", used["mac"] | {row["mac"]})
    return row


def nics_of(plan: NetworkPlan, row: dict) -> tuple[Nic, ...]:
    """The guest NICs of an instance row (none for rows made before instances had addresses)."""
    nics = []
    if row.get("private_ip") and row.get("mac"):
        nics.append(Nic(mac=row["mac"], address=row["private_ip"], prefix=plan.subnet.prefixlen,
                        gateway=str(plan.gateway), dns=(str(plan.gateway),), network=plan.name,
                        isolated=plan.isolate_guests))
    if row.get("public_ip") and row.get("public_mac") and plan.has_public:
        nics.append(Nic(mac=row["public_mac"], address=row["public_ip"], prefix=plan.public_prefix,
                        gateway=str(plan.public_gateway) if plan.public_gateway else None,
                        dns=plan.public_dns, bridge=plan.public_bridge))
    return tuple(nics)
