"""libvirt XML documents as small objects.

Each object writes exactly what it is given: which disk, which shares, which
CPU mode a domain gets is decided one level up, in host_adapters/hypervisor.py.
"""

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field


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

    def to_element(self) -> ET.Element:
        el = ET.Element("disk", type="file", device="disk")
        _sub(el, "driver", name="qemu", type=self.format)
        _sub(el, "source", file=self.path)
        _sub(el, "target", dev=self.target_dev, bus=self.bus)
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())


@dataclass(frozen=True)
class Filesystem:
    """A host directory shared with the guest: `<filesystem type='mount'>`.

    The guest mounts it by its tag (`target_dir`), e.g.
    `mount -t 9p -o trans=virtio TAG /mnt`.
    """

    source_dir: str
    target_dir: str
    accessmode: str = "mapped"

    def to_element(self) -> ET.Element:
        el = ET.Element("filesystem", type="mount", accessmode=self.accessmode)
        _sub(el, "source", dir=self.source_dir)
        _sub(el, "target", dir=self.target_dir)
        return el

    def to_xml(self) -> str:
        return _to_xml(self.to_element())

    @classmethod
    def from_element(cls, el: ET.Element) -> "Filesystem":
        source = el.find("source")
        target = el.find("target")
        return cls(
            source_dir=source.get("dir", "") if source is not None else "",
            target_dir=target.get("dir", "") if target is not None else "",
            accessmode=el.get("accessmode", "passthrough"),
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
    features: tuple[str, ...] = ()
    cpu_mode: str | None = None
    serial_console: bool = False

    def to_element(self) -> ET.Element:
        dom = ET.Element("domain", type=self.virt_type)
        _sub(dom, "name", self.name)
        _sub(dom, "uuid", self.uuid)
        _sub(dom, "memory", str(self.memory_mb), unit="MiB")
        _sub(dom, "vcpu", str(self.vcpu))
        os_el = _sub(dom, "os")
        _sub(os_el, "type", self.os_type)
        _sub(os_el, "boot", dev="hd")
        if self.features:
            feats = _sub(dom, "features")
            for name in self.features:
                _sub(feats, name)
        if self.cpu_mode:
            _sub(dom, "cpu", mode=self.cpu_mode)
        devices = _sub(dom, "devices")
        for disk in self.disks:
            devices.append(disk.to_element())
        for fs in self.filesystems:
            devices.append(fs.to_element())
        if self.serial_console:
            _sub(devices, "serial", type="pty")
            _sub(devices, "console", type="pty")
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


def replace_filesystems(domain_xml: str, filesystems: list[Filesystem]) -> str:
    """The domain document with its `<filesystem>` devices replaced by `filesystems`.

    Every other element is kept as it was.
    """
    dom = ET.fromstring(domain_xml)
    devices = dom.find("devices")
    if devices is None:
        devices = _sub(dom, "devices")
    for el in devices.findall("filesystem"):
        devices.remove(el)
    for fs in filesystems:
        devices.append(fs.to_element())
    return _to_xml(dom)


def backing_path_of(volume_xml: str) -> str | None:
    """The backing file path of a volume document, or None."""
    path = ET.fromstring(volume_xml).find("backingStore/path")
    return path.text if path is not None and path.text else None
