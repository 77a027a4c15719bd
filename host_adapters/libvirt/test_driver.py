"""libvirt's test driver (test:///): everything the adapter does differently there, in one place.

The test driver keeps domains, networks and volumes in memory and runs no
guest; the sandbox and the contract tests use it. The adapter asks
is_test_driver(conn) at the few points where it differs, and takes the way
given here:

- check() looks at the storage pool and the network only: the subnet's gateway,
  virt_type, cpu_mode and network filters matter only to guests that run
  (checks.py); probe_guest() starts nothing;
- no network filters are defined (the driver has none; network.py);
- many DHCP reservations are added by one new definition of the network
  (add_hosts_by_redefining; a host's network is never restarted under its guests);
- domains are of the driver's own type (DOMAIN_TYPE) and, with the adapter's
  `lean_definitions`, carry only what the controller reads back (lean_domain).

Set for the sandbox, whatever the driver (its test driver forgets volumes
between processes): with `stand_in_base_images` spawn makes a blank base disk
where one is missing (stand_in_base). The test driver has no volume streams:
the factory gives it InProcessVolumeIO (volume_io.py).
"""

import xml.etree.ElementTree as ET

from common.errors import HostError
from host_adapters.guests.guest import Reservation
from host_adapters.hypervisor import GiB
from host_adapters.libvirt import xml as domain_xml
from host_adapters.names import Names

# The only domain type the test driver accepts.
DOMAIN_TYPE = "test"


def is_test_driver(conn) -> bool:
    return conn.getType().lower() == "test"


def stand_in_base(pool, names: Names, base_image: str):
    """A blank base disk (1 GiB) made under the name of a missing base image volume; None,
    making nothing, for a name that is not a base image's."""
    if not names.image_of_base(base_image):
        return None
    return pool.createXML(domain_xml.Volume(name=base_image, capacity_bytes=GiB).to_xml(), 0)


def lean_domain(name: str, uuid: str, *, memory_mb: int, vcpu: int, filesystems, interfaces,
                nic_rules=()) -> domain_xml.Domain:
    """A domain holding only what the controller reads back (shares, NICs and their rules). The test driver
    runs no guest and keeps every definition in its process (twice while running): 10,000 full
    ones cost 150 MB. Disks and seed stay pool volumes, which is where describe() looks for them."""
    return domain_xml.Domain(name=name, uuid=uuid, memory_mb=memory_mb, vcpu=vcpu, virt_type=DOMAIN_TYPE,
                             filesystems=filesystems, interfaces=interfaces, nic_rules=nic_rules)


def add_hosts_by_redefining(conn, net, network: str, add: list[Reservation]) -> None:
    """Add many reservations (DHCP hosts and DNS names) to the network `net` (named `network`)
    by one new definition with all of them and a restart of the network: nothing runs on the
    test driver's network."""
    root = ET.fromstring(net.XMLDesc(0))
    dhcp = root.find("ip/dhcp")
    if dhcp is None:
        ip = root.find("ip")
        if ip is None:
            raise HostError(f"network {network} has no <ip> for DHCP reservations")
        dhcp = ET.SubElement(ip, "dhcp")
    wanted = {r.mac: r for r in add}
    ips, names = {r.address for r in add}, {r.hostname for r in add if r.hostname}
    for host in dhcp.findall("host"):
        # As in NetworkPart._update_hosts: a stale entry sharing a MAC, an address or a name gives way.
        if host.get("mac", "").lower() in wanted or host.get("ip") in ips or host.get("name") in names:
            dhcp.remove(host)
    for r in wanted.values():
        dhcp.append(domain_xml.DhcpHost(mac=r.mac, ip=r.address, name=r.hostname).to_element())
    # Each named one's DNS name too (NetworkPart._update_hosts), in place of any sharing its address or name.
    dns = root.find("dns")
    if dns is None:
        dns = ET.Element("dns")
        root.insert(list(root).index(root.find("ip")), dns)
    for host in dns.findall("host"):
        if host.get("ip") in ips or {(n.text or "").strip() for n in host.findall("hostname")} & names:
            dns.remove(host)
    for r in wanted.values():
        if r.hostname:
            dns.append(domain_xml.DnsHost(ip=r.address, names=(r.hostname,)).to_element())
    # Stopped first: the test driver keeps running on the old definition across a restart.
    was_active = net.isActive()
    if was_active:
        net.destroy()
    net = conn.networkDefineXML(ET.tostring(root, encoding="unicode"))
    if was_active:
        net.create()
