"""Whether a host can run this deployment's guests: check() (every health probe),
probe_guest() (a guest started and stopped: `cloud-agent check`), and what the host has
(host_capacity).
"""

import ipaddress
import uuid
import xml.etree.ElementTree as ET

from common.errors import HostUnavailable
from host_adapters.hypervisor import HostCapacity, HostIdentity
from host_adapters.libvirt import console_log
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt import test_driver
from host_adapters.libvirt.connection import _code, _connection_lost, _libvirt, _msg


class ChecksPart:
    """The host checks of LibvirtHypervisor (driver.py), against its `virt_type`, `cpu_mode`,
    storage pool and private network."""

    def check(self) -> None:
        def op(conn):
            self._pool(conn)
            # An earlier version kept the consoles in a pool, which libvirt probes: forgotten.
            console_log.forget_legacy_pool(conn, self.storage_pool, _libvirt())
            net = self._network(conn)
            if not net.isActive():
                raise HostUnavailable(f"libvirt network {self.network!r} is not active: run `cloud-agent init`")
            if not test_driver.is_test_driver(conn):
                self._check_subnet(net)
                self._check_virt_type(conn)
            # The guests' NIC rules, after each new connection and every minute (firewall.py).
            self._restore_rules(conn)

        self._call("check libvirt", op)

    def host_capacity(self) -> HostCapacity:
        def op(conn):
            # getInfo(): [model, memory MB, CPUs, MHz, NUMA nodes, sockets, cores, threads]
            info = conn.getInfo()
            return HostCapacity(vcpus=int(info[2]), memory_mb=int(info[1]))

        return self._call("read host capacity", op)

    def identity(self) -> HostIdentity:
        def op(conn):
            host = (ET.fromstring(conn.getCapabilities()).findtext("host/uuid") or "").strip().lower()
            return HostIdentity(host_uuid=host or None, pool_uuid=self._pool(conn).UUIDString().lower())

        return self._call("read host identity", op)

    def probe_guest(self) -> None:
        lv = _libvirt()
        cpu_mode, cpu_model = self._cpu()

        def op(conn):
            if test_driver.is_test_driver(conn):
                return
            name = f"{self._names.prefix}probe-{uuid.uuid4().hex[:8]}"
            probe = domain_xml.Domain(name=name, uuid=str(uuid.uuid4()), memory_mb=32, vcpu=1,
                                      virt_type=self.virt_type, cpu_mode=cpu_mode, cpu_model=cpu_model)
            try:
                dom = conn.createXML(probe.to_xml(), 0)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    raise
                hints = []
                if self.cpu_mode == "host-passthrough":
                    hints.append("[libvirt] cpu_mode = host-model (or a named model such as qemu64)")
                if self.virt_type == "kvm":
                    hints.append("[libvirt] virt_type = qemu (software emulation)")
                raise HostUnavailable(
                    f"QEMU cannot start a guest with virt_type {self.virt_type} and cpu_mode "
                    f"{self.cpu_mode or 'empty (QEMU default CPU)'}: "
                    f"{_msg(e)}; set " + " or ".join(hints or ["another [libvirt] cpu_mode"])
                ) from e
            try:
                dom.destroy()
            except lv.libvirtError:
                pass

        self._call("start a probe guest", op, retry=False)

    def _check_subnet(self, net) -> None:
        """The network's own address is the configured subnet's gateway: guests' static
        addresses and routes come from the subnet."""
        xml = net.XMLDesc(0)
        found = domain_xml.network_ip_of(xml)
        gateway = str(self.subnet.network_address + 1)
        forward = ET.fromstring(xml).find("forward")
        if found is None and forward is not None and forward.get("mode") == "bridge":
            return  # a bridged network (many hosts): the subnet's gateway lives elsewhere on that LAN
        if found is None:
            raise HostUnavailable(f"libvirt network {self.network!r} has no IPv4 address; expected {gateway}")
        address, mask = found
        try:
            actual = ipaddress.IPv4Interface(f"{address}/{mask}")
        except ValueError:
            actual = None
        if actual is None or actual.network != self.subnet or address != gateway:
            raise HostUnavailable(
                f"libvirt network {self.network!r} is {address}/{mask}, but [network] subnet is {self.subnet} "
                f"(gateway {gateway}); make them agree"
            )

    def _check_virt_type(self, conn) -> None:
        """The configured virt_type and cpu_mode are what this host's QEMU offers."""
        lv = _libvirt()
        hint = "set [libvirt] virt_type = qemu (software emulation) where KVM cannot run guests"
        try:
            caps = ET.fromstring(conn.getDomainCapabilities(None, None, None, self.virt_type, 0))
        except lv.libvirtError as e:
            raise HostUnavailable(f"virt_type {self.virt_type} is not available on {self.uri}: {_msg(e)}; {hint}") from e
        if self.cpu_mode in ("host-passthrough", "host-model"):
            mode = caps.find(f"cpu/mode[@name='{self.cpu_mode}']")
            if mode is None or mode.get("supported") != "yes":
                raise HostUnavailable(
                    f"cpu_mode {self.cpu_mode} is not supported with virt_type {self.virt_type} on {self.uri}; "
                    + ("leave [libvirt] cpu_mode empty (QEMU's default CPU) or set a named model (e.g. qemu64)"
                       if self.virt_type == "qemu" else
                       "set [libvirt] cpu_mode to host-model or a named model (e.g. qemu64)")
                )
