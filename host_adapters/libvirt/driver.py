"""Instances as libvirt domains (the Hypervisor of host_adapters/hypervisor.py): their lifecycle.

Disks, seeds and base images are volumes of one storage pool; the private
NIC is on one libvirt network, whose DHCP reservations name the instances'
addresses; homes are virtiofs shares. Everything goes through the libvirt
connection, so a remote URI (qemu+ssh://, qemu+tls://) works as a local one.

LibvirtHypervisor is one object whose methods are kept by job in this
package (as Incus splits its QEMU driver into files of one receiver): this
file defines, spawns, powers and removes domains; connection.py holds the
connection and _call; statuses.py the status cache; network.py the private
network and DHCP reservations; firewall.py the guests' NIC rules; storage.py base images and
seed volumes; checks.py the host checks; test_driver.py every difference of
libvirt's test driver; xml.py the XML objects; volume_io.py volume content.
"""

import logging
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from common.errors import Conflict, HostError, InvalidInput, NotFound
from host_adapters.guests.console import ConsoleMark, ConsoleOutput, check_max_bytes
from host_adapters.images.disk_copy import open_disk_copy
from host_adapters.guests.guest import GuestSpec, Share, check_guest, check_positive, reservations_for
from host_adapters.files.host_files import HostFiles
from host_adapters.files.host_files_choice import host_files_for
from host_adapters.hypervisor import FilterRef, GiB, Hypervisor, InstanceInfo, NicDevice, Progress, check_wait
from host_adapters.libvirt import console_log
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt import test_driver
from host_adapters.libvirt.checks import ChecksPart
from host_adapters.libvirt.connection import (ConnectionPart, _code, _connection_lost, _libvirt, _msg, _over_rpc_limit,
                                              _while_pool_busy)
from host_adapters.libvirt.network import NetworkPart
from host_adapters.libvirt.statuses import StatusesPart, status_of
from host_adapters.libvirt.storage import StoragePart
from host_adapters.libvirt.volume_io import VolumeIO
from host_adapters.names import Names, check_id, check_volume_name, domain_uuid
from host_adapters.libvirt.firewall import FirewallPart, domain_rules
from host_adapters.libvirt.nic_filters import filter_for
from host_adapters.network.guest_firewall import GuestFirewall, NicRules, tap_name

log = logging.getLogger(__name__)

VIRT_TYPES = ("kvm", "qemu")

# The CPU a domain gets when [libvirt] cpu_mode is left empty, by virt_type (as in Nova,
# where the default follows virt_type): the host's own CPU under KVM; under software
# emulation there is no host CPU to pass through, so QEMU's default model (no <cpu>).
DEFAULT_CPU_MODES: dict[str, str | None] = {"kvm": "host-passthrough", "qemu": None}


def _shares_of(filesystems: Iterable[domain_xml.Filesystem]) -> tuple[Share, ...]:
    return tuple(sorted(Share(fs.target_dir, fs.source_dir) for fs in filesystems))


class LibvirtHypervisor(ConnectionPart, StoragePart, NetworkPart, FirewallPart, StatusesPart, ChecksPart, Hypervisor):
    """Instances as libvirt domains, disks and seeds as volumes of one storage pool.

    One connection per adapter (libvirt connections are thread-safe), opened
    on first use and opened again, once per call, when it was lost.

    `network` and `subnet` name the private network (made by ensure_network);
    `virt_type` and `cpu_mode` shape every domain ("kvm"/"host-passthrough" on a
    head node; "qemu" where KVM cannot boot a guest); an empty cpu_mode is
    DEFAULT_CPU_MODES[virt_type]. `volume_io` writes and
    reads volume content (libvirt streams; the test driver has none).
    `stand_in_base_images` makes spawn create a blank base disk that is
    missing (the sandbox: its test driver forgets volumes between processes).
    `status_max_age`: statuses() may answer from a snapshot that old (seconds).
    `lean_definitions` (test driver only, the sandbox): domains carry only what
    the controller reads back (shares, NICs), not disks, console or CPU.
    `host_files` reaches the host's console files (default: the channel its URI
    calls for, files/host_files_choice.py); `firewall` writes its guests' NIC rules (default: the
    one its URI calls for, network/guest_firewall_choice.py).
    """

    def __init__(
        self,
        uri: str,
        *,
        storage_pool: str,
        domain_prefix: str = "cc-",
        network: str = "cc-private",
        subnet: str = "10.213.0.0/16",
        virt_type: str = "kvm",
        cpu_mode: str | None = None,
        volume_io: VolumeIO | None = None,
        stand_in_base_images: bool = False,
        connect_timeout: float | None = None,
        status_max_age: float = 0.0,
        lean_definitions: bool = False,
        host_files: HostFiles | None = None,
        firewall: GuestFirewall | None = None,
    ):
        if virt_type not in VIRT_TYPES:
            raise InvalidInput(f"virt_type must be one of {', '.join(VIRT_TYPES)}, not {virt_type!r}")
        self._init_connection(uri, connect_timeout)
        self._init_storage(storage_pool, volume_io)
        self._init_network(network, subnet)
        self._init_statuses(status_max_age)
        self.virt_type = virt_type
        # Empty: the default of the virt_type. An explicit mode is used as given, also
        # where QEMU cannot start it: check() and probe_guest() refuse it then, and the
        # domain definition is what they checked (never silently another CPU).
        self.cpu_mode = cpu_mode or DEFAULT_CPU_MODES[virt_type]
        self._names = Names(domain_prefix)
        # The sandbox's options for libvirt's test driver (test_driver.py).
        self._stand_in = stand_in_base_images
        self._lean = lean_definitions
        self.host_files = host_files if host_files is not None else host_files_for(uri)
        self._init_firewall(uri, firewall)

    def _domain(self, conn, instance_id: str):
        lv = _libvirt()
        try:
            return conn.lookupByName(self._names.domain(instance_id))
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def _existing_domain(self, conn, instance_id: str):
        dom = self._domain(conn, instance_id)
        if dom is None:
            raise NotFound(f"instance {instance_id} has no domain on the hypervisor")
        return dom

    @staticmethod
    def _remove_domain(dom) -> None:
        lv = _libvirt()
        try:
            if dom.isActive():
                try:
                    dom.destroy()
                except lv.libvirtError as e:
                    if _code(e) != lv.VIR_ERR_OPERATION_INVALID:  # else it stopped meanwhile
                        raise
            if dom.isPersistent():
                dom.undefineFlags(lv.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | lv.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_NO_DOMAIN:  # else it went away meanwhile
                raise

    def spawn(
        self,
        instance_id: str,
        *,
        base_image: str,
        vcpu: int,
        memory_mb: int,
        disk_gb: int,
        guest: GuestSpec,
    ) -> None:
        self._make("spawn", instance_id, base_image=base_image, vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb,
                   guest=guest, disk=None, start=True)

    def receive(self, instance_id: str, *, base_image: str, vcpu: int, memory_mb: int, disk_gb: int,
                guest: GuestSpec, disk: str | None, start: bool) -> None:
        self._make("receive", instance_id, base_image=base_image, vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb,
                   guest=guest, disk=disk, start=start)

    def _make(self, verb: str, instance_id: str, *, base_image: str, vcpu: int, memory_mb: int, disk_gb: int,
              guest: GuestSpec, disk: str | None, start: bool) -> None:
        """spawn (a new overlay) and receive (the copy in the local file `disk`), all or nothing."""
        check_id(instance_id, "instance id")
        check_volume_name(base_image)
        check_positive(vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb)
        check_guest(guest)
        disk_name, seed_name = self._names.disk(instance_id), self._names.seed(instance_id)
        began = []  # past the existence checks: from here a failure removes what this makes, by name

        def op(conn):
            pool = self._pool(conn)
            base = self._volume(pool, base_image)
            if base is None and self._stand_in:
                base = test_driver.stand_in_base(pool, self._names, base_image)
            if base is None:
                raise HostError(
                    f"{verb} instance {instance_id}: base image volume {base_image}"
                    f" is missing from storage pool {self.storage_pool}; see `cloud-agent reconcile`"
                )
            if any((self._domain(conn, instance_id), self._volume(pool, disk_name), self._volume(pool, seed_name))):
                raise Conflict(f"instance {instance_id} already exists on the hypervisor")
            if base.info()[1] > disk_gb * GiB:
                raise InvalidInput(f"disk of {disk_gb} GiB is smaller than base image {base_image}")
            began.append(True)
            if disk is not None and self._io.keeps_content:
                vol = step("copy the disk", self._receive_disk, conn, pool, disk_name, disk, base.path(), disk_gb)
            else:
                overlay = domain_xml.Volume(
                    name=disk_name,
                    capacity_bytes=disk_gb * GiB,
                    backing=domain_xml.BackingStore(path=base.path(), format="qcow2"),
                )
                vol = step("create disk volume", _while_pool_busy, pool.createXML, overlay.to_xml(), 0)
            step("write seed", self._write_seed, conn, pool, instance_id, guest)
            console_folder = step("make the console folder", self._console_folder, conn, pool)
            step("reserve addresses", self._update_hosts, conn, add=reservations_for(guest))
            rules = self._guest_rules(guest) if start else ()  # else written by the start that comes later
            with self._writing(rules):
                if rules:
                    step("write the NICs' network rules", self.firewall.allow, rules)
                seed_path = self._volume(pool, seed_name).path()
                definition = self._definition(conn, instance_id, vol.path(), seed_path, vcpu=vcpu,
                                              memory_mb=memory_mb, guest=guest, console_folder=console_folder)
                dom = step("define domain", conn.defineXML, definition.to_xml())
                if start:
                    step("start domain", dom.create)
                    self._stop_unless_taps(dom, rules, f"{verb} instance {instance_id}")

        def step(what, call, *args, **kwargs):
            lv = _libvirt()
            try:
                return call(*args, **kwargs)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    raise
                raise HostError(f"{verb} instance {instance_id}: cannot {what}: {_msg(e)}") from e

        try:
            try:
                self._call(f"{verb} instance {instance_id}", op, retry=False)
            finally:
                self._changed(instance_id)
        except BaseException as err:
            if began:
                what = f"domain, disk, seed and reservations of instance {instance_id}"
                macs = [n.mac for n in guest.nics]
                self._undo(err, what, lambda conn: self._remove(
                    conn, instance_id=instance_id, volumes=[disk_name, seed_name], macs=macs,
                    rules=self._guest_rules(guest) if start else ()))
            raise

    def _receive_disk(self, conn, pool, name: str, disk: str, base_path: str, disk_gb: int):
        """The disk volume `name`, holding the copy in the local file `disk` pointed at
        base_path; checked where libvirt keeps it (format, backing file, SHA-256)."""
        source = open_disk_copy(disk, disk_gb=disk_gb, backing=base_path)
        try:
            # Upload writes over the file without truncating it: an empty file of the exact size.
            vol = _while_pool_busy(pool.createXML,
                                   domain_xml.Volume(name=name, capacity_bytes=source.size, format="raw").to_xml(), 0)
            self._io.upload_file(conn, vol, source, None)
            # libvirt probes the file again: a qcow2 overlay on the base image (the pool holds no
            # guest-written header: the consoles are in a folder no pool holds, console_log.py).
            _while_pool_busy(pool.refresh, 0)
            vol = pool.storageVolLookupByName(name)
            fmt = ET.fromstring(vol.XMLDesc(0)).find("target/format")
            if fmt is None or fmt.get("type") != "qcow2" or domain_xml.backing_path_of(vol.XMLDesc(0)) != base_path:
                raise HostError(f"the copied disk {name} is not stored as a qcow2 overlay on {base_path}")
            if self._io.digest(conn, vol) != source.sha256():
                raise HostError(f"the copied disk {name} differs from what was sent (SHA-256)")
            return vol
        finally:
            source.close()

    def shut_down(self, instance_id: str, *, wait_seconds: float) -> bool:
        check_id(instance_id, "instance id")
        check_wait(wait_seconds)
        try:
            return self._shut_down(instance_id, wait_seconds, what=f"shut down instance {instance_id}")
        finally:
            self._changed(instance_id)

    def _shut_down(self, instance_id: str, wait_seconds: float, *, what: str) -> bool:
        """The one clean shutdown of every caller (a drain's move, power-off, reboot): ask, wait
        at most wait_seconds while polling once a second, then power off hard. True when the
        guest was shut off without the hard power-off (also when it was already)."""

        def asked(conn) -> bool | None:
            """True: asked; None: already shut off; False: active but cannot hear it (paused)."""
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            if not dom.isActive():
                return None
            if dom.state()[0] not in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED) or wait_seconds <= 0:
                return False  # a paused guest runs no code to hear the button: no use waiting
            try:
                # libvirt's default for QEMU: the guest agent where one is connected, else the
                # ACPI power button (the domains carry no guest agent channel today).
                dom.shutdown()
            except lv.libvirtError as e:
                if _code(e) != lv.VIR_ERR_OPERATION_INVALID:  # else it stopped meanwhile
                    raise
            return True

        def stopped(conn) -> bool:
            dom = self._existing_domain(conn, instance_id)
            return not dom.isActive()

        began = self._call(what, asked)
        if began is None:
            return True
        if began:
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline:
                if self._call(what, stopped):
                    return True
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            log.warning("instance %s did not shut down within %s s; powered off", instance_id, wait_seconds)
        self._call(what, lambda conn: self._destroy_domain(self._existing_domain(conn, instance_id)))
        return False

    def read_disk(self, instance_id: str, dest: int, *, max_bytes: int, progress: Progress | None = None) -> bool:
        check_id(instance_id, "instance id")
        name = self._names.disk(instance_id)

        def op(conn):
            vol = self._volume(self._pool(conn), name)
            if vol is None:
                raise NotFound(f"instance {instance_id} has no disk in storage pool {self.storage_pool}")
            if not self._io.keeps_content:
                return False
            self._io.download_file(conn, vol, dest, progress, limit=max_bytes)
            return True

        return self._call(f"read the disk of instance {instance_id}", op, retry=False)

    def _remove(self, conn, *, instance_id: str | None = None, volumes: Iterable[str] = (),
                macs: Iterable[str] = (), rules: Iterable[NicRules] = ()) -> None:
        """Remove the instance's domain, the volumes, the reservations of its MACs and the
        network rules of its NICs, by name (on a possibly new connection)."""
        lv = _libvirt()
        macs, rules = set(macs), set(rules)
        dom = self._domain(conn, instance_id) if instance_id is not None else None
        if dom is not None:
            persistent = dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)
            macs |= {n.mac for n in domain_xml.interfaces_of(persistent)}
            rules |= set(domain_rules(persistent))
            self._remove_domain(dom)
        # After the domain: its guest sends nothing more.
        self._forget_rules(tuple(sorted(rules, key=lambda r: r.tap)), f"remove instance {instance_id}")
        if instance_id is not None:
            pool = self._pool(conn)
            name = console_log.file_name(self._names.prefix, instance_id)
            if not self._lean_test(conn):
                console_log.remove(self.host_files, console_log.folder_of(pool), name)
            console_log.remove_legacy_volumes(pool, name, lv)
        if macs:
            self._update_hosts(conn, remove=macs)
        self._remove_volumes(conn, volumes)

    def _cpu(self) -> tuple[str | None, str | None]:
        """(mode, model) of the <cpu> element; (None, None): none, QEMU's default model."""
        if self.cpu_mode in (None, "host-passthrough", "host-model"):
            return self.cpu_mode, None
        return "custom", self.cpu_mode

    def _lean_test(self, conn) -> bool:
        """Lean definitions on the test driver (the sandbox): no console, among others."""
        return self._lean and test_driver.is_test_driver(conn)

    def _console_folder(self, conn, pool) -> str | None:
        """The console folder of the storage pool `pool`, made when missing (console_log.py),
        with the console pool of an earlier version undefined; None where no console is kept."""
        if self._lean_test(conn):
            return None
        console_log.forget_legacy_pool(conn, self.storage_pool, _libvirt())
        folder = console_log.folder_of(pool)
        if folder is not None:
            self.host_files.ensure_folder(folder)
        return folder

    def _definition(self, conn, instance_id, disk_path, seed_path, *, vcpu, memory_mb, guest,
                    console_folder=None) -> domain_xml.Domain:
        name = self._names.domain(instance_id)
        is_test = test_driver.is_test_driver(conn)
        if self._lean and is_test:
            return test_driver.lean_domain(name, domain_uuid(instance_id, name), memory_mb=memory_mb, vcpu=vcpu,
                                           filesystems=self._filesystems(guest), interfaces=self._interfaces(guest),
                                           nic_rules=self._nic_rules(guest))
        virt_type = test_driver.DOMAIN_TYPE if is_test else self.virt_type
        cpu_mode, cpu_model = self._cpu()
        return domain_xml.Domain(
            name=name,
            uuid=domain_uuid(instance_id, name),
            memory_mb=memory_mb,
            vcpu=vcpu,
            virt_type=virt_type,
            disks=(
                domain_xml.Disk(path=disk_path),
                domain_xml.Disk(path=seed_path, format="raw", target_dev="vdb", readonly=True),
            ),
            filesystems=self._filesystems(guest),
            interfaces=self._interfaces(guest),
            nic_rules=self._nic_rules(guest),
            shared_memory=True,
            features=("acpi", "apic"),
            cpu_mode=cpu_mode,
            cpu_model=cpu_model,
            serial_console=True,
            serial_log=console_log.log_path(console_folder, self._names.prefix, instance_id),
            bios_serial=True,
        )

    def _interfaces(self, guest: GuestSpec) -> tuple[domain_xml.Interface, ...]:
        """Each NIC on its tap of this host (guest_firewall.tap_name), which its rules are keyed by."""
        return tuple(domain_xml.Interface(mac=n.mac, network=n.network, bridge=n.bridge,
                                          target_dev=tap_name(n.mac, self.tap_tag))
                     for n in guest.nics)

    @staticmethod
    def _nic_rules(guest: GuestSpec) -> tuple[tuple[str, FilterRef], ...]:
        """Each NIC's rules by MAC (nic_filters.py), kept in the domain's metadata."""
        return tuple((n.mac, filter_for(n)) for n in guest.nics)

    @staticmethod
    def _filesystems(guest: GuestSpec) -> tuple[domain_xml.Filesystem, ...]:
        return tuple(domain_xml.Filesystem(source_dir=s.source_dir, target_dir=s.tag) for s in guest.shares)

    def power_on(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            state = dom.state()[0]
            if not dom.isActive():
                self._start_filtered(dom, f"power on instance {instance_id}", lambda d: d.create())
            elif state == lv.VIR_DOMAIN_PAUSED:
                dom.resume()
            elif state == lv.VIR_DOMAIN_PMSUSPENDED:
                dom.pMWakeup(0)

        try:
            self._call(f"power on instance {instance_id}", op)
        finally:
            self._changed(instance_id)

    def power_off(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        try:
            self._call(f"power off instance {instance_id}",
                       lambda conn: self._destroy_domain(self._existing_domain(conn, instance_id)))
        finally:
            self._changed(instance_id)

    @staticmethod
    def _destroy_domain(dom) -> None:
        """Hard power-off of an active domain; nothing for an inactive one."""
        lv = _libvirt()
        try:
            if dom.isActive():
                dom.destroy()
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_OPERATION_INVALID or dom.isActive():
                raise

    def reboot(self, instance_id: str, *, wait_seconds: float) -> bool:
        check_id(instance_id, "instance id")
        check_wait(wait_seconds)
        what = f"reboot instance {instance_id}"

        def running(conn) -> None:
            lv = _libvirt()
            if self._existing_domain(conn, instance_id).state()[0] not in (lv.VIR_DOMAIN_RUNNING,
                                                                           lv.VIR_DOMAIN_BLOCKED):
                raise Conflict(f"instance {instance_id} is not running")

        def start(conn) -> None:
            # Repeated on a new connection when the old one was lost: started once only.
            dom = self._existing_domain(conn, instance_id)
            if not dom.isActive():
                self._start_filtered(dom, what, lambda d: self._start_again(d, instance_id))

        try:
            self._call(what, running)
            # Shut down, then started: a new QEMU, so the guest also gets the devices of its
            # persistent definition (set_guest). A reset would pull the plug on the guest's disk.
            clean = self._shut_down(instance_id, wait_seconds, what=what)
            self._call(what, start)
        finally:
            self._changed(instance_id)
        return clean

    @staticmethod
    def _start_again(dom, instance_id: str) -> None:
        lv = _libvirt()
        try:
            dom.create()
        except lv.libvirtError as e:
            if _connection_lost(e):
                raise
            raise HostError(
                f"reboot instance {instance_id}: shut down, but cannot start it again "
                f"(it is shut off): {_msg(e)}"
            ) from e

    def set_guest(self, instance_id: str, guest: GuestSpec) -> None:
        check_id(instance_id, "instance id")
        check_guest(guest)

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            persistent = dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)
            old_macs = {n.mac for n in domain_xml.interfaces_of(persistent)}
            old_rules, new_rules = domain_rules(persistent), self._guest_rules(guest)
            if set(old_rules) != set(new_rules):
                # Before the definition: a running guest keeps its NICs until its next start,
                # and a NIC whose rules changed has the new ones at once.
                self.firewall.replace(old_rules, new_rules)
            xml = domain_xml.replace_devices(persistent, "filesystem", list(self._filesystems(guest)))
            xml = domain_xml.replace_devices(xml, "interface", list(self._interfaces(guest)))
            xml = domain_xml.replace_nic_rules(xml, self._nic_rules(guest))
            if xml != domain_xml.normalized(persistent):
                conn.defineXML(xml)
            self._write_seed(conn, self._pool(conn), instance_id, guest)
            self._update_hosts(conn, add=reservations_for(guest), remove=old_macs)

        self._call(f"update the guest of instance {instance_id}", op)

    def destroy(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")

        try:
            self._call(
                f"destroy instance {instance_id}",
                lambda conn: self._remove(conn, instance_id=instance_id,
                                          volumes=[self._names.disk(instance_id), self._names.seed(instance_id)]),
            )
        finally:
            self._changed(instance_id)

    def list_instances(self) -> list[str]:
        def op(conn):
            lv = _libvirt()
            found = {self._names.instance_of_domain(d.name()) for d in conn.listAllDomains(0)}
            try:
                volumes = self._pool(conn).listAllVolumes(0)
            except lv.libvirtError as e:
                if not _over_rpc_limit(e):
                    raise
                # Over a remote connection a pool of more than 16,384 volumes cannot be
                # listed: the domains are still known, a disk or seed left without one is not.
                log.warning("list instances at %s: %s; disks and seeds without a domain are not listed",
                            self.uri, _msg(e))
                volumes = []
            for v in volumes:
                found |= {self._names.instance_of_disk(v.name()), self._names.instance_of_seed(v.name())}
            return sorted(i for i in found if i)

        return self._call("list instances", op)

    def describe(self, instance_id: str) -> InstanceInfo:
        check_id(instance_id, "instance id")

        def op(conn):
            lv = _libvirt()
            dom = self._domain(conn, instance_id)
            pool = self._pool(conn)
            vol = self._volume(pool, self._names.disk(instance_id))
            seed_vol = self._volume(pool, self._names.seed(instance_id))
            if dom is None and vol is None and seed_vol is None:
                raise NotFound(f"instance {instance_id} has neither a domain nor a disk on the hypervisor")
            shares: tuple[Share, ...] = ()
            live_shares: tuple[Share, ...] | None = None
            nics: tuple[NicDevice, ...] = ()
            if dom is not None:
                persistent = dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)
                shares = _shares_of(domain_xml.filesystems_of(persistent))
                kept = domain_xml.nic_rules_of(persistent)
                nics = tuple(sorted(
                    # A domain of an earlier version names its nwfilter; ours keep the rules in metadata.
                    (NicDevice(mac=n.mac, network=n.network, bridge=n.bridge, filter=n.filterref or kept.get(n.mac))
                     for n in domain_xml.interfaces_of(persistent)),
                    key=lambda n: n.mac,
                ))
                if dom.isActive():
                    live_shares = _shares_of(domain_xml.filesystems_of(dom.XMLDesc(0)))
            return InstanceInfo(
                instance_id=instance_id,
                status="error" if dom is None else status_of(*dom.state()),
                defined=dom is not None,
                shares=shares,
                live_shares=live_shares,
                disk_path=vol.path() if vol is not None else None,
                nics=nics,
                reservations=tuple(self._reservations(conn, {n.mac for n in nics})),
                seed=self._read_seed(conn, seed_vol) if seed_vol is not None else None,
            )

        return self._call(f"describe instance {instance_id}", op)

    def console(self, instance_id: str, *, max_bytes: int, since: ConsoleMark | None = None) -> ConsoleOutput:
        check_id(instance_id, "instance id")
        check_max_bytes(max_bytes)
        name = console_log.file_name(self._names.prefix, instance_id)

        def op(conn):
            folder = None if self._lean_test(conn) else console_log.folder_of(self._pool(conn))
            return console_log.read(self.host_files, folder, self._domain(conn, instance_id), name=name,
                                    max_bytes=max_bytes, since=since)

        return self._call(f"read the console of instance {instance_id}", op)
