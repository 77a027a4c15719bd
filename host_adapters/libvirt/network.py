"""A host's private network and its reservations (one per instance NIC: a DHCP host and a
DNS name, _update_hosts).
"""

import contextlib
import ipaddress
import threading
from collections.abc import Iterable

from common.errors import HostUnavailable, InvalidInput
from host_adapters.guests.guest import GuestSpec, Reservation
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt import test_driver
from host_adapters.libvirt.connection import _code, _libvirt


def _netmask(subnet: str) -> tuple[ipaddress.IPv4Network, str]:
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise InvalidInput(f"invalid network subnet {subnet!r}: {e}") from None
    if net.num_addresses < 8:
        raise InvalidInput(f"network subnet {subnet} is too small")
    return net, str(net.netmask)


def gateway_of(subnet: str) -> str:
    """The host's address on a private network: the subnet's first address."""
    net, _ = _netmask(subnet)
    return str(net.network_address + 1)


class NetworkPart:
    """The private network of LibvirtHypervisor (driver.py): `network` names it, `subnet` its
    addresses; ensure_network() makes it."""

    def _init_network(self, network: str, subnet: str) -> None:
        self.network = network
        self.subnet, self._netmask = _netmask(subnet)
        # Reservations postponed by batch(), made together when it ends; None outside one.
        self._queued_hosts: dict[str, Reservation] | None = None  # by MAC
        self._batch_lock = threading.Lock()

    def _network(self, conn, name: str | None = None, *, required: bool = True):
        lv = _libvirt()
        name = name or self.network
        try:
            net = conn.networkLookupByName(name)
            if name == self.network:
                self._locate(conn, net)
            return net
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_NO_NETWORK:
                raise
            if required:
                raise HostUnavailable(
                    f"libvirt network {name!r} not found at {self.uri}: run `cloud-agent init`"
                ) from e
            return None

    def _network_definition(self) -> domain_xml.Network:
        return domain_xml.Network(
            name=self.network, gateway=str(self.subnet.network_address + 1), netmask=self._netmask
        )

    def ensure_network(self) -> bool:
        def op(conn):
            net = self._network(conn, required=False)
            changed = False
            if net is None:
                net = conn.networkDefineXML(self._network_definition().to_xml())
                changed = True
            if not net.isActive():
                net.create()
                changed = True
            self._locate(conn, net)
            if self._located:  # a new bridge learns from link-local frames (network/bridge_ports.py)
                self.firewall.seal((self._located,))
            if not net.autostart():
                net.setAutostart(1)
            return changed

        return self._call(f"create network {self.network}", op)

    def network_status(self) -> str:
        def op(conn):
            net = self._network(conn, required=False)
            return "missing" if net is None else ("active" if net.isActive() else "inactive")

        return self._call(f"state of network {self.network}", op)

    def uses_dhcp_reservations(self) -> bool:
        def op(conn):
            net = self._network(conn)
            return domain_xml.serves_addresses(net.XMLDesc(0))

        return self._call(f"read network {self.network}", op)

    def list_reservations(self) -> list[Reservation]:
        return self._call("list reservations", lambda conn: sorted(self._reservations_all(conn), key=lambda r: r.mac))

    def drop_reservations(self, macs: list[str]) -> None:
        self._call("drop reservations", lambda conn: self._update_hosts(conn, remove=set(macs)))

    @staticmethod
    def _host_documents(conn, net) -> tuple[str, str, bool, bool]:
        """(the network's definition, what its dnsmasq serves, whether it is started, whether it
        is defined): DHCP hosts are kept in the first, DNS names in the second (_update_hosts
        says why). One document for a network that is only one of the two (transient, or not
        started), and on libvirt's test driver, which cannot read a definition apart (its
        reservations are kept in both alike)."""
        lv = _libvirt()
        served = net.XMLDesc(0)
        active, persistent = bool(net.isActive()), bool(net.isPersistent())
        if active and persistent and not test_driver.is_test_driver(conn):
            return net.XMLDesc(lv.VIR_NETWORK_XML_INACTIVE), served, active, persistent
        return served, served, active, persistent

    @staticmethod
    def _as_reservations(hosts: list[domain_xml.DhcpHost], served: str) -> list[Reservation]:
        """The reservations of `hosts`, each with its hostname only where the network's DNS
        answers that name with that address: a name missing there is drift to repair."""
        if not hosts:
            return []
        ips = {h.ip for h in hosts}
        named = {(d.ip, n) for d in domain_xml.iter_dns_hosts(served) if d.ip in ips for n in d.names}
        return sorted(
            (Reservation(mac=h.mac, address=h.ip, hostname=h.name if (h.ip, h.name) in named else "")
             for h in hosts),
            key=lambda r: r.mac,
        )

    def _reservations(self, conn, macs: set[str]) -> list[Reservation]:
        net = self._network(conn, required=False)
        if net is None or not macs:
            return []
        definition, served, _, _ = self._host_documents(conn, net)
        return self._as_reservations([h for h in domain_xml.iter_dhcp_hosts(definition) if h.mac in macs], served)

    def _reservations_all(self, conn) -> list[Reservation]:
        net = self._network(conn, required=False)
        if net is None:
            return []
        definition, served, _, _ = self._host_documents(conn, net)
        return self._as_reservations(domain_xml.dhcp_hosts_of(definition), served)

    @contextlib.contextmanager
    def batch(self):
        # libvirt changes a network's DHCP hosts one per virNetworkUpdate, and each update
        # copies the whole definition: 10,000 spawns took minutes on the test driver. In
        # a batch, spawns queue their reservations and they are made together at the end.
        with self._batch_lock:
            self._queued_hosts = {}
            try:
                yield
            finally:
                queued, self._queued_hosts = self._queued_hosts, None
            if queued:
                self._call("reserve addresses", lambda conn: self._add_hosts_at_once(conn, list(queued.values())))

    def _add_hosts_at_once(self, conn, add: list[Reservation]) -> None:
        """Add many reservations: one by one on a host (its network is never restarted under
        running guests); on the test driver by one new definition of the network."""
        if not test_driver.is_test_driver(conn):
            self._update_hosts(conn, add=add)
            return
        test_driver.add_hosts_by_redefining(conn, self._network(conn), self.network, add)

    def _update_hosts(self, conn, *, add: Iterable[Reservation] = (), remove: Iterable[str] = ()) -> None:
        """Drop the reservations of the MACs in `remove`, then add `add` (replacing any of the same MAC).

        A reservation is two entries of the network: a DHCP host (MAC, address, hostname) in
        its definition, and a DNS name (address, hostname) in the definition and in the running
        dnsmasq. Guests take their address from the seed, never by DHCP, and dnsmasq answers a
        DHCP host's name only while that host holds a lease, so only the DNS name is needed
        live. A DHCP host changed live costs libvirt a rebuild of the network's firewall rules
        (38 iptables commands, 0.45 s, under the network's lock: the serial step of a burst
        of creates); in the definition, and as a DNS name, a few milliseconds. The DHCP host
        stays the record reconcile reads (which MAC holds which address and name), and
        dnsmasq gets it at the network's next start.

        In a batch() a pure addition is queued instead (made when the batch ends)."""
        lv = _libvirt()
        add = list(add)
        queued = self._queued_hosts
        if queued is not None:
            for mac in remove:
                queued.pop(mac, None)  # an undone spawn's too
            if add and not set(remove) - {r.mac for r in add}:
                queued.update((r.mac, r) for r in add)
                return
        remove = {*remove, *(r.mac for r in add)}
        net = self._network(conn, required=bool(add))
        if net is None:
            return
        definition, served, active, persistent = self._host_documents(conn, net)
        if not domain_xml.serves_addresses(definition):
            return  # a bridged network: libvirt hands out no addresses there, the seed's static config does
        config = lv.VIR_NETWORK_UPDATE_AFFECT_CONFIG if persistent else 0
        live = lv.VIR_NETWORK_UPDATE_AFFECT_LIVE if active else 0
        # A transient network has no definition to keep them in; the test driver, no way to read
        # one apart from what it serves (_host_documents).
        dhcp_flags = (config | live) if test_driver.is_test_driver(conn) else (config or live)
        dns_flags = config | live
        wanted = {domain_xml.DhcpHost(mac=r.mac, ip=r.address, name=r.hostname) for r in add}
        wanted_ips, wanted_names = {w.ip for w in wanted}, {w.name for w in wanted if w.name}

        def clashes(host) -> bool:
            # libvirt refuses an entry sharing a MAC, an address or a name with another;
            # the controller owns these, so a stale one gives way.
            return any(host.ip == w.ip or (host.name and host.name == w.name) for w in wanted)

        # Only the entries this change touches are kept (a network may hold 10,000).
        existing = [h for h in domain_xml.iter_dhcp_hosts(definition)
                    if h in wanted or h.mac in remove or clashes(h)]
        del definition
        gone = [h for h in existing if h not in wanted and (h.mac in remove or clashes(h))]
        named = {domain_xml.DnsHost(ip=w.ip, names=(w.name,)) for w in wanted if w.name}
        gone_ips = {h.ip for h in gone}
        names = [d for d in domain_xml.iter_dns_hosts(served)
                 if d in named or d.ip in gone_ips or d.ip in wanted_ips or wanted_names & set(d.names)]
        del served
        # Names go first and come last: a DNS name never outlives its DHCP host (reconcile
        # finds a DHCP host without its name, and repairs or drops it).
        for name in names:
            if name not in named:
                net.update(lv.VIR_NETWORK_UPDATE_COMMAND_DELETE, lv.VIR_NETWORK_SECTION_DNS_HOST, -1,
                           name.to_xml(), dns_flags)
        for host in gone:
            net.update(lv.VIR_NETWORK_UPDATE_COMMAND_DELETE, lv.VIR_NETWORK_SECTION_IP_DHCP_HOST, -1,
                       host.to_xml(), dhcp_flags)
        for host in wanted - set(existing):
            net.update(lv.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, lv.VIR_NETWORK_SECTION_IP_DHCP_HOST, -1,
                       host.to_xml(), dhcp_flags)
        for name in named - set(names):
            net.update(lv.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, lv.VIR_NETWORK_SECTION_DNS_HOST, -1,
                       name.to_xml(), dns_flags)
