import xml.etree.ElementTree as ET

import pytest

from common.errors import InvalidInput
from host_adapters.libvirt import xml as dx


def _tree(xml: str) -> ET.Element:
    return ET.fromstring(xml)


def _shape(el: ET.Element):
    """Tag, attributes, stripped text and children, recursively: what tests compare."""
    return (el.tag, dict(el.attrib), (el.text or "").strip(), [_shape(c) for c in el])


def _expected(xml: str):
    return _shape(ET.fromstring(xml))


def test_disk():
    disk = dx.Disk(path="/pool/cc-disk-1.qcow2")
    assert _shape(_tree(disk.to_xml())) == _expected(
        """<disk type='file' device='disk'>
             <driver name='qemu' type='qcow2'/>
             <source file='/pool/cc-disk-1.qcow2'/>
             <target dev='vda' bus='virtio'/>
           </disk>"""
    )


def test_filesystem_is_a_virtiofs_mount_tagged_with_the_target():
    fs = dx.Filesystem(source_dir="/home/alice", target_dir="alice")
    assert _shape(_tree(fs.to_xml())) == _expected(
        """<filesystem type='mount' accessmode='passthrough'>
             <driver type='virtiofs'/>
             <source dir='/home/alice'/>
             <target dir='alice'/>
           </filesystem>"""
    )


def test_read_only_raw_disk():
    disk = dx.Disk(path="/pool/cc-seed-1.iso", format="raw", target_dev="vdb", readonly=True)
    assert _shape(_tree(disk.to_xml())) == _expected(
        """<disk type='file' device='disk'>
             <driver name='qemu' type='raw'/>
             <source file='/pool/cc-seed-1.iso'/>
             <target dev='vdb' bus='virtio'/>
             <readonly/>
           </disk>"""
    )


@pytest.mark.parametrize("nic, expected", [
    (dx.Interface(mac="52:54:00:01:02:03", network="cc-private"),
     """<interface type='network'><mac address='52:54:00:01:02:03'/><source network='cc-private'/>
        <model type='virtio'/><rom enabled='no'/></interface>"""),
    (dx.Interface(mac="52:54:00:01:02:04", bridge="br-public"),
     """<interface type='bridge'><mac address='52:54:00:01:02:04'/><source bridge='br-public'/>
        <model type='virtio'/><rom enabled='no'/></interface>"""),
])
def test_interface(nic, expected):
    assert _shape(_tree(nic.to_xml())) == _expected(expected)
    assert dx.Interface.from_element(nic.to_element()) == nic


def test_network_with_reservations():
    net = dx.Network(name="cc-private", gateway="10.213.0.1", netmask="255.255.0.0",
                     hosts=(dx.DhcpHost(mac="52:54:00:01:02:03", ip="10.213.0.2", name="vm-1"),))
    assert _shape(_tree(net.to_xml())) == _expected(
        """<network>
             <name>cc-private</name>
             <forward mode='nat'/>
             <ip address='10.213.0.1' netmask='255.255.0.0'>
               <dhcp><host mac='52:54:00:01:02:03' name='vm-1' ip='10.213.0.2'/></dhcp>
             </ip>
           </network>"""
    )
    assert dx.dhcp_hosts_of(net.to_xml()) == list(net.hosts)
    assert dx.network_ip_of(net.to_xml()) == ("10.213.0.1", "255.255.0.0")


def test_reservations_are_read_piece_by_piece_from_a_large_network():
    hosts = [dx.DhcpHost(mac="52:54:00:00:%02x:%02x" % (i >> 8, i & 255), ip=f"10.213.{i >> 8}.{i & 255}",
                         name=f"vm-{i}") for i in range(3000)]
    xml = (
        "<network><name>n</name><dns><host ip='10.0.0.9'><hostname>not-dhcp</hostname></host></dns>"
        "<ip address='10.213.0.1' prefix='16'><dhcp><range start='10.213.200.1' end='10.213.200.9'/>"
        + "".join(f"<host mac='{h.mac.upper()}' name='{h.name}' ip='{h.ip}'/>" for h in hosts)
        + "</dhcp></ip><ip family='ipv6' address='fd00::1' prefix='64'><dhcp>"
        "<host id='0:1' name='v6-only' ip='fd00::9'/></dhcp></ip></network>"
    )
    assert len(xml) > 2 * 65536  # more than one piece
    assert dx.dhcp_hosts_of(xml)[:3000] == hosts  # MACs lower-cased, in document order
    assert [h.name for h in dx.dhcp_hosts_of(xml)[3000:]] == ["v6-only"]  # as before: every ip/dhcp/host
    assert dx.serves_addresses(xml)
    assert not dx.serves_addresses("<network><name>b</name><forward mode='bridge'/><bridge name='br0'/></network>")
    assert not dx.serves_addresses("<network><name>6</name><ip family='ipv6' address='fd00::1' prefix='64'/>"
                                   "</network>")


def test_reading_a_network_of_10000_reservations_holds_no_tree():
    import tracemalloc

    xml = ("<network><name>n</name><ip address='10.213.0.1' prefix='16'><dhcp>" + "".join(
        f"<host mac='52:54:00:00:{i >> 8:02x}:{i & 255:02x}' name='vm-{i}' ip='10.213.{i >> 8}.{i & 255}'/>"
        for i in range(10000)) + "</dhcp></ip></network>")
    tracemalloc.start()
    try:
        assert dx.serves_addresses(xml) and sum(1 for _ in dx.iter_dhcp_hosts(xml)) == 10000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The whole tree of this 640 KB document is about 6 MB; read piece by piece, under 1 MB.
    assert peak < 2_000_000


def test_custom_cpu_model():
    dom = dx.Domain(name="d", uuid="u", memory_mb=1, vcpu=1, cpu_mode="custom", cpu_model="qemu64")
    cpu = _tree(dom.to_xml()).find("cpu")
    assert (cpu.get("mode"), cpu.findtext("model")) == ("custom", "qemu64")


def test_filesystem_round_trips_through_its_element():
    fs = dx.Filesystem(source_dir="/home/bob", target_dir="bob")
    assert dx.Filesystem.from_element(fs.to_element()) == fs


def test_minimal_domain():
    dom = dx.Domain(name="cc-1", uuid="6c277a3b-68b0-42f6-8958-29890748ab96", memory_mb=128, vcpu=2)
    assert _shape(_tree(dom.to_xml())) == _expected(
        """<domain type='kvm'>
             <name>cc-1</name>
             <uuid>6c277a3b-68b0-42f6-8958-29890748ab96</uuid>
             <memory unit='MiB'>128</memory>
             <vcpu>2</vcpu>
             <os><type>hvm</type><boot dev='hd'/></os>
             <devices>
               <controller type='usb' model='none'/>
               <memballoon model='none'/>
             </devices>
           </domain>"""
    )


def test_full_domain_has_disks_one_share_per_user_a_nic_and_shared_memory():
    dom = dx.Domain(
        name="cc-1",
        uuid="6c277a3b-68b0-42f6-8958-29890748ab96",
        memory_mb=512,
        vcpu=1,
        virt_type="test",
        disks=(dx.Disk(path="/pool/d.qcow2"),),
        filesystems=(
            dx.Filesystem(source_dir="/home/alice", target_dir="alice"),
            dx.Filesystem(source_dir="/home/bob", target_dir="bob"),
        ),
        interfaces=(dx.Interface(mac="52:54:00:00:00:01", network="cc-private"),),
        shared_memory=True,
        features=("acpi", "apic"),
        cpu_mode="host-passthrough",
        serial_console=True,
    )
    assert _shape(_tree(dom.to_xml())) == _expected(
        """<domain type='test'>
             <name>cc-1</name>
             <uuid>6c277a3b-68b0-42f6-8958-29890748ab96</uuid>
             <memory unit='MiB'>512</memory>
             <vcpu>1</vcpu>
             <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
             <os><type>hvm</type><boot dev='hd'/></os>
             <features><acpi/><apic/></features>
             <cpu mode='host-passthrough'/>
             <devices>
               <disk type='file' device='disk'>
                 <driver name='qemu' type='qcow2'/>
                 <source file='/pool/d.qcow2'/>
                 <target dev='vda' bus='virtio'/>
               </disk>
               <filesystem type='mount' accessmode='passthrough'>
                 <driver type='virtiofs'/><source dir='/home/alice'/><target dir='alice'/>
               </filesystem>
               <filesystem type='mount' accessmode='passthrough'>
                 <driver type='virtiofs'/><source dir='/home/bob'/><target dir='bob'/>
               </filesystem>
               <interface type='network'>
                 <mac address='52:54:00:00:00:01'/><source network='cc-private'/><model type='virtio'/>
                 <rom enabled='no'/>
               </interface>
               <serial type='pty'/>
               <console type='pty'/>
               <controller type='usb' model='none'/>
               <memballoon model='none'/>
             </devices>
           </domain>"""
    )


def test_values_are_escaped_not_injected():
    dom = dx.Domain(
        name="cc-1",
        uuid="u",
        memory_mb=1,
        vcpu=1,
        filesystems=(dx.Filesystem(source_dir="/home/a'/><x", target_dir="t"),),
    )
    source = _tree(dom.to_xml()).find("devices/filesystem/source")
    assert source.get("dir") == "/home/a'/><x"
    assert _tree(dom.to_xml()).find(".//x") is None


def test_blank_volume():
    vol = dx.Volume(name="cc-base-img.qcow2", capacity_bytes=1024**3)
    assert _shape(_tree(vol.to_xml())) == _expected(
        """<volume>
             <name>cc-base-img.qcow2</name>
             <capacity unit='bytes'>1073741824</capacity>
             <allocation unit='bytes'>0</allocation>
             <target><format type='qcow2'/></target>
           </volume>"""
    )


def test_overlay_volume_has_a_backing_store():
    vol = dx.Volume(
        name="cc-disk-1.qcow2",
        capacity_bytes=2 * 1024**3,
        backing=dx.BackingStore(path="/pool/cc-base-img.qcow2"),
    )
    assert _shape(_tree(vol.to_xml())) == _expected(
        """<volume>
             <name>cc-disk-1.qcow2</name>
             <capacity unit='bytes'>2147483648</capacity>
             <allocation unit='bytes'>0</allocation>
             <target><format type='qcow2'/></target>
             <backingStore>
               <path>/pool/cc-base-img.qcow2</path>
               <format type='qcow2'/>
             </backingStore>
           </volume>"""
    )
    assert dx.backing_path_of(vol.to_xml()) == "/pool/cc-base-img.qcow2"
    assert dx.backing_path_of(dx.Volume(name="v", capacity_bytes=1).to_xml()) is None


LIBVIRT_DOMAIN = """<domain type='kvm' id='3'>
  <name>cc-1</name>
  <metadata><app:x xmlns:app='http://example.org/app'>1</app:x></metadata>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'><source file='/pool/d.qcow2'/><target dev='vda' bus='virtio'/></disk>
    <filesystem type='mount' accessmode='mapped'>
      <driver type='path' wrpolicy='immediate'/>
      <source dir='/home/alice'/><target dir='alice'/>
      <alias name='fs0'/>
    </filesystem>
    <serial type='pty'/>
  </devices>
</domain>"""


def test_filesystems_of_reads_libvirt_output():
    assert dx.filesystems_of(LIBVIRT_DOMAIN) == [
        dx.Filesystem(source_dir="/home/alice", target_dir="alice", driver="path", accessmode="mapped")
    ]
    assert dx.filesystems_of("<domain><name>x</name></domain>") == []


def test_replace_filesystems_keeps_everything_else():
    wanted = [dx.Filesystem(source_dir="/home/bob", target_dir="bob")]
    out = _tree(dx.replace_devices(LIBVIRT_DOMAIN, "filesystem", wanted))
    assert dx.filesystems_of(ET.tostring(out, encoding="unicode")) == wanted
    before = _tree(LIBVIRT_DOMAIN)
    assert [_shape(e) for e in out.find("devices") if e.tag != "filesystem"] == [
        _shape(e) for e in before.find("devices") if e.tag != "filesystem"
    ]
    assert out.find("metadata/{http://example.org/app}x").text == "1"


def test_replace_filesystems_with_none_removes_all():
    out = dx.replace_devices(LIBVIRT_DOMAIN, "filesystem", [])
    assert dx.filesystems_of(out) == []


# -- network filters (issue 16, finding 8) -----------------------------------------------------
def test_an_interface_with_a_filter_and_its_parameters_round_trips():
    nic = dx.Interface(mac="52:54:00:01:02:03", network="cc-private",
                       filterref=dx.FilterRef("clean-traffic", (("IP", "10.213.0.2"),)))
    assert _shape(_tree(nic.to_xml())) == _expected(
        """<interface type='network'><mac address='52:54:00:01:02:03'/><source network='cc-private'/>
           <model type='virtio'/><rom enabled='no'/>
           <filterref filter='clean-traffic'><parameter name='IP' value='10.213.0.2'/></filterref></interface>""")
    assert dx.Interface.from_element(nic.to_element()) == nic
    assert dx.interfaces_of(dx.Domain(name="d", uuid="u", memory_mb=1, vcpu=1, interfaces=(nic,)).to_xml()) == [nic]


def test_every_nic_sends_only_from_its_own_mac_and_address():
    from host_adapters.guests.guest import Nic
    from host_adapters.libvirt.nic_filters import filter_for

    private = Nic(mac="52:54:00:00:00:02", address="10.213.0.7", prefix=16, gateway="10.213.0.1", network="cc")
    public = Nic(mac="52:54:00:00:00:03", address="198.51.100.10", prefix=24, gateway="198.51.100.1", bridge="br0")
    assert filter_for(private) == dx.FilterRef("cloud-controller-clean", (("IP", "10.213.0.7"),))
    assert filter_for(public) == dx.FilterRef("cloud-controller-clean", (("IP", "198.51.100.10"),))
    isolated = Nic(mac="52:54:00:00:00:02", address="10.213.3.7", prefix=16, gateway="10.213.0.1", network="cc",
                   isolated=True)
    assert filter_for(isolated) == dx.FilterRef("cloud-controller-isolated", (
        ("GATEWAY", "10.213.0.1"), ("IP", "10.213.3.7"), ("SUBNET", "10.213.0.0"), ("SUBNET_PREFIX", "16")))


def test_a_nic_names_its_tap_and_the_domain_keeps_each_nics_rules_in_its_metadata():
    """Issue 28: starts and restores read a NIC's tap and rules from the domain itself."""
    clean = dx.FilterRef("cloud-controller-clean", (("IP", "10.213.0.2"),))
    nic = dx.Interface(mac="52:54:00:01:02:03", network="cc-private", target_dev="cc-0a1b2-010203")
    assert _shape(_tree(nic.to_xml())) == _expected(
        """<interface type='network'><mac address='52:54:00:01:02:03'/><source network='cc-private'/>
           <target dev='cc-0a1b2-010203'/><model type='virtio'/><rom enabled='no'/></interface>""")
    assert dx.Interface.from_element(nic.to_element()) == nic
    domain = dx.Domain(name="d", uuid="u", memory_mb=1, vcpu=1, interfaces=(nic,),
                       nic_rules=(("52:54:00:01:02:03", clean),)).to_xml()
    assert dx.nic_rules_of(domain) == {"52:54:00:01:02:03": clean}
    assert "urn:cloud-controller:nic-rules:1" in domain
    isolated = dx.FilterRef("cloud-controller-isolated", (("GATEWAY", "10.213.0.1"), ("IP", "10.213.0.2"),
                                                          ("SUBNET", "10.213.0.0"), ("SUBNET_PREFIX", "16")))
    replaced = dx.replace_nic_rules(domain, (("52:54:00:01:02:03", isolated),))
    assert dx.nic_rules_of(replaced) == {"52:54:00:01:02:03": isolated}
    assert dx.normalized(replaced) == replaced  # as set_guest compares them
    assert dx.nic_rules_of(dx.replace_nic_rules(replaced, ())) == {}
    # A domain of an earlier version: no metadata.
    assert dx.nic_rules_of(dx.Domain(name="d", uuid="u", memory_mb=1, vcpu=1).to_xml()) == {}


@pytest.mark.parametrize("bad", [{"bridge": "br0", "network": None}, {"gateway": None}])
def test_only_a_private_nic_with_a_gateway_can_be_isolated(bad):
    from host_adapters.guests.guest import Nic

    values = dict(mac="52:54:00:00:00:02", address="10.213.0.7", prefix=16, gateway="10.213.0.1", network="cc",
                  isolated=True) | bad
    with pytest.raises(InvalidInput, match="isolated"):
        Nic(**values)


def test_a_nic_an_earlier_version_gave_clean_traffic_is_as_wanted_and_no_other_difference_is():
    """Domains made before the project's filter keep libvirt's clean-traffic (same guarantees):
    reconcile does not call them drift. A NIC without a filter, with other parameters, or with
    the isolation filter where none is wanted still is."""
    from host_adapters.hypervisor import NicDevice
    from host_adapters.libvirt.nic_filters import same_nics

    wanted = (NicDevice(mac="52:54:00:00:00:02", network="cc",
                        filter=dx.FilterRef("cloud-controller-clean", (("IP", "10.213.0.7"),))),)
    earlier = (NicDevice(mac="52:54:00:00:00:02", network="cc",
                         filter=dx.FilterRef("clean-traffic", (("IP", "10.213.0.7"),))),)
    assert same_nics(wanted, wanted) and same_nics(earlier, wanted)
    assert not same_nics((NicDevice(mac="52:54:00:00:00:02", network="cc"),), wanted)
    assert not same_nics((NicDevice(mac="52:54:00:00:00:02", network="cc",
                                    filter=dx.FilterRef("clean-traffic", (("IP", "10.213.0.8"),))),), wanted)
    assert not same_nics((NicDevice(mac="52:54:00:00:00:02", network="cc",
                                    filter=dx.FilterRef("cloud-controller-isolated", (("IP", "10.213.0.7"),))),),
                         wanted)
    assert not same_nics((), wanted)
