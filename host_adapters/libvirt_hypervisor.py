"""Instances as libvirt domains (the Hypervisor of host_adapters/hypervisor.py).

Disks, seeds and base images are volumes of one storage pool; the private
NIC is on one libvirt network, whose DHCP reservations name the instances'
addresses; homes are virtiofs shares. Everything goes through the libvirt
connection, so a remote URI (qemu+ssh://, qemu+tls://) works as a local one.
"""

import contextlib
import functools
import ipaddress
import logging
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from common.errors import CleanupFailed, Conflict, ControllerError, HostError, HostUnavailable, HostUnreachable, InvalidInput, NotFound
from host_adapters import console_log, domain_xml
from host_adapters.console import ConsoleMark, ConsoleOutput, check_max_bytes
from host_adapters import seed as seeds
from host_adapters.nic_filters import CLEAN_TRAFFIC, PROJECT_FILTERS, filter_for
from host_adapters.guest import GuestSpec, Reservation, Share
from host_adapters.hypervisor import (
    GiB,
    HostCapacity,
    Hypervisor,
    InstanceInfo,
    Names,
    NicDevice,
    Progress,
    check_guest,
    check_id,
    check_positive,
    check_qcow2_header,
    check_volume_name,
    domain_uuid,
    nic_devices_for,
    open_image_source,
    reservations_for,
)
from host_adapters.volume_io import StreamVolumeIO, VolumeIO

log = logging.getLogger(__name__)

# A seed is padded to this fixed size, so a running guest reads a rewritten seed
# after a reset without its disk changing size.
SEED_BYTES = 4 * 1024 * 1024

VIRT_TYPES = ("kvm", "qemu")

# The CPU a domain gets when [libvirt] cpu_mode is left empty, by virt_type (as in Nova,
# where the default follows virt_type): the host's own CPU under KVM; under software
# emulation there is no host CPU to pass through, so QEMU's default model (no <cpu>).
DEFAULT_CPU_MODES: dict[str, str | None] = {"kvm": "host-passthrough", "qemu": None}


# --- libvirt -----------------------------------------------------------------


@functools.cache
def _libvirt():
    import libvirt

    # libvirt prints every error on stderr unless a handler takes it; ours are raised.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


_event_loop_lock = threading.Lock()
_event_loop_started = False

# A peer that misses this many keepalive answers, this many seconds apart, is dead:
# calls waiting on it fail (HostUnavailable) instead of holding a server thread.
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def _start_event_loop() -> None:
    """libvirt's keepalive needs an event loop registered before connections open."""
    global _event_loop_started
    with _event_loop_lock:
        if _event_loop_started:
            return
        lv = _libvirt()
        lv.virEventRegisterDefaultImpl()

        def run():
            while True:
                lv.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _event_loop_started = True


def _code(err) -> int:
    return err.get_error_code()


def _msg(err) -> str:
    return err.get_error_message() or str(err)


def _over_rpc_limit(err) -> bool:
    """The remote protocol refused a listing longer than it carries (16,384 volumes of one
    pool): an answer from the peer, not a lost connection."""
    return "for limit" in (err.get_error_message() or "")


def _connection_lost(err) -> bool:
    lv = _libvirt()
    code, domain = err.get_error_code(), err.get_error_domain()
    if code == lv.VIR_ERR_INVALID_CONN:
        return True
    if _over_rpc_limit(err):
        return False
    return code in (lv.VIR_ERR_SYSTEM_ERROR, lv.VIR_ERR_INTERNAL_ERROR, lv.VIR_ERR_RPC) and domain in (
        lv.VIR_FROM_REMOTE,
        lv.VIR_FROM_RPC,
    )


def status_of(state: int, reason: int) -> str:
    """Map a libvirt (state, reason) pair to one of STATUSES."""
    lv = _libvirt()
    if state == lv.VIR_DOMAIN_NOSTATE:
        return "building"
    if state in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED):
        return "running"
    if state == lv.VIR_DOMAIN_PAUSED:
        # QEMU domains are paused while they start, before the vCPUs run.
        return "building" if reason == lv.VIR_DOMAIN_PAUSED_STARTING_UP else "paused"
    if state == lv.VIR_DOMAIN_PMSUSPENDED:
        return "paused"
    if state == lv.VIR_DOMAIN_SHUTDOWN:
        return "shutoff"
    if state == lv.VIR_DOMAIN_SHUTOFF:
        if reason == lv.VIR_DOMAIN_SHUTOFF_CRASHED:
            return "crashed"
        if reason == lv.VIR_DOMAIN_SHUTOFF_FAILED:
            return "error"
        return "shutoff"
    if state == lv.VIR_DOMAIN_CRASHED:
        return "crashed"
    return "error"


def status_of_event(event: int, detail: int, current: str | None) -> str | None:
    """A domain's status after a lifecycle event (None: it has no domain any more)."""
    lv = _libvirt()
    if event == lv.VIR_DOMAIN_EVENT_UNDEFINED:
        return None
    if event == lv.VIR_DOMAIN_EVENT_DEFINED:
        return current or "shutoff"  # a new definition of a running domain keeps it running
    if event in (lv.VIR_DOMAIN_EVENT_STARTED, lv.VIR_DOMAIN_EVENT_RESUMED):
        return "running"
    if event in (lv.VIR_DOMAIN_EVENT_SUSPENDED, lv.VIR_DOMAIN_EVENT_PMSUSPENDED):
        return "paused"
    if event == lv.VIR_DOMAIN_EVENT_CRASHED:
        return "crashed"
    if event == lv.VIR_DOMAIN_EVENT_STOPPED:
        if detail == lv.VIR_DOMAIN_EVENT_STOPPED_CRASHED:
            return "crashed"
        if detail == lv.VIR_DOMAIN_EVENT_STOPPED_FAILED:
            return "error"
        return "shutoff"
    return current  # SHUTDOWN (a guest shutting down stops next) and the rest change nothing


class _LiveStatuses:
    """The statuses of one connection's instances, kept current by its lifecycle events.

    Events that come before the first full read are held and applied after it, in
    order: each is at least as new as what the read saw, so the end state is right.
    """

    # Changes remembered for status_changes(); a caller further behind takes the whole map.
    JOURNAL_MAX = 4096

    def __init__(self, conn, names: Names):
        self.conn, self._names = conn, names
        self._statuses: dict[str, str] | None = None
        self._pending: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()
        # The ids changed, in order: change number n is _journal[n - _base].
        self._journal: list[str] = []
        self._base = 0
        # Whether the connection's close callback is ours, and whether it was called.
        self.watched = self.closed = False

    def start(self, statuses: dict[str, str]) -> None:
        with self._lock:
            self._statuses = statuses
            for instance_id, event, detail in self._pending:
                self._apply(instance_id, status_of_event(event, detail, statuses.get(instance_id)))
            self._pending = []

    def event(self, domain_name: str, event: int, detail: int) -> None:
        instance_id = self._names.instance_of_domain(domain_name)
        if not instance_id:
            return
        with self._lock:
            if self._statuses is None:
                self._pending.append((instance_id, event, detail))
            else:
                self._apply(instance_id, status_of_event(event, detail, self._statuses.get(instance_id)))

    def set(self, instance_id: str, status: str | None) -> None:
        with self._lock:
            if self._statuses is not None:
                self._apply(instance_id, status)

    def _apply(self, instance_id: str, status: str | None) -> None:
        if status is None:
            self._statuses.pop(instance_id, None)
        else:
            self._statuses[instance_id] = status
        self._journal.append(instance_id)
        if len(self._journal) > self.JOURNAL_MAX:
            drop = len(self._journal) // 2
            del self._journal[:drop]
            self._base += drop

    def changes(self, since: object | None) -> tuple[object, dict[str, str | None], bool]:
        """status_changes() of these statuses: a mark is (this object, change number)."""
        with self._lock:
            mark = (self, self._base + len(self._journal))
            if not (isinstance(since, tuple) and since[0] is self and since[1] >= self._base):
                return mark, dict(self._statuses), True
            changed = set(self._journal[since[1] - self._base:])
            return mark, {i: self._statuses.get(i) for i in changed}, False

    def get(self, instance_id: str) -> str:
        return self._statuses.get(instance_id, "error")

    def copy(self) -> dict[str, str]:
        with self._lock:
            return dict(self._statuses)


def _on_lifecycle(_conn, dom, event, detail, live: _LiveStatuses) -> None:
    # Runs in the event loop thread: no libvirt call here (the name is held by the object).
    live.event(dom.name(), event, detail)


def _on_close(_conn, _reason, live: _LiveStatuses) -> None:
    # The connection is gone (keepalive failed, the daemon went away): its statuses no
    # longer follow the host; the next call opens a new connection and reads them again.
    live.closed = True


def _shares_of(filesystems: Iterable[domain_xml.Filesystem]) -> tuple[Share, ...]:
    return tuple(sorted(Share(fs.target_dir, fs.source_dir) for fs in filesystems))


def _device_key(xml: str):
    filesystems = sorted((fs.target_dir, fs.source_dir, fs.driver) for fs in domain_xml.filesystems_of(xml))
    nics = sorted((n.mac, n.network, n.bridge, n.filterref) for n in domain_xml.interfaces_of(xml))
    return filesystems, nics


def _definition_pending(dom) -> bool:
    """Whether the running guest's devices differ from its persistent definition's (set_guest changes only those)."""
    lv = _libvirt()
    return _device_key(dom.XMLDesc(0)) != _device_key(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))


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


class LibvirtHypervisor(Hypervisor):
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
    ):
        if virt_type not in VIRT_TYPES:
            raise InvalidInput(f"virt_type must be one of {', '.join(VIRT_TYPES)}, not {virt_type!r}")
        self.uri = uri
        self.storage_pool = storage_pool
        self.network = network
        self.subnet, self._netmask = _netmask(subnet)
        self.virt_type = virt_type
        # Empty: the default of the virt_type. An explicit mode is used as given, also
        # where QEMU cannot start it: check() and probe_guest() refuse it then, and the
        # domain definition is what they checked (never silently another CPU).
        self.cpu_mode = cpu_mode or DEFAULT_CPU_MODES[virt_type]
        self._names = Names(domain_prefix)
        self._io = volume_io or StreamVolumeIO()
        self._stand_in = stand_in_base_images
        self._conn = None
        self._lock = threading.Lock()
        # A remote host that does not answer must not hold a server thread for the
        # kernel's TCP connect timeout (minutes): the open is given this long.
        self.connect_timeout = connect_timeout
        # Reservations postponed by batch(), made together when it ends; None outside one.
        self._queued_hosts: dict[str, Reservation] | None = None  # by MAC
        # statuses() answers from a snapshot at most status_max_age seconds old (0: none).
        self._status_max_age = status_max_age
        self._lean = lean_definitions
        self._snapshot: tuple[float, dict[str, str]] | None = None  # shared: read only
        # Statuses kept current by libvirt's lifecycle events, for the connection that
        # registered them; None until the first statuses() (or on a driver without events).
        self._live: _LiveStatuses | None = None
        self._no_events = False
        self._snapshot_lock = threading.Lock()
        self._generation = 0
        self._batch_lock = threading.Lock()

    # connection

    def _open(self):
        lv = _libvirt()
        if not self.connect_timeout:
            return lv.open(self.uri)
        outcome: dict = {}
        done = threading.Event()
        guard = threading.Lock()

        def attempt():
            try:
                conn = lv.open(self.uri)
            except lv.libvirtError as e:
                outcome["error"] = e
                conn = None
            with guard:
                if outcome.get("abandoned"):
                    if conn is not None:
                        conn.close()  # answered too late: nobody uses it
                    return
                outcome["conn"] = conn
                done.set()

        threading.Thread(target=attempt, name=f"libvirt-open {self.uri}", daemon=True).start()
        done.wait(self.connect_timeout)
        with guard:
            if not done.is_set():
                outcome["abandoned"] = True
                raise HostUnreachable(f"cannot connect to libvirt at {self.uri}: "
                                      f"no answer within {self.connect_timeout:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["conn"]

    def _connection(self):
        lv = _libvirt()
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except lv.libvirtError:
                    pass
                self._conn = None
            _start_event_loop()
            try:
                self._conn = self._open()
            except lv.libvirtError as e:
                raise HostUnreachable(f"cannot connect to libvirt at {self.uri}: {_msg(e)}") from e
            try:
                self._conn.setKeepAlive(KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
            except lv.libvirtError:
                pass  # local drivers without a daemon (the test driver) have no keepalive
            return self._conn

    def _forget(self, conn) -> None:
        # Dropped, not closed: another thread may still be using it; the
        # binding closes it when the last reference goes.
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def _call(self, what: str, op, *, retry: bool = True):
        """op(conn), with libvirt errors turned into HostError/HostUnavailable.

        A lost connection is opened again and op repeated once when `retry`
        (for operations that are safe to repeat).
        """
        lv = _libvirt()
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return op(conn)
            except lv.libvirtError as e:
                if not _connection_lost(e):
                    raise HostError(f"{what}: {_msg(e)}") from e
                self._forget(conn)
                if not retry or attempt == 2:
                    raise HostUnreachable(f"{what}: lost the connection to libvirt at {self.uri}: {_msg(e)}") from e
                log.warning("connection to libvirt at %s lost (%s); reconnecting", self.uri, _msg(e))

    def _is_test_driver(self, conn) -> bool:
        return conn.getType().lower() == "test"

    # lookups (inside op)

    def _pool(self, conn):
        lv = _libvirt()
        try:
            pool = conn.storagePoolLookupByName(self.storage_pool)
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_STORAGE_POOL:
                raise HostUnavailable(f"libvirt storage pool {self.storage_pool!r} not found at {self.uri}") from e
            raise
        if not pool.isActive():
            raise HostUnavailable(f"libvirt storage pool {self.storage_pool!r} is not active")
        return pool

    def _network(self, conn, name: str | None = None, *, required: bool = True):
        lv = _libvirt()
        name = name or self.network
        try:
            return conn.networkLookupByName(name)
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_NO_NETWORK:
                raise
            if required:
                raise HostUnavailable(
                    f"libvirt network {name!r} not found at {self.uri}: run `cloud-agent init`"
                ) from e
            return None

    @staticmethod
    def _volume(pool, name: str):
        lv = _libvirt()
        try:
            return pool.storageVolLookupByName(name)
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_STORAGE_VOL:
                return None
            raise

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
    def _delete_volume(vol) -> None:
        lv = _libvirt()
        try:
            vol.delete(0)
        except lv.libvirtError as e:
            if _code(e) != lv.VIR_ERR_NO_STORAGE_VOL:
                raise

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

    # network and DHCP reservations

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
            if not net.autostart():
                net.setAutostart(1)
            # The filters of isolated NICs, so that `check` finds them at once (spawn defines
            # them too, on any host that lacks them).
            return self._ensure_filters(conn) or changed

        return self._call(f"create network {self.network}", op)

    def _reservations(self, conn, macs: set[str]) -> list[Reservation]:
        lv = _libvirt()
        net = self._network(conn, required=False)
        if net is None or not macs:
            return []
        hosts = domain_xml.iter_dhcp_hosts(net.XMLDesc(0))
        return sorted(
            (Reservation(mac=h.mac, address=h.ip, hostname=h.name) for h in hosts if h.mac in macs),
            key=lambda r: r.mac,
        )

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
        """Add many reservations. The test driver (nothing runs on its network) gets a new
        definition with all of them and a restart of the network; a real network is never
        restarted under running guests, so there they are added one by one."""
        lv = _libvirt()
        if not self._is_test_driver(conn):
            self._update_hosts(conn, add=add)
            return
        net = self._network(conn)
        root = ET.fromstring(net.XMLDesc(0))
        dhcp = root.find("ip/dhcp")
        if dhcp is None:
            ip = root.find("ip")
            if ip is None:
                raise HostError(f"network {self.network} has no <ip> for DHCP reservations")
            dhcp = ET.SubElement(ip, "dhcp")
        wanted = {r.mac: r for r in add}
        ips, names = {r.address for r in add}, {r.hostname for r in add if r.hostname}
        for host in dhcp.findall("host"):
            # As in _update_hosts: a stale entry sharing a MAC, an address or a name gives way.
            if host.get("mac", "").lower() in wanted or host.get("ip") in ips or host.get("name") in names:
                dhcp.remove(host)
        for r in wanted.values():
            dhcp.append(domain_xml.DhcpHost(mac=r.mac, ip=r.address, name=r.hostname).to_element())
        # Stopped first: the test driver keeps running on the old definition across a restart.
        was_active = net.isActive()
        if was_active:
            net.destroy()
        net = conn.networkDefineXML(ET.tostring(root, encoding="unicode"))
        if was_active:
            net.create()

    def _update_hosts(self, conn, *, add: Iterable[Reservation] = (), remove: Iterable[str] = ()) -> None:
        """Drop the reservations of the MACs in `remove`, then add `add` (replacing any of the same MAC).

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
        xml = net.XMLDesc(0)
        if not domain_xml.serves_addresses(xml):
            return  # a bridged network: libvirt hands out no addresses there, the seed's static config does
        flags = lv.VIR_NETWORK_UPDATE_AFFECT_CONFIG
        if net.isActive():
            flags |= lv.VIR_NETWORK_UPDATE_AFFECT_LIVE
        wanted = {domain_xml.DhcpHost(mac=r.mac, ip=r.address, name=r.hostname) for r in add}

        def clashes(host) -> bool:
            # libvirt refuses an entry sharing a MAC, an address or a name with another;
            # the controller owns these, so a stale one gives way.
            return any(host.ip == w.ip or (host.name and host.name == w.name) for w in wanted)

        # Only the entries this change touches are kept (a network may hold 10,000).
        existing = [h for h in domain_xml.iter_dhcp_hosts(xml) if h in wanted or h.mac in remove or clashes(h)]
        del xml
        for host in existing:
            if host not in wanted and (host.mac in remove or clashes(host)):
                net.update(lv.VIR_NETWORK_UPDATE_COMMAND_DELETE, lv.VIR_NETWORK_SECTION_IP_DHCP_HOST, -1,
                           host.to_xml(), flags)
        for host in wanted - set(existing):
            net.update(lv.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, lv.VIR_NETWORK_SECTION_IP_DHCP_HOST, -1,
                       host.to_xml(), flags)

    # seeds

    def _write_seed(self, conn, pool, instance_id: str, guest: GuestSpec) -> None:
        name = self._names.seed(instance_id)
        data = seeds.build_iso(seeds.render(instance_id, guest))
        if len(data) > SEED_BYTES:
            raise HostError(f"the seed of instance {instance_id} is {len(data)} bytes, more than {SEED_BYTES}")
        vol = self._volume(pool, name)
        if vol is None:
            vol = pool.createXML(domain_xml.Volume(name=name, capacity_bytes=SEED_BYTES, format="raw").to_xml(), 0)
        self._io.write(conn, vol, data, pad_to=SEED_BYTES)

    def _read_seed(self, conn, vol) -> dict[str, str] | None:
        # A seed is SEED_BYTES: a volume of that name declaring more is not read into memory.
        data = self._io.read(conn, vol, limit=SEED_BYTES)
        try:
            return seeds.read_iso(data)
        except InvalidInput:
            return None

    # interface

    def check(self) -> None:
        def op(conn):
            self._pool(conn)
            net = self._network(conn)
            if not net.isActive():
                raise HostUnavailable(f"libvirt network {self.network!r} is not active: run `cloud-agent init`")
            if not self._is_test_driver(conn):
                self._check_subnet(net)
                self._check_virt_type(conn)
                self._check_filters(conn)

        self._call("check libvirt", op)

    def host_capacity(self) -> HostCapacity:
        def op(conn):
            # getInfo(): [model, memory MB, CPUs, MHz, NUMA nodes, sockets, cores, threads]
            info = conn.getInfo()
            return HostCapacity(vcpus=int(info[2]), memory_mb=int(info[1]))

        return self._call("read host capacity", op)

    def probe_guest(self) -> None:
        lv = _libvirt()
        cpu_mode, cpu_model = self._cpu()

        def op(conn):
            if self._is_test_driver(conn):
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

    def create_base_image(
        self,
        image_id: str,
        *,
        size_gb: int,
        source: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        check_id(image_id, "image id")
        check_positive(size_gb=size_gb)
        # Opened once: the check and the upload read this descriptor, never the path again.
        image = open_image_source(source, size_gb) if source is not None else None
        name = self._names.base(image_id)
        temp = self._names.partial_base(image_id, uuid.uuid4().hex[:8])
        made: list[str] = []  # the volumes this call created: a failure removes them by name

        def op(conn):
            lv = _libvirt()
            pool = self._pool(conn)
            if self._volume(pool, name) is not None:
                raise Conflict(f"base image of image {image_id} already exists")
            if image is None or not self._io.keeps_content:
                # Without content streams (the test driver) the checked source stands
                # in as a blank disk of the image's size: made whole by one call.
                made.append(name)
                volume = domain_xml.Volume(name=name, capacity_bytes=size_gb * GiB)
                pool.createXML(volume.to_xml(), 0)
                if image is not None and progress is not None:
                    progress(image.size, image.size)
                return
            # The content goes to a temporary volume first: a base image's name is only ever
            # seen complete and checked, by a concurrent create on this host or after a crash
            # mid-upload (which leaves the temporary volume; reconcile reports it).
            # Upload writes over the file without truncating it: start from an empty file
            # of the exact size; libvirt probes it as qcow2 after.
            made.append(temp)
            vol = pool.createXML(domain_xml.Volume(name=temp, capacity_bytes=image.size, format="raw").to_xml(), 0)
            self._io.upload_file(conn, vol, image, progress)
            self._check_stored_base(conn, pool, temp, size_gb)
            self._check_upload(conn, vol, image)
            # Published by a copy within the pool, made by the host (libvirt has no volume
            # rename, and the pool may be on another machine): the name appears when the copy
            # begins, but every create of this deployment looks for it only under the
            # image's copy lock (controller/hosts.py), held until this returns.
            made.append(name)
            try:
                pool.createXMLFrom(domain_xml.Volume(name=name, capacity_bytes=image.size).to_xml(), vol, 0)
            except lv.libvirtError as e:
                if _code(e) == getattr(lv, "VIR_ERR_STORAGE_VOL_EXIST", -1) or (
                        not _connection_lost(e) and self._volume(pool, name) is not None
                        and "already" in _msg(e)):
                    made.remove(name)  # another process published it meanwhile: not ours to remove
                    raise Conflict(f"base image of image {image_id} already exists") from e
                raise
            self._check_stored_base(conn, pool, name, size_gb)
            self._delete_volume(self._volume(pool, temp) or vol)
            made.remove(temp)

        try:
            self._call(f"create base image of image {image_id}", op, retry=False)
        except BaseException as err:  # a progress callback may raise anything
            if made:
                self._undo(err, f"volume {', '.join(made)}", lambda conn: self._remove(conn, volumes=list(made)))
            raise
        finally:
            if image is not None:
                image.close()
        return name

    def _check_upload(self, conn, vol, image) -> None:
        """The uploaded volume holds the source's bytes: its size on the host and the SHA-256
        of its content read back over the connection. HostError otherwise (the caller removes
        it): a stream that ended short, or content changed on the way."""
        lv = _libvirt()
        physical = vol.infoFlags(lv.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
        if physical != image.size:
            raise HostError(f"the uploaded base image {vol.name()} is {physical} bytes, its source {image.size}; "
                            "removed")
        if self._io.digest(conn, vol) != image.sha256():
            raise HostError(f"the uploaded base image {vol.name()} differs from its source (SHA-256); removed")

    def _check_stored_base(self, conn, pool, name: str, size_gb: int) -> None:
        """What was stored is what was checked: libvirt sees a qcow2 volume without a backing
        file, and its own header passes the source check (the source file may have been
        written to in place while it was uploaded). InvalidInput otherwise (the caller
        removes the volume)."""
        # Upload ends with an asynchronous refresh; ours makes libvirt probe the file now.
        pool.refresh(0)
        vol = pool.storageVolLookupByName(name)
        xml = vol.XMLDesc(0)
        fmt = ET.fromstring(xml).find("target/format")
        if fmt is None or fmt.get("type") != "qcow2":
            found = fmt.get("type") if fmt is not None else "unknown"
            raise InvalidInput(f"the uploaded base image {name} is stored as {found}, not qcow2; removed")
        if domain_xml.backing_path_of(xml) is not None:
            raise InvalidInput(f"the uploaded base image {name} refers to a backing file; removed")
        check_qcow2_header(self._io.read_head(conn, vol, 80), size_gb, f"the uploaded base image {name}")

    def _undo(self, err: BaseException, what: str, undo) -> None:
        """Run undo(conn) after a failed create; if that fails too, raise CleanupFailed naming what is left."""
        try:
            self._call(f"clean up {what}", undo)
        except ControllerError as undo_err:
            message = err.message if isinstance(err, ControllerError) else repr(err)
            raise CleanupFailed(f"{message}; cleanup failed, {what} may remain: {undo_err.message}") from err

    def delete_base_image(self, image_id: str) -> None:
        check_id(image_id, "image id")
        name = self._names.base(image_id)

        def op(conn):
            pool = self._pool(conn)
            vol = self._volume(pool, name)
            if vol is None:
                return
            path = vol.path()
            for other in pool.listAllVolumes(0):
                if other.name() != name and domain_xml.backing_path_of(other.XMLDesc(0)) == path:
                    raise Conflict(f"base image of image {image_id} is in use by volume {other.name()}")
            self._delete_volume(vol)

        self._call(f"delete base image of image {image_id}", op)

    def list_base_images(self) -> list[str]:
        def op(conn):
            names = (v.name() for v in self._pool(conn).listAllVolumes(0))
            return sorted({i for i in map(self._names.image_of_base, names) if i})

        return self._call("list base images", op)

    def list_partial_base_images(self) -> list[str]:
        def op(conn):
            names = (v.name() for v in self._pool(conn).listAllVolumes(0))
            return sorted(n for n in names if self._names.image_of_partial(n))

        return self._call("list temporary base image volumes", op)

    def delete_partial_base_image(self, volume: str) -> None:
        if not isinstance(volume, str) or not self._names.image_of_partial(volume):
            raise InvalidInput(f"{volume!r} is not a temporary base image volume")
        self._call(f"delete temporary volume {volume}", lambda conn: self._remove(conn, volumes=[volume]))

    def read_base_image(self, image_id: str, dest: int, *, max_bytes: int,
                        progress: Progress | None = None) -> bool:
        check_id(image_id, "image id")
        name = self._names.base(image_id)
        if not self._io.keeps_content:
            return False

        def op(conn):
            vol = self._volume(self._pool(conn), name)
            if vol is None:
                raise NotFound(f"base image of image {image_id} is missing from storage pool {self.storage_pool}")
            self._io.download_file(conn, vol, dest, progress, limit=max_bytes)
            return True

        return self._call(f"read base image of image {image_id}", op, retry=False)

    def uses_dhcp_reservations(self) -> bool:
        def op(conn):
            net = self._network(conn)
            return domain_xml.serves_addresses(net.XMLDesc(0))

        return self._call(f"read network {self.network}", op)

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
        check_id(instance_id, "instance id")
        check_volume_name(base_image)
        check_positive(vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb)
        check_guest(guest)
        disk_name, seed_name = self._names.disk(instance_id), self._names.seed(instance_id)
        began = []  # past the existence checks: from here a failure removes what spawn makes, by name

        def op(conn):
            pool = self._pool(conn)
            base = self._volume(pool, base_image)
            if base is None and self._stand_in and self._names.image_of_base(base_image):
                base = pool.createXML(domain_xml.Volume(name=base_image, capacity_bytes=GiB).to_xml(), 0)
            if base is None:
                raise HostError(
                    f"spawn instance {instance_id}: base image volume {base_image}"
                    f" is missing from storage pool {self.storage_pool}; see `cloud-agent reconcile`"
                )
            if any((self._domain(conn, instance_id), self._volume(pool, disk_name), self._volume(pool, seed_name))):
                raise Conflict(f"instance {instance_id} already exists on the hypervisor")
            if base.info()[1] > disk_gb * GiB:
                raise InvalidInput(f"disk of {disk_gb} GiB is smaller than base image {base_image}")
            began.append(True)
            overlay = domain_xml.Volume(
                name=disk_name,
                capacity_bytes=disk_gb * GiB,
                backing=domain_xml.BackingStore(path=base.path(), format="qcow2"),
            )
            vol = step("create disk volume", pool.createXML, overlay.to_xml(), 0)
            step("write seed", self._write_seed, conn, pool, instance_id, guest)
            step("reserve addresses", self._update_hosts, conn, add=reservations_for(guest))
            step("define network filters", self._ensure_filters, conn, guest)
            seed_path = self._volume(pool, seed_name).path()
            definition = self._definition(conn, instance_id, vol.path(), seed_path, vcpu=vcpu, memory_mb=memory_mb,
                                          guest=guest)
            dom = step("define domain", conn.defineXML, definition.to_xml())
            step("start domain", dom.create)

        def step(what, call, *args, **kwargs):
            lv = _libvirt()
            try:
                return call(*args, **kwargs)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    raise
                raise HostError(f"spawn instance {instance_id}: cannot {what}: {_msg(e)}") from e

        try:
            try:
                self._call(f"spawn instance {instance_id}", op, retry=False)
            finally:
                self._changed(instance_id)
        except BaseException as err:
            if began:
                what = f"domain, disk, seed and reservations of instance {instance_id}"
                macs = [n.mac for n in guest.nics]
                self._undo(err, what, lambda conn: self._remove(
                    conn, instance_id=instance_id, volumes=[disk_name, seed_name], macs=macs))
            raise

    def _remove(self, conn, *, instance_id: str | None = None, volumes: Iterable[str] = (),
                macs: Iterable[str] = ()) -> None:
        """Remove the instance's domain, the volumes and the reservations of its MACs, by name
        (on a possibly new connection)."""
        lv = _libvirt()
        macs = set(macs)
        dom = self._domain(conn, instance_id) if instance_id is not None else None
        if dom is not None:
            macs |= {n.mac for n in domain_xml.interfaces_of(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))}
            self._remove_domain(dom)
        if instance_id is not None:
            console_log.remove(self._pool(conn), console_log.file_name(self._names.prefix, instance_id), lv)
        if macs:
            self._update_hosts(conn, remove=macs)
        volumes = list(volumes)
        if volumes:
            pool = self._pool(conn)
            for name in volumes:
                vol = self._volume(pool, name)
                if vol is not None:
                    self._delete_volume(vol)

    def _cpu(self) -> tuple[str | None, str | None]:
        """(mode, model) of the <cpu> element; (None, None): none, QEMU's default model."""
        if self.cpu_mode in (None, "host-passthrough", "host-model"):
            return self.cpu_mode, None
        return "custom", self.cpu_mode

    def _definition(self, conn, instance_id, disk_path, seed_path, *, vcpu, memory_mb, guest) -> domain_xml.Domain:
        name = self._names.domain(instance_id)
        is_test = self._is_test_driver(conn)
        if self._lean and is_test:
            # The test driver runs no guest and keeps every definition in this process (twice
            # while running): 10,000 full ones cost 150 MB. It gets only what the controller
            # reads back from a domain (shares and NICs); disks and seed stay pool volumes,
            # which is where describe() looks for them.
            return domain_xml.Domain(name=name, uuid=domain_uuid(instance_id, name), memory_mb=memory_mb,
                                     vcpu=vcpu, virt_type="test", filesystems=self._filesystems(guest),
                                     interfaces=self._interfaces(guest))
        # The test driver only accepts its own domain type.
        virt_type = "test" if is_test else self.virt_type
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
            shared_memory=True,
            features=("acpi", "apic"),
            cpu_mode=cpu_mode,
            cpu_model=cpu_model,
            serial_console=True,
            serial_log=console_log.log_path(self._pool(conn), self._names.prefix, instance_id),
            bios_serial=True,
        )

    @staticmethod
    def _interfaces(guest: GuestSpec) -> tuple[domain_xml.Interface, ...]:
        """Each NIC with the network filter libvirt applies to what the guest sends (nic_filters.py)."""
        return tuple(domain_xml.Interface(mac=n.mac, network=n.network, bridge=n.bridge, filterref=filter_for(n))
                     for n in guest.nics)

    def _ensure_filters(self, conn, guest: GuestSpec | None = None) -> bool:
        """Define the project's network filters on this host when missing (True if it did), before a
        domain refers to them; with `guest`, only when one of its NICs does. Never redefined when
        present: a definition makes libvirt rebuild the rules of every NIC using the filter."""
        if self._is_test_driver(conn) or (guest is not None and not any(n.isolated for n in guest.nics)):
            return False
        lv = _libvirt()
        made = False
        for nwfilter in PROJECT_FILTERS:
            try:
                conn.nwfilterLookupByName(nwfilter.name)
            except lv.libvirtError as e:
                if _code(e) != lv.VIR_ERR_NO_NWFILTER:
                    raise
                conn.nwfilterDefineXML(nwfilter.to_xml())
                made = True
        return made

    def _check_filters(self, conn) -> None:
        """libvirt's nwfilter driver answers here and has clean-traffic, which every NIC uses."""
        lv = _libvirt()
        try:
            conn.nwfilterLookupByName(CLEAN_TRAFFIC)
        except lv.libvirtError as e:
            if _connection_lost(e):
                raise
            raise HostUnavailable(
                f"libvirt network filter {CLEAN_TRAFFIC} is not usable at {self.uri} ({_msg(e)}): guests' NICs "
                "need libvirt's nwfilter driver, its filters (Debian: libvirt-daemon-config-nwfilter), "
                "ebtables and iptables"
            ) from e

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
                dom.create()
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

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            try:
                if dom.isActive():
                    dom.destroy()
            except lv.libvirtError as e:
                if _code(e) != lv.VIR_ERR_OPERATION_INVALID or dom.isActive():
                    raise

        try:
            self._call(f"power off instance {instance_id}", op)
        finally:
            self._changed(instance_id)

    def reboot(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        cycling = False

        def op(conn):
            nonlocal cycling
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            not_running = Conflict(f"instance {instance_id} is not running")
            if cycling:
                # The connection was lost during the power cycle: finish it rather than start over.
                if not dom.isActive():
                    self._start_again(dom, instance_id)
                    return
                if not _definition_pending(dom):
                    return
            elif dom.state()[0] not in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED):
                raise not_running
            try:
                # A reset keeps the QEMU process, hence the devices it started with.
                if _definition_pending(dom):
                    cycling = True
                    dom.destroy()
                    self._start_again(dom, instance_id)
                else:
                    dom.reset(0)
            except lv.libvirtError as e:
                if _code(e) == lv.VIR_ERR_OPERATION_INVALID:
                    raise not_running from e
                raise

        try:
            self._call(f"reboot instance {instance_id}", op)
        finally:
            self._changed(instance_id)

    @staticmethod
    def _start_again(dom, instance_id: str) -> None:
        lv = _libvirt()
        try:
            dom.create()
        except lv.libvirtError as e:
            if _connection_lost(e):
                raise
            raise HostError(
                f"reboot instance {instance_id}: powered off to apply its changed definition, "
                f"but cannot start it again (it is shut off): {_msg(e)}"
            ) from e

    def status(self, instance_id: str) -> str:
        check_id(instance_id, "instance id")
        live = self._live
        # Kept current by events: no call to the host, not even isAlive() (each libvirt
        # call hands the GIL over, the dearest part of a GET under load). A connection that
        # closes says so through its close callback (_on_close).
        if live is not None and (live.watched and not live.closed and live.conn is self._conn
                                 or not live.watched and live.conn is self._connection()):
            return live.get(instance_id)
        # A fresh snapshot of statuses() answers too (same age rule, dropped by our own
        # changes): it saves the domain look-up, and each libvirt call hands the GIL over.
        snap = self._snapshot
        if snap is not None and time.monotonic() - snap[0] <= self._status_max_age:
            return snap[1].get(instance_id, "error")

        def op(conn):
            dom = self._domain(conn, instance_id)
            return "error" if dom is None else status_of(*dom.state())

        return self._call(f"status of instance {instance_id}", op)

    def statuses(self) -> dict[str, str]:
        # getAllDomainStats is one call, but it makes a Python object per domain: with
        # 10,000 domains each read costs 80-250 ms of the server's CPU, whatever the
        # list's length. So it is read once per connection and kept current by lifecycle
        # events (_live_statuses). Without events, a snapshot serves the lists of the next
        # status_max_age seconds; this adapter's own changes drop it (_changed), so only
        # changes made outside the controller show up that much later.
        live = self._live_statuses()
        if live is not None:
            return live.copy()
        if self._status_max_age <= 0:
            return self._read_statuses()
        snap = self._snapshot
        if snap is not None and time.monotonic() - snap[0] <= self._status_max_age:
            return snap[1]
        # One refresh at a time. While one runs, the others answer from the snapshot it
        # replaces (a moment older) rather than wait; with none (dropped by a change of
        # ours, or the first list) they wait for the new one.
        if not self._snapshot_lock.acquire(blocking=snap is None):
            return snap[1]
        try:
            snap = self._snapshot
            if snap is None or time.monotonic() - snap[0] > self._status_max_age:
                generation = self._generation
                snap = (time.monotonic(), self._read_statuses())
                # Kept only if no change of ours happened while it was read (it may predate it).
                if generation == self._generation:
                    self._snapshot = snap
            return snap[1]
        finally:
            self._snapshot_lock.release()

    def status_changes(self, since: object | None) -> tuple[object, dict[str, str | None], bool]:
        live = self._live_statuses()
        if live is not None:
            return live.changes(since)
        # Without events: each snapshot is whole; the same one again has no change.
        statuses = self.statuses()
        if isinstance(since, tuple) and since[0] == "snapshot" and since[1] is statuses:
            return since, {}, False
        return ("snapshot", statuses), statuses, True

    def _changed(self, instance_id: str) -> None:
        """Our own change of an instance's domain: the next statuses() asks the host, and
        the event-kept statuses learn it now rather than when its event arrives (a list
        right after a power-off shows it)."""
        self._generation += 1
        self._snapshot = None
        live = self._live
        if live is None:
            return
        lv = _libvirt()
        try:
            dom = live.conn.lookupByName(self._names.domain(instance_id))
            live.set(instance_id, status_of(*dom.state()))
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_DOMAIN:
                live.set(instance_id, None)
            else:
                self._live = None  # unsure: the next statuses() reads them all again

    def _live_statuses(self) -> "_LiveStatuses | None":
        """The event-kept statuses of the current connection, set up on first use: the
        callback first, then one full read, then the events that came meanwhile, in order.
        None on a driver without lifecycle events (statuses() then reads snapshots)."""
        conn = self._connection()
        live = self._live
        if live is not None and live.conn is conn:
            return live
        if self._no_events:
            return None
        lv = _libvirt()
        with self._snapshot_lock:
            live = self._live
            if live is not None and live.conn is conn:
                return live
            live = _LiveStatuses(conn, self._names)
            try:
                conn.domainEventRegisterAny(None, lv.VIR_DOMAIN_EVENT_ID_LIFECYCLE, _on_lifecycle, live)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    self._forget(conn)
                    raise HostUnreachable(f"statuses of instances: lost the connection to libvirt at "
                                          f"{self.uri}: {_msg(e)}") from e
                log.info("libvirt at %s gives no lifecycle events (%s): statuses are read per list",
                         self.uri, _msg(e))
                self._no_events = True
                return None
            try:
                conn.registerCloseCallback(_on_close, live)
                live.watched = True
            except lv.libvirtError as e:
                log.info("libvirt at %s has no close callback (%s): status() checks the connection",
                         self.uri, _msg(e))
            live.start(self._read_statuses())
            self._live = live
            return live

    def _read_statuses(self) -> dict[str, str]:
        def op(conn):
            lv = _libvirt()
            # One RPC for every domain's state; the name travels with each domain object.
            found = {}
            for dom, stats in conn.getAllDomainStats(lv.VIR_DOMAIN_STATS_STATE):
                instance_id = self._names.instance_of_domain(dom.name())
                if instance_id:
                    found[instance_id] = status_of(stats.get("state.state", lv.VIR_DOMAIN_NOSTATE),
                                                   stats.get("state.reason", 0))
            return found

        return self._call("statuses of instances", op)

    def set_guest(self, instance_id: str, guest: GuestSpec) -> None:
        check_id(instance_id, "instance id")
        check_guest(guest)

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            persistent = dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)
            old_macs = {n.mac for n in domain_xml.interfaces_of(persistent)}
            self._ensure_filters(conn, guest)
            xml = domain_xml.replace_devices(persistent, "filesystem", list(self._filesystems(guest)))
            xml = domain_xml.replace_devices(xml, "interface", list(self._interfaces(guest)))
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

    def network_status(self) -> str:
        def op(conn):
            net = self._network(conn, required=False)
            return "missing" if net is None else ("active" if net.isActive() else "inactive")

        return self._call(f"state of network {self.network}", op)

    def list_reservations(self) -> list[Reservation]:
        return self._call("list reservations", lambda conn: sorted(self._reservations_all(conn), key=lambda r: r.mac))

    def drop_reservations(self, macs: list[str]) -> None:
        self._call("drop reservations", lambda conn: self._update_hosts(conn, remove=set(macs)))

    def _reservations_all(self, conn) -> list[Reservation]:
        lv = _libvirt()
        net = self._network(conn, required=False)
        if net is None:
            return []
        hosts = domain_xml.dhcp_hosts_of(net.XMLDesc(0))
        return [Reservation(mac=h.mac, address=h.ip, hostname=h.name) for h in hosts]

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
                nics = tuple(sorted(
                    (NicDevice(mac=n.mac, network=n.network, bridge=n.bridge, filter=n.filterref)
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
        return self._call(f"read the console of instance {instance_id}", lambda conn: console_log.read(
            conn, self._pool(conn), self._domain(conn, instance_id), name=name, max_bytes=max_bytes, since=since,
            lv=_libvirt()))
