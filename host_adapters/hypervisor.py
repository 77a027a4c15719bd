"""Virtual machines: the interface, the libvirt implementation and a fake.

An instance is a persistent libvirt domain named `<domain_prefix><instance id>`
whose only disk is a qcow2 overlay volume `<domain_prefix>disk-<instance id>.qcow2`
on a base image volume `<domain_prefix>base-<image id>.qcow2`, all in one
libvirt storage pool. Users' home directories reach the guest as 9p filesystem
shares tagged with the system username (`mount -t 9p -o trans=virtio TAG DIR`).
"""

import functools
import logging
import os
import re
import struct
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from controller.errors import (
    Conflict,
    ControllerError,
    HostError,
    HostUnavailable,
    InvalidInput,
    NotFound,
)
from host_adapters import domain_xml
from host_adapters.names import check_username

log = logging.getLogger(__name__)

STATUSES = ("building", "running", "paused", "shutoff", "crashed", "error")

GiB = 1024**3

Progress = Callable[[int, int], None]


class Share(NamedTuple):
    """A directory shared with the guest under a tag (the system username)."""

    tag: str
    source_dir: str


@dataclass(frozen=True)
class InstanceInfo:
    instance_id: str
    status: str  # as status() answers; "error" when there is no domain
    defined: bool  # whether a domain exists
    shares: tuple[Share, ...]  # of the persistent definition, sorted by tag
    # What the guest has now, sorted by tag (a paused guest too); None when
    # there is no guest (shut off, crashed, no domain). Differs from `shares`
    # after set_shares on a running instance until its next start or reboot.
    live_shares: tuple[Share, ...] | None
    disk_path: str | None  # the overlay volume, None when it is missing


class Hypervisor:
    """Where instances run. Docstrings state what must hold after each call.

    Every method raises InvalidInput for a malformed id or argument before
    touching the host, HostUnavailable when the hypervisor cannot be reached,
    and HostError (with a message naming the step) when the host refuses.
    """

    def check(self) -> None:
        """Raise HostUnavailable (naming the cause) unless the hypervisor and its storage pool can be used."""
        raise NotImplementedError

    def create_base_image(
        self,
        image_id: str,
        *,
        size_gb: int,
        source: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Create the base image volume of an image and return its volume name.

        Without `source` the volume is a blank qcow2 disk of `size_gb` GiB;
        with it, the content of that local qcow2 file, whose virtual size must
        not exceed `size_gb` GiB and which must not refer to other files
        (InvalidInput otherwise). `progress(sent_bytes, total_bytes)` is called
        while uploading. Conflict if the volume exists. All or nothing: on
        failure no volume remains.
        """
        raise NotImplementedError

    def delete_base_image(self, image_id: str) -> None:
        """Delete the base image volume. Succeeds when it is already gone.

        Conflict while an instance disk is built on it.
        """
        raise NotImplementedError

    def list_base_images(self) -> list[str]:
        """The image ids that have a base image volume, sorted."""
        raise NotImplementedError

    def spawn(
        self,
        instance_id: str,
        *,
        base_image: str,
        vcpu: int,
        memory_mb: int,
        disk_gb: int,
        shares: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Create the instance's disk on `base_image` (a volume name from create_base_image),
        define its domain with `shares` ((tag, source_dir) pairs) and start it.

        Synchronous: when this returns the instance is running. Conflict if the
        instance already has a domain or a disk (left untouched). All or
        nothing: on any other failure neither a domain nor a disk remains and
        HostError says what failed.
        """
        raise NotImplementedError

    def power_on(self, instance_id: str) -> None:
        """Afterwards the instance is running (started or resumed). No change if it already runs.

        NotFound if the instance has no domain.
        """
        raise NotImplementedError

    def power_off(self, instance_id: str) -> None:
        """Immediate hard power-off; afterwards the instance is shut off. No change if it already is.

        NotFound if the instance has no domain.
        """
        raise NotImplementedError

    def reboot(self, instance_id: str) -> None:
        """Restart a running instance; afterwards it runs its persistent definition.

        When the running guest matches its persistent definition (at least its
        shares: describe().live_shares == describe().shares) this is a hard
        reset of the same guest. Otherwise it is a hard power cycle (power-off,
        then start), so that changes the hypervisor could not make live (a
        share removed by set_shares) take effect: a reset would keep them.
        Either way the guest loses its memory state, as with a reset button.

        Conflict if it is not running; NotFound if it has no domain. HostError
        if the instance was powered off but could not be started again (it is
        left shut off).
        """
        raise NotImplementedError

    def status(self, instance_id: str) -> str:
        """One of STATUSES. An instance without a domain is "error" (the host lost it)."""
        raise NotImplementedError

    def set_shares(self, instance_id: str, shares: Iterable[tuple[str, str]]) -> None:
        """The persistent definition gets exactly these shares.

        A running instance gets them live where the hypervisor can hot-plug
        them. Where it cannot (QEMU cannot hot-plug 9p shares, so a removed
        user keeps access to the running guest) this call still succeeds, the
        guest keeps the shares it has (describe().live_shares) and the new
        ones take effect at its next power-on or reboot. NotFound if the
        instance has no domain.
        """
        raise NotImplementedError

    def destroy(self, instance_id: str) -> None:
        """Hard power-off, undefine the domain and delete the instance's disk.

        Succeeds when any or all of them are already gone.
        """
        raise NotImplementedError

    def list_instances(self) -> list[str]:
        """Ids of instances that have a domain or a disk on this host, sorted."""
        raise NotImplementedError

    def describe(self, instance_id: str) -> InstanceInfo:
        """What the host holds for the instance: the persistent definition and, while a
        guest runs, its live shares. NotFound if it has neither a domain nor a disk."""
        raise NotImplementedError


# --- validation shared by the implementations -------------------------------

# Ids end up in domain and volume names, hence in paths: no "/", no leading dot.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VOLUME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")

_QCOW2_MAGIC = b"QFI\xfb"
_QCOW2_EXTERNAL_DATA_FILE = 1 << 2


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidInput(f"invalid {what} {value!r}")
    return value


def _check_volume_name(value: object) -> str:
    if not isinstance(value, str) or not _VOLUME.fullmatch(value):
        raise InvalidInput(f"invalid base image volume name {value!r}")
    return value


def _check_positive(**values: object) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, not {value!r}")


def _check_shares(shares: Iterable[tuple[str, str]]) -> tuple[Share, ...]:
    if isinstance(shares, (str, bytes)):
        raise InvalidInput("shares must be a list of (tag, source_dir) pairs")
    result: dict[str, Share] = {}
    for item in shares:
        try:
            tag, source_dir = item
        except (TypeError, ValueError):
            raise InvalidInput(f"invalid share {item!r}: expected (tag, source_dir)") from None
        check_username(tag)
        if (
            not isinstance(source_dir, str)
            or not os.path.isabs(source_dir)
            or "\0" in source_dir
            or os.path.normpath(source_dir) != source_dir
        ):
            raise InvalidInput(f"invalid share directory {source_dir!r}: must be a normalized absolute path")
        if tag in result:
            raise InvalidInput(f"share tag {tag!r} given twice")
        result[tag] = Share(tag, source_dir)
    return tuple(result[tag] for tag in sorted(result))


def check_image_source(source: str, size_gb: int) -> int:
    """Size in bytes of a qcow2 file fit to become a base image; InvalidInput otherwise."""
    try:
        with open(source, "rb") as f:
            header = f.read(80)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise InvalidInput(f"cannot read image source {source}: {e.strerror}") from None
    if len(header) < 32 or header[:4] != _QCOW2_MAGIC:
        raise InvalidInput(
            f"image source {source} is not a qcow2 file (convert it with qemu-img convert -O qcow2)"
        )
    version, backing_offset = struct.unpack(">IQ", header[4:16])
    # A backing file or external data file would let the guest read a host file.
    if backing_offset != 0:
        raise InvalidInput(f"image source {source} refers to a backing file; flatten it first")
    if version >= 3 and len(header) >= 80:
        (incompatible,) = struct.unpack(">Q", header[72:80])
        if incompatible & _QCOW2_EXTERNAL_DATA_FILE:
            raise InvalidInput(f"image source {source} uses an external data file")
    (virtual_size,) = struct.unpack(">Q", header[24:32])
    if virtual_size > size_gb * GiB:
        raise InvalidInput(
            f"image source {source} has a virtual size of {virtual_size} bytes, more than {size_gb} GiB"
        )
    return size


class _Names:
    """Domain and volume names of one deployment (one prefix)."""

    def __init__(self, prefix: str):
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise InvalidInput(f"invalid domain prefix {prefix!r}")
        self.prefix = prefix

    def domain(self, instance_id: str) -> str:
        return self.prefix + instance_id

    def disk(self, instance_id: str) -> str:
        return f"{self.prefix}disk-{instance_id}.qcow2"

    def base(self, image_id: str) -> str:
        return f"{self.prefix}base-{image_id}.qcow2"

    def _strip(self, name: str, head: str, tail: str) -> str | None:
        if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
            found = name[len(head) : len(name) - len(tail)]
            return found if _ID.fullmatch(found) else None
        return None

    def instance_of_domain(self, name: str) -> str | None:
        return self._strip(name, self.prefix, "")

    def instance_of_disk(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}disk-", ".qcow2")

    def image_of_base(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}base-", ".qcow2")


def _domain_uuid(instance_id: str, domain_name: str) -> str:
    # Operators find an instance in `virsh list --uuid` by the controller's id.
    try:
        return str(uuid.UUID(instance_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, "libvirt-domain:" + domain_name))


# --- libvirt -----------------------------------------------------------------


@functools.cache
def _libvirt():
    import libvirt

    # libvirt prints every error on stderr unless a handler takes it; ours are raised.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def _code(err) -> int:
    return err.get_error_code()


def _msg(err) -> str:
    return err.get_error_message() or str(err)


def _connection_lost(err) -> bool:
    lv = _libvirt()
    code, domain = err.get_error_code(), err.get_error_domain()
    if code == lv.VIR_ERR_INVALID_CONN:
        return True
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


def _shares_of(filesystems: Iterable[domain_xml.Filesystem]) -> tuple[Share, ...]:
    return tuple(sorted(Share(fs.target_dir, fs.source_dir) for fs in filesystems))


def _definition_pending(dom) -> bool:
    """Whether the running guest's shares differ from its persistent definition's (set_shares changes only those)."""
    lv = _libvirt()

    def key(xml: str):
        return sorted((fs.target_dir, fs.source_dir, fs.accessmode) for fs in domain_xml.filesystems_of(xml))

    return key(dom.XMLDesc(0)) != key(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))


# Live device changes the driver may refuse; the persistent definition still holds them.
_LIVE_UNSUPPORTED = (
    "VIR_ERR_NO_SUPPORT",
    "VIR_ERR_OPERATION_UNSUPPORTED",
    "VIR_ERR_CONFIG_UNSUPPORTED",
    "VIR_ERR_ARGUMENT_UNSUPPORTED",
    "VIR_ERR_OPERATION_INVALID",
)


class LibvirtHypervisor(Hypervisor):
    """Instances as libvirt domains, disks as volumes of one storage pool.

    One connection per adapter (libvirt connections are thread-safe), opened
    on first use and opened again, once per call, when it was lost.
    """

    def __init__(self, uri: str, *, storage_pool: str, domain_prefix: str = "cc-"):
        self.uri = uri
        self.storage_pool = storage_pool
        self._names = _Names(domain_prefix)
        self._conn = None
        self._lock = threading.Lock()

    # connection

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
            try:
                self._conn = lv.open(self.uri)
            except lv.libvirtError as e:
                raise HostUnavailable(f"cannot connect to libvirt at {self.uri}: {_msg(e)}") from e
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
                    raise HostUnavailable(f"{what}: lost the connection to libvirt at {self.uri}: {_msg(e)}") from e
                log.warning("connection to libvirt at %s lost (%s); reconnecting", self.uri, _msg(e))

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

    # interface

    def check(self) -> None:
        self._call("check libvirt", self._pool)

    def create_base_image(
        self,
        image_id: str,
        *,
        size_gb: int,
        source: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        _check_id(image_id, "image id")
        _check_positive(size_gb=size_gb)
        upload_size = check_image_source(source, size_gb) if source is not None else None
        name = self._names.base(image_id)
        began = []  # past the existence check: from here a failure removes the volume by name

        def op(conn):
            pool = self._pool(conn)
            if self._volume(pool, name) is not None:
                raise Conflict(f"base image of image {image_id} already exists")
            began.append(True)
            if source is None:
                volume = domain_xml.Volume(name=name, capacity_bytes=size_gb * GiB)
            else:
                # Upload writes over the file without truncating it: start from
                # an empty file of the exact size; libvirt probes it as qcow2 after.
                volume = domain_xml.Volume(name=name, capacity_bytes=upload_size, format="raw")
            vol = pool.createXML(volume.to_xml(), 0)
            if source is not None:
                self._upload(conn, vol, source, upload_size, progress)

        try:
            self._call(f"create base image of image {image_id}", op, retry=False)
        except BaseException as err:  # a progress callback may raise anything
            if began:
                self._undo(err, f"volume {name}", lambda conn: self._remove(conn, volume=name))
            raise
        return name

    @staticmethod
    def _upload(conn, vol, source: str, size: int, progress: Progress | None) -> None:
        lv = _libvirt()
        stream = conn.newStream(0)
        sent = 0
        with open(source, "rb") as f:

            def read(_stream, nbytes, _opaque):
                nonlocal sent
                data = f.read(nbytes)
                sent += len(data)
                if progress is not None and data:
                    progress(sent, size)
                return data

            try:
                vol.upload(stream, 0, size, 0)
                stream.sendAll(read, None)
                stream.finish()
            except BaseException:
                try:
                    stream.abort()
                except lv.libvirtError:
                    pass
                raise

    def _undo(self, err: BaseException, what: str, undo) -> None:
        """Run undo(conn) after a failed create; if that fails too, raise an error naming what is left."""
        try:
            self._call(f"clean up {what}", undo)
        except ControllerError as undo_err:
            message = err.message if isinstance(err, ControllerError) else repr(err)
            raise HostError(f"{message}; cleanup failed, {what} may remain: {undo_err.message}") from err

    def delete_base_image(self, image_id: str) -> None:
        _check_id(image_id, "image id")
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

    def spawn(
        self,
        instance_id: str,
        *,
        base_image: str,
        vcpu: int,
        memory_mb: int,
        disk_gb: int,
        shares: Iterable[tuple[str, str]] = (),
    ) -> None:
        _check_id(instance_id, "instance id")
        _check_volume_name(base_image)
        _check_positive(vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb)
        shares = _check_shares(shares)
        disk_name = self._names.disk(instance_id)
        began = []  # past the existence checks: from here a failure removes domain and disk by name

        def op(conn):
            pool = self._pool(conn)
            base = self._volume(pool, base_image)
            if base is None:
                raise HostError(
                    f"spawn instance {instance_id}: base image volume {base_image}"
                    f" is missing from storage pool {self.storage_pool}"
                )
            if self._domain(conn, instance_id) is not None or self._volume(pool, disk_name) is not None:
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
            definition = self._definition(conn, instance_id, vol.path(), vcpu=vcpu, memory_mb=memory_mb, shares=shares)
            dom = step("define domain", conn.defineXML, definition.to_xml())
            step("start domain", dom.create)

        def step(what, call, *args):
            lv = _libvirt()
            try:
                return call(*args)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    raise
                raise HostError(f"spawn instance {instance_id}: cannot {what}: {_msg(e)}") from e

        try:
            self._call(f"spawn instance {instance_id}", op, retry=False)
        except BaseException as err:
            if began:
                what = f"domain and disk of instance {instance_id}"
                self._undo(err, what, lambda conn: self._remove(conn, instance_id=instance_id, volume=disk_name))
            raise

    def _remove(self, conn, *, instance_id: str | None = None, volume: str | None = None) -> None:
        """Remove the instance's domain and the volume, by name (on a possibly new connection)."""
        dom = self._domain(conn, instance_id) if instance_id is not None else None
        if dom is not None:
            self._remove_domain(dom)
        vol = self._volume(self._pool(conn), volume) if volume is not None else None
        if vol is not None:
            self._delete_volume(vol)

    def _definition(self, conn, instance_id, disk_path, *, vcpu, memory_mb, shares) -> domain_xml.Domain:
        name = self._names.domain(instance_id)
        # The test driver only accepts its own domain type; everything else here is KVM.
        virt_type = "test" if conn.getType().lower() == "test" else "kvm"
        return domain_xml.Domain(
            name=name,
            uuid=_domain_uuid(instance_id, name),
            memory_mb=memory_mb,
            vcpu=vcpu,
            virt_type=virt_type,
            disks=(domain_xml.Disk(path=disk_path),),
            filesystems=tuple(domain_xml.Filesystem(source_dir=s.source_dir, target_dir=s.tag) for s in shares),
            features=("acpi", "apic"),
            # HPC codes want the host's full instruction set; these guests never migrate.
            cpu_mode="host-passthrough",
            serial_console=True,
        )

    def power_on(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")

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

        self._call(f"power on instance {instance_id}", op)

    def power_off(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            try:
                if dom.isActive():
                    dom.destroy()
            except lv.libvirtError as e:
                if _code(e) != lv.VIR_ERR_OPERATION_INVALID or dom.isActive():
                    raise

        self._call(f"power off instance {instance_id}", op)

    def reboot(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")
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
                # A reset keeps the QEMU process, hence the shares it could not drop live.
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

        self._call(f"reboot instance {instance_id}", op)

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
        _check_id(instance_id, "instance id")

        def op(conn):
            dom = self._domain(conn, instance_id)
            return "error" if dom is None else status_of(*dom.state())

        return self._call(f"status of instance {instance_id}", op)

    def set_shares(self, instance_id: str, shares: Iterable[tuple[str, str]]) -> None:
        _check_id(instance_id, "instance id")
        shares = _check_shares(shares)
        wanted = [domain_xml.Filesystem(source_dir=s.source_dir, target_dir=s.tag) for s in shares]

        def op(conn):
            lv = _libvirt()
            dom = self._existing_domain(conn, instance_id)
            persistent = dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)
            conn.defineXML(domain_xml.replace_filesystems(persistent, wanted))
            if dom.isActive():
                self._set_live_filesystems(dom, wanted)

        self._call(f"set shares of instance {instance_id}", op)

    @staticmethod
    def _set_live_filesystems(dom, wanted: list) -> None:
        lv = _libvirt()
        unsupported = {getattr(lv, name) for name in _LIVE_UNSUPPORTED if hasattr(lv, name)}
        live = domain_xml.filesystems_of(dom.XMLDesc(0))
        changes = [(dom.detachDeviceFlags, "removed", fs) for fs in live if fs not in wanted]
        changes += [(dom.attachDeviceFlags, "added", fs) for fs in wanted if fs not in live]
        for change, done, fs in changes:
            try:
                change(fs.to_xml(), lv.VIR_DOMAIN_AFFECT_LIVE)
            except lv.libvirtError as e:
                if _code(e) not in unsupported:
                    raise
                # Callers see the difference in describe().live_shares (reconcile reports
                # it); reboot or a power cycle applies it.
                log.warning(
                    "share %s cannot be %s live on running domain %s; it will be at its next power-on or reboot: %s",
                    fs.target_dir, done, dom.name(), _msg(e),
                )

    def destroy(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")

        self._call(
            f"destroy instance {instance_id}",
            lambda conn: self._remove(conn, instance_id=instance_id, volume=self._names.disk(instance_id)),
        )

    def list_instances(self) -> list[str]:
        def op(conn):
            found = {self._names.instance_of_domain(d.name()) for d in conn.listAllDomains(0)}
            found |= {self._names.instance_of_disk(v.name()) for v in self._pool(conn).listAllVolumes(0)}
            return sorted(i for i in found if i)

        return self._call("list instances", op)

    def describe(self, instance_id: str) -> InstanceInfo:
        _check_id(instance_id, "instance id")

        def op(conn):
            lv = _libvirt()
            dom = self._domain(conn, instance_id)
            vol = self._volume(self._pool(conn), self._names.disk(instance_id))
            if dom is None and vol is None:
                raise NotFound(f"instance {instance_id} has neither a domain nor a disk on the hypervisor")
            shares: tuple[Share, ...] = ()
            live_shares: tuple[Share, ...] | None = None
            if dom is not None:
                shares = _shares_of(domain_xml.filesystems_of(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE)))
                if dom.isActive():
                    live_shares = _shares_of(domain_xml.filesystems_of(dom.XMLDesc(0)))
            return InstanceInfo(
                instance_id=instance_id,
                status="error" if dom is None else status_of(*dom.state()),
                defined=dom is not None,
                shares=shares,
                live_shares=live_shares,
                disk_path=vol.path() if vol is not None else None,
            )

        return self._call(f"describe instance {instance_id}", op)


# --- fake --------------------------------------------------------------------


# Statuses in which a guest exists (QEMU runs): its live shares are those it started with.
_FAKE_ACTIVE = ("running", "paused", "building")


@dataclass
class FakeInstance:
    """A fake domain; tests may change `status` to any of STATUSES.

    `shares` is the persistent definition; `live_shares` what the guest got
    when it last started (like QEMU, the fake cannot change them live).
    """

    status: str
    shares: tuple[Share, ...]
    base_image: str
    vcpu: int
    memory_mb: int
    disk_gb: int
    live_shares: tuple[Share, ...] = ()

    def start(self) -> None:
        self.live_shares = self.shares
        self.status = "running"


class FakeHypervisor(Hypervisor):
    """In memory. `fail_on` maps a step to the exception it raises (until removed).

    Steps: every public method name, plus "volume", "define" and "start",
    the three steps of spawn. Tests may edit `instances` (domains), `disks`
    (instance id -> base image volume) and `base_images` (volume -> size in GiB).
    """

    pool_path = "/fake-pool"

    def __init__(self, *, domain_prefix: str = "cc-"):
        self._names = _Names(domain_prefix)
        self.instances: dict[str, FakeInstance] = {}
        self.disks: dict[str, str] = {}
        self.base_images: dict[str, int] = {}
        self.fail_on: dict[str, Exception] = {}
        self._lock = threading.Lock()

    def _step(self, name: str) -> None:
        err = self.fail_on.get(name)
        if err is not None:
            raise err

    def _existing(self, instance_id: str) -> FakeInstance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise NotFound(f"instance {instance_id} has no domain on the hypervisor")
        return inst

    def check(self) -> None:
        self._step("check")

    def create_base_image(
        self,
        image_id: str,
        *,
        size_gb: int,
        source: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        _check_id(image_id, "image id")
        _check_positive(size_gb=size_gb)
        size = check_image_source(source, size_gb) if source is not None else None
        name = self._names.base(image_id)
        with self._lock:
            self._step("create_base_image")
            if name in self.base_images:
                raise Conflict(f"base image of image {image_id} already exists")
            if size is not None and progress is not None:
                progress(size, size)
            self.base_images[name] = size_gb
        return name

    def delete_base_image(self, image_id: str) -> None:
        _check_id(image_id, "image id")
        name = self._names.base(image_id)
        with self._lock:
            self._step("delete_base_image")
            users = sorted(i for i, base in self.disks.items() if base == name)
            if name in self.base_images and users:
                raise Conflict(f"base image of image {image_id} is in use by volume {self._names.disk(users[0])}")
            self.base_images.pop(name, None)

    def list_base_images(self) -> list[str]:
        self._step("list_base_images")
        return sorted(i for i in map(self._names.image_of_base, self.base_images) if i)

    def spawn(
        self,
        instance_id: str,
        *,
        base_image: str,
        vcpu: int,
        memory_mb: int,
        disk_gb: int,
        shares: Iterable[tuple[str, str]] = (),
    ) -> None:
        _check_id(instance_id, "instance id")
        _check_volume_name(base_image)
        _check_positive(vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb)
        shares = _check_shares(shares)
        with self._lock:
            self._step("spawn")
            if base_image not in self.base_images:
                raise HostError(f"spawn instance {instance_id}: base image volume {base_image} is missing")
            if instance_id in self.instances or instance_id in self.disks:
                raise Conflict(f"instance {instance_id} already exists on the hypervisor")
            if self.base_images[base_image] > disk_gb:
                raise InvalidInput(f"disk of {disk_gb} GiB is smaller than base image {base_image}")
            try:
                self._step("volume")
                self.disks[instance_id] = base_image
                self._step("define")
                self.instances[instance_id] = FakeInstance("shutoff", shares, base_image, vcpu, memory_mb, disk_gb)
                self._step("start")
                self.instances[instance_id].start()
            except BaseException:
                self.instances.pop(instance_id, None)
                self.disks.pop(instance_id, None)
                raise

    def power_on(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("power_on")
            if inst.status in _FAKE_ACTIVE:
                inst.status = "running"  # resumed: the same guest
            else:
                inst.start()

    def power_off(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("power_off")
            inst.status = "shutoff"

    def reboot(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("reboot")
            if inst.status != "running":
                raise Conflict(f"instance {instance_id} is not running")
            if inst.live_shares != inst.shares:
                inst.start()  # the power cycle; a reset would keep the live shares

    def status(self, instance_id: str) -> str:
        _check_id(instance_id, "instance id")
        self._step("status")
        inst = self.instances.get(instance_id)
        return "error" if inst is None else inst.status

    def set_shares(self, instance_id: str, shares: Iterable[tuple[str, str]]) -> None:
        _check_id(instance_id, "instance id")
        shares = _check_shares(shares)
        with self._lock:
            inst = self._existing(instance_id)
            self._step("set_shares")
            inst.shares = shares

    def destroy(self, instance_id: str) -> None:
        _check_id(instance_id, "instance id")
        with self._lock:
            self._step("destroy")
            self.instances.pop(instance_id, None)
            self.disks.pop(instance_id, None)

    def list_instances(self) -> list[str]:
        self._step("list_instances")
        return sorted(set(self.instances) | set(self.disks))

    def describe(self, instance_id: str) -> InstanceInfo:
        _check_id(instance_id, "instance id")
        self._step("describe")
        inst = self.instances.get(instance_id)
        if inst is None and instance_id not in self.disks:
            raise NotFound(f"instance {instance_id} has neither a domain nor a disk on the hypervisor")
        return InstanceInfo(
            instance_id=instance_id,
            status="error" if inst is None else inst.status,
            defined=inst is not None,
            shares=inst.shares if inst is not None else (),
            live_shares=inst.live_shares if inst is not None and inst.status in _FAKE_ACTIVE else None,
            disk_path=f"{self.pool_path}/{self._names.disk(instance_id)}" if instance_id in self.disks else None,
        )
