"""libvirt XML documents as small objects.

Each object writes exactly what it is given: which disk, which shares, which NICs, which
CPU mode a domain gets is decided one level up, in host_adapters/libvirt/driver.py.
"""

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from host_adapters.hypervisor import FilterRef


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def _to_xml(el: ET.Element) -> str:
    ET.indent(el)
    return ET.tostring(el, encoding="unicode")


@dataclass(frozen=True)
class Disk:
    """A file-backed disk: `<disk type='file' device='disk'>`."""

    path: str
    format: str = "qcow2"
    target_dev: str = "vda"
    bus: str = "virtio"
    readonly: bool = False

    def to_element(self) -> ET.Element:
        el = ET.Element("disk", type="file", device="disk")
        _sub(el, "driver", name="qemu", type=self.format)
        _sub(el, "source", file=self.path)
        _sub(el, "target", dev=self.target_dev, bus=self.bus)
        if self.readonly:
            _sub(el, "readonly")
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


@dataclass(frozen=True)
class Filesystem:
    """A host directory shared with the guest by virtiofs: `<filesystem type='mount'>`.

    The guest mounts it by its tag (`target_dir`):
    `mount -t virtiofs TAG DIR`. virtiofs needs the domain's memory shared
    (Domain.shared_memory).
    """

    source_dir: str
    target_dir: str
    driver: str = "virtiofs"
    accessmode: str = "passthrough"

    def to_element(self) -> ET.Element:
        el = ET.Element("filesystem", type="mount", accessmode=self.accessmode)
        if self.driver:
            _sub(el, "driver", type=self.driver)
        _sub(el, "source", dir=self.source_dir)
        _sub(el, "target", dir=self.target_dir)
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())

    @classmethod
    def from_element(cls, el: ET.Element) -> "Filesystem":
        source = el.find("source")
        target = el.find("target")
        driver = el.find("driver")
        return cls(
            source_dir=source.get("dir", "") if source is not None else "",
            target_dir=target.get("dir", "") if target is not None else "",
            # libvirt's default driver for type='mount' is 9p ("path").
            driver=driver.get("type", "path") if driver is not None else "path",
            accessmode=el.get("accessmode", "passthrough"),
        )


def _filterref_element(ref: FilterRef) -> ET.Element:
    """`<filterref filter=NAME>` with a `<parameter name value/>` per parameter (nwfilter)."""
    el = ET.Element("filterref", filter=ref.name)
    for key, value in ref.parameters:
        _sub(el, "parameter", name=key, value=value)
    return el


NIC_RULES_NS = "urn:cloud-controller:nic-rules:1"
ET.register_namespace("cc", NIC_RULES_NS)


def nic_rules_element(rules: Iterable[tuple[str, FilterRef]]) -> ET.Element:
    """`<cc:nic-rules>`: per NIC (by MAC) the name of its rules and their parameters."""
    el = ET.Element(f"{{{NIC_RULES_NS}}}nic-rules")
    for mac, ref in rules:
        nic = ET.SubElement(el, f"{{{NIC_RULES_NS}}}nic", mac=mac, rules=ref.name)
        for key, value in ref.parameters:
            ET.SubElement(nic, f"{{{NIC_RULES_NS}}}parameter", name=key, value=value)
    return el


def nic_rules_of(domain_xml: str) -> dict[str, FilterRef]:
    """A domain's NIC rules by MAC, from its <metadata> (empty for a domain of an earlier version)."""
    found: dict[str, FilterRef] = {}
    for nic in ET.fromstring(domain_xml).iterfind(f"metadata/{{{NIC_RULES_NS}}}nic-rules/{{{NIC_RULES_NS}}}nic"):
        params = tuple(sorted((p.get("name", ""), p.get("value", ""))
                              for p in nic.iterfind(f"{{{NIC_RULES_NS}}}parameter")))
        found[nic.get("mac", "").lower()] = FilterRef(name=nic.get("rules", ""), parameters=params)
    return found


def replace_nic_rules(domain_xml: str, rules: Iterable[tuple[str, FilterRef]]) -> str:
    """The domain with its NIC rules (metadata) replaced by `rules`; other metadata kept."""
    root = ET.fromstring(domain_xml)
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.Element("metadata")
        root.insert(2, metadata)
    for old in metadata.findall(f"{{{NIC_RULES_NS}}}nic-rules"):
        metadata.remove(old)
    rules = tuple(rules)
    if rules:
        metadata.append(nic_rules_element(rules))
    elif not len(metadata):
        root.remove(metadata)
    return _to_xml(root)


def _filterref_of(el: ET.Element) -> FilterRef:
    params = tuple(sorted((p.get("name", ""), p.get("value", "")) for p in el.findall("parameter")))
    return FilterRef(name=el.get("filter", ""), parameters=params)


@dataclass(frozen=True)
class Interface:
    """A virtio NIC with a fixed MAC on a libvirt network or, with `bridge`, on a host bridge.
    `target_dev` names its tap on the host (guest_firewall.tap_name), which the guests' network
    rules are keyed by. `filterref` is read only: the nwfilter a domain of an earlier version
    has libvirt apply (this version writes its own rules instead, network/guest_firewall.py)."""

    mac: str
    network: str | None = None
    bridge: str | None = None
    model: str = "virtio"
    filterref: FilterRef | None = None
    target_dev: str | None = None

    def to_element(self) -> ET.Element:
        el = ET.Element("interface", type="network" if self.network is not None else "bridge")
        _sub(el, "mac", address=self.mac)
        if self.network is not None:
            _sub(el, "source", network=self.network)
        else:
            _sub(el, "source", bridge=self.bridge or "")
        if self.target_dev is not None:
            _sub(el, "target", dev=self.target_dev)
        _sub(el, "model", type=self.model)
        # No option ROM (iPXE): guests boot from their disk, never from the network, and
        # under TCG SeaBIOS running iPXE's start-up took about 0.1 s of CPU per start.
        _sub(el, "rom", enabled="no")
        if self.filterref is not None:
            el.append(_filterref_element(self.filterref))
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())

    @classmethod
    def from_element(cls, el: ET.Element) -> "Interface":
        mac = el.find("mac")
        source = el.find("source")
        model = el.find("model")
        filterref = el.find("filterref")
        target = el.find("target")
        network = bridge = None
        if source is not None:
            network = source.get("network")
            # A running domain's NIC on a network also names the network's bridge.
            bridge = None if network is not None else source.get("bridge")
        return cls(
            mac=(mac.get("address", "") if mac is not None else "").lower(),
            network=network,
            bridge=bridge,
            model=model.get("type", "") if model is not None else "",
            filterref=_filterref_of(filterref) if filterref is not None else None,
            target_dev=target.get("dev") if target is not None else None,
        )


@dataclass(frozen=True)
class Domain:
    """A persistent domain definition (`virDomainDefineXML` input)."""

    name: str
    uuid: str
    memory_mb: int
    vcpu: int
    virt_type: str = "kvm"
    os_type: str = "hvm"
    disks: tuple[Disk, ...] = ()
    filesystems: tuple[Filesystem, ...] = ()
    interfaces: tuple[Interface, ...] = ()
    features: tuple[str, ...] = ()
    # Guest RAM as a shared memfd: virtiofsd must map it.
    shared_memory: bool = False
    cpu_mode: str | None = None
    cpu_model: str | None = None  # with cpu_mode "custom"
    serial_console: bool = False
    # With serial_console: the file the serial port's output is kept in, started afresh at
    # every start of QEMU (append='off'); and SeaBIOS writing to the serial port too.
    serial_log: str | None = None
    bios_serial: bool = False
    # Each NIC's rules by MAC (network/guest_firewall.py): kept in the domain's <metadata>, where starts
    # and restores read them from the host itself.
    nic_rules: tuple[tuple[str, FilterRef], ...] = ()

    def to_element(self) -> ET.Element:
        dom = ET.Element("domain", type=self.virt_type)
        _sub(dom, "name", self.name)
        _sub(dom, "uuid", self.uuid)
        if self.nic_rules:
            _sub(dom, "metadata").append(nic_rules_element(self.nic_rules))
        _sub(dom, "memory", str(self.memory_mb), unit="MiB")
        _sub(dom, "vcpu", str(self.vcpu))
        if self.shared_memory:
            backing = _sub(dom, "memoryBacking")
            _sub(backing, "source", type="memfd")
            _sub(backing, "access", mode="shared")
        os_el = _sub(dom, "os")
        _sub(os_el, "type", self.os_type)
        _sub(os_el, "boot", dev="hd")
        if self.bios_serial:
            _sub(os_el, "bios", useserial="yes")
        if self.features:
            feats = _sub(dom, "features")
            for name in self.features:
                _sub(feats, name)
        if self.cpu_mode == "custom":
            cpu = _sub(dom, "cpu", mode="custom", match="exact")
            _sub(cpu, "model", self.cpu_model or "", fallback="allow")
        elif self.cpu_mode:
            _sub(dom, "cpu", mode=self.cpu_mode)
        devices = _sub(dom, "devices")
        for disk in self.disks:
            devices.append(disk.to_element())
        for fs in self.filesystems:
            devices.append(fs.to_element())
        for nic in self.interfaces:
            devices.append(nic.to_element())
        if self.serial_console:
            serial = _sub(devices, "serial", type="pty")
            if self.serial_log:
                _sub(serial, "log", file=self.serial_log, append="off")
            _sub(devices, "console", type="pty")
        # Devices libvirt would add that no guest of ours uses: a USB controller (nothing is
        # ever plugged in) and a memory balloon (the controller never reclaims guest memory).
        # Fewer devices for QEMU to make and for the firmware and the guest's kernel to probe.
        _sub(devices, "controller", type="usb", model="none")
        _sub(devices, "memballoon", model="none")
        return dom

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


@dataclass(frozen=True)
class BackingStore:
    path: str
    format: str = "qcow2"


@dataclass(frozen=True)
class Volume:
    """A storage volume (`virStorageVolCreateXML` input), optionally an overlay on a backing file."""

    name: str
    capacity_bytes: int
    format: str = "qcow2"
    backing: BackingStore | None = field(default=None)

    def to_element(self) -> ET.Element:
        vol = ET.Element("volume")
        _sub(vol, "name", self.name)
        _sub(vol, "capacity", str(self.capacity_bytes), unit="bytes")
        _sub(vol, "allocation", "0", unit="bytes")
        target = _sub(vol, "target")
        _sub(target, "format", type=self.format)
        if self.backing is not None:
            bs = _sub(vol, "backingStore")
            _sub(bs, "path", self.backing.path)
            _sub(bs, "format", type=self.backing.format)
        return vol

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


def filesystems_of(domain_xml: str) -> list[Filesystem]:
    """The `<filesystem>` devices of a domain document, in document order."""
    devices = ET.fromstring(domain_xml).find("devices")
    if devices is None:
        return []
    return [Filesystem.from_element(el) for el in devices.findall("filesystem")]


def replace_devices(domain_xml: str, tag: str, devices: list) -> str:
    """The domain document with its `<tag>` devices replaced by `devices` (objects with to_element).

    Every other element is kept as it was.
    """
    dom = ET.fromstring(domain_xml)
    parent = dom.find("devices")
    if parent is None:
        parent = _sub(dom, "devices")
    for el in parent.findall(tag):
        parent.remove(el)
    for device in devices:
        parent.append(device.to_element())
    return _to_xml(dom)


def normalized(domain_xml: str) -> str:
    """The document as replace_devices writes it, to tell whether a replacement changed anything."""
    return _to_xml(ET.fromstring(domain_xml))


def interfaces_of(domain_xml: str) -> list[Interface]:
    """The `<interface>` devices of a domain document, in document order."""
    devices = ET.fromstring(domain_xml).find("devices")
    if devices is None:
        return []
    return [Interface.from_element(el) for el in devices.findall("interface")]


def bridges_of(domain_xml: str) -> set[str]:
    """The host bridges a running domain's NICs are ports of (a NIC on a libvirt network names
    its network's bridge too, in the live definition)."""
    return {source.get("bridge") for source in ET.fromstring(domain_xml).iterfind("devices/interface/source")
            if source.get("bridge")}


def disk_sources_of(domain_xml: str) -> list[str]:
    """The source files of a domain's file-backed disks, in document order."""
    devices = ET.fromstring(domain_xml).find("devices")
    if devices is None:
        return []
    return [src.get("file", "") for src in devices.findall("disk/source") if src.get("file")]


@dataclass(frozen=True)
class DhcpHost:
    """A DHCP reservation of a libvirt network: `<host mac name ip/>` (virNetworkUpdate input)."""

    mac: str
    ip: str
    name: str = ""

    def to_element(self) -> ET.Element:
        attrs = {"mac": self.mac}
        if self.name:
            attrs["name"] = self.name
        attrs["ip"] = self.ip
        return ET.Element("host", attrs)

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


@dataclass(frozen=True)
class DnsHost:
    """A name of the network's DNS: `<dns><host ip><hostname/></host></dns>` (virNetworkUpdate
    input). libvirt gives it to dnsmasq as an additional hosts file: answered at once, with no
    lease (a DHCP host's name is answered only while that host holds a lease)."""

    ip: str
    names: tuple[str, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("host", ip=self.ip)
        for name in self.names:
            _sub(el, "hostname", name)
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


@dataclass(frozen=True)
class Network:
    """A NAT network on a bridge libvirt names itself; `hosts` are DHCP reservations.

    Guests get their address from the seed's network config; the DHCP hosts record
    which MAC holds which address and name (dnsmasq serves only them), the DNS names
    name the guests in dnsmasq's DNS (network.py: NetworkPart._update_hosts).
    """

    name: str
    gateway: str
    netmask: str
    hosts: tuple[DhcpHost, ...] = ()
    forward: str = "nat"

    def to_element(self) -> ET.Element:
        net = ET.Element("network")
        _sub(net, "name", self.name)
        _sub(net, "forward", mode=self.forward)
        ip = _sub(net, "ip", address=self.gateway, netmask=self.netmask)
        dhcp = _sub(ip, "dhcp")
        for host in self.hosts:
            dhcp.append(host.to_element())
        return net

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


def _elements(document: str, *, chunk: int = 65536) -> Iterator[tuple[str, ET.Element, list[ET.Element]]]:
    """(event, element, its ancestors) of a document read piece by piece, without the
    tree: a network of 10,000 reservations parsed whole was 5-10 MB of a server's
    memory at every change of its reservations. At "end" the caller may read the
    element; it is dropped from its parent afterwards."""
    parser = ET.XMLPullParser(events=("start", "end"))
    ancestors: list[ET.Element] = []
    for start in range(0, len(document), chunk):
        parser.feed(document[start:start + chunk])
        for event, element in parser.read_events():
            if event == "start":
                yield event, element, ancestors
                ancestors.append(element)
            else:
                ancestors.pop()
                yield event, element, ancestors
                if len(ancestors) > 1:
                    ancestors[-1].remove(element)
    parser.close()


def iter_dhcp_hosts(network_xml: str) -> Iterator[DhcpHost]:
    """The DHCP reservations of a network document (`ip/dhcp/host`), one at a time."""
    for event, element, ancestors in _elements(network_xml):
        if event == "end" and element.tag == "host" and [a.tag for a in ancestors[1:]] == ["ip", "dhcp"]:
            yield DhcpHost(mac=element.get("mac", "").lower(), ip=element.get("ip", ""),
                           name=element.get("name", ""))


def iter_dns_hosts(network_xml: str) -> Iterator[DnsHost]:
    """The DNS names of a network document (`dns/host`), one address at a time."""
    names: list[str] = []
    for event, element, ancestors in _elements(network_xml):
        if event != "end":
            continue
        where = [a.tag for a in ancestors[1:]]
        # A host's names are read as each ends: _elements drops an element once it is read.
        if element.tag == "hostname" and where == ["dns", "host"]:
            names.append((element.text or "").strip())
        elif element.tag == "host" and where == ["dns"]:
            yield DnsHost(ip=element.get("ip", ""), names=tuple(names))
            names = []


def dhcp_hosts_of(network_xml: str) -> list[DhcpHost]:
    """The DHCP reservations of a network document."""
    return list(iter_dhcp_hosts(network_xml))


def network_ip_of(network_xml: str) -> tuple[str, str] | None:
    """(address, netmask or prefix) of a network's first IPv4 `<ip>`, or None."""
    for ip in ET.fromstring(network_xml).findall("ip"):
        if ip.get("family", "ipv4") == "ipv4" and ip.get("address"):
            return ip.get("address"), ip.get("netmask") or ip.get("prefix", "")
    return None


def serves_addresses(network_xml: str) -> bool:
    """Whether libvirt runs DHCP on the network: it has an IPv4 `<ip>` (NAT or routed; libvirt
    drops an empty `<dhcp/>`, so that element cannot tell). A bridged network has none."""
    for event, element, ancestors in _elements(network_xml):
        if event == "start" and element.tag == "ip" and len(ancestors) == 1 \
                and element.get("family", "ipv4") == "ipv4":
            return True
    return False


def backing_path_of(volume_xml: str) -> str | None:
    """The backing file path of a volume document, or None."""
    path = ET.fromstring(volume_xml).find("backingStore/path")
    return path.text if path is not None and path.text else None
