"""Virtual machines: the interface, what the implementations share, and a fake.

An instance is a persistent domain named `<domain_prefix><instance id>` with
an overlay disk on its image's base disk, a NoCloud seed disk (label
`cidata`, host_adapters/seed.py) telling the guest its name, addresses and
users, one NIC per address, and one virtiofs share per home. The libvirt
implementation is in host_adapters/libvirt_hypervisor.py.
"""

import contextlib
import errno
import hashlib
import itertools
import os
import re
import stat
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from common.errors import CleanupFailed, Conflict, HostError, HostUnreachable, InvalidInput, NotFound
from host_adapters import seed as seeds
from host_adapters.console import ConsoleMark, ConsoleOutput, check_max_bytes, start_of_tail
from host_adapters.domain_xml import FilterRef
from host_adapters.guest import GuestSpec, Reservation, Share
from host_adapters.nic_filters import filter_for

STATUSES = ("building", "running", "paused", "shutoff", "crashed", "error")

GiB = 1024**3

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class NicDevice:
    """A NIC of a domain definition, as the host holds it."""

    mac: str
    network: str | None = None
    bridge: str | None = None
    filter: FilterRef | None = None  # the nwfilter libvirt applies to what the guest sends


@dataclass(frozen=True)
class InstanceInfo:
    instance_id: str
    status: str  # as status() answers; "error" when there is no domain
    defined: bool  # whether a domain exists
    shares: tuple[Share, ...]  # of the persistent definition, sorted by tag
    # What the guest has now, sorted by tag (a paused guest too); None when
    # there is no guest (shut off, crashed, no domain). Differs from `shares`
    # after set_guest on a running instance until its next power-on or reboot.
    live_shares: tuple[Share, ...] | None
    disk_path: str | None  # the overlay volume, None when it is missing
    nics: tuple[NicDevice, ...] = ()  # of the persistent definition, sorted by MAC
    # DHCP reservations for the instance's MACs in the networks its NICs use.
    reservations: tuple[Reservation, ...] = ()
    # The seed disk's documents (seed.render output), None when the seed is missing.
    seed: dict[str, str] | None = field(default=None)


@dataclass(frozen=True)
class HostCapacity:
    """What a host has in all, before allocation ratios and reserved memory."""

    vcpus: int  # logical CPUs
    memory_mb: int


class Hypervisor:
    """Where instances run. Docstrings state what must hold after each call.

    Every method raises InvalidInput for a malformed id or argument before
    touching the host, HostUnavailable when the hypervisor cannot be reached,
    and HostError (with a message naming the step) when the host refuses.
    """

    def check(self) -> None:
        """Raise HostUnavailable (naming the cause) unless the hypervisor, its storage pool,
        the private network and the configured virtualization type can be used."""
        raise NotImplementedError

    def probe_guest(self) -> None:
        """Start and stop a small diskless guest with the configured virtualization type and CPU
        mode; HostUnavailable, saying which setting to change, when QEMU cannot start one.
        Slower than check(): for `cloud-agent check`, not for every health probe."""
        raise NotImplementedError

    def host_capacity(self) -> HostCapacity:
        """The host's logical CPUs and memory in MB, as the hypervisor reports them
        (physical totals: admission applies the ratios and reserved memory)."""
        raise NotImplementedError

    def ensure_network(self) -> bool:
        """The private network exists, runs and starts with the host. True when this call
        had to create or start it."""
        raise NotImplementedError

    def network_status(self) -> str:
        """"active", "inactive" or "missing": the state of the private network."""
        raise NotImplementedError

    def list_reservations(self) -> list[Reservation]:
        """Every DHCP reservation of the private network, sorted by MAC."""
        raise NotImplementedError

    def drop_reservations(self, macs: list[str]) -> None:
        """The private network has no reservation for these MACs afterwards."""
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
        (InvalidInput otherwise). The file is opened once (a symlink is
        refused), checked and uploaded from that one descriptor, and the stored
        volume is checked again (qcow2, no backing file) where its content is
        kept. `progress(sent_bytes, total_bytes)` is called while uploading.
        Conflict if the volume exists. All or nothing: on failure no volume
        remains. Content is uploaded under a temporary name
        (Names.partial_base), checked there (its size and SHA-256 read back),
        and only then published under the final name: a volume of that name
        is complete and checked, and an interrupted upload leaves only a
        temporary volume (list_partial_base_images).
        """
        raise NotImplementedError

    def delete_base_image(self, image_id: str) -> None:
        """Delete the base image volume. Succeeds when it is already gone.

        Conflict while an instance disk is built on it.
        """
        raise NotImplementedError

    def list_partial_base_images(self) -> list[str]:
        """The names of the temporary volumes uploads write before a base image is published
        (Names.partial_base), sorted: left by an upload that was interrupted (a crash of the
        uploading process), or of an upload in progress. Never used as a base image."""
        raise NotImplementedError

    def delete_partial_base_image(self, volume: str) -> None:
        """Delete one volume list_partial_base_images names (InvalidInput for another name).
        Succeeds when it is already gone."""
        raise NotImplementedError

    def list_base_images(self) -> list[str]:
        """The image ids that have a base image volume, sorted."""
        raise NotImplementedError

    def read_base_image(self, image_id: str, dest: int, *, max_bytes: int,
                        progress: Progress | None = None) -> bool:
        """Write the content of the image's base volume to the open file descriptor `dest`
        (streamed from the host, so it works over a remote connection), calling
        progress(received_bytes, total_bytes). False, writing nothing, where the host keeps
        no content (libvirt's test driver: its base disks are blank stand-ins). NotFound if
        the volume is missing; HostError once more than max_bytes arrive (see
        base_file_limit)."""
        raise NotImplementedError

    def uses_dhcp_reservations(self) -> bool:
        """Whether the private network hands out addresses by DHCP (a NAT network made by
        ensure_network): then spawn and set_guest reserve each NIC's address there. A
        bridged network has no DHCP of libvirt's: guests use their static config only."""
        raise NotImplementedError

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
        """Create the instance's disk on `base_image` (a volume name from create_base_image)
        and its seed from `guest`, reserve the addresses of its NICs, define its domain
        (NICs, virtiofs shares of `guest`) and start it.

        Synchronous: when this returns the instance is running. Conflict if the
        instance already has a domain or a disk (left untouched). All or
        nothing: on any other failure no domain, disk, seed or reservation
        remains and HostError says what failed.
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
        """Restart a running instance; afterwards it runs its persistent definition and reads its seed again.

        When the running guest has the shares of its persistent definition
        this is a hard reset of the same guest. Otherwise it is a hard power
        cycle (power-off, then start), so that shares changed by set_guest take
        effect: a reset would keep the devices the guest has. Either way the
        guest loses its memory state, as with a reset button.

        Conflict if it is not running; NotFound if it has no domain. HostError
        if the instance was powered off but could not be started again (it is
        left shut off).
        """
        raise NotImplementedError

    def status(self, instance_id: str) -> str:
        """One of STATUSES. An instance without a domain is "error" (the host lost it)."""
        raise NotImplementedError

    def statuses(self) -> dict[str, str]:
        """The status of every instance with a domain on this host, in one call to the
        host whatever their number (lists use it; one status() per row would cost a
        round trip each). An instance missing from it has no domain: "error".
        Callers only read the mapping (an adapter may hand out a shared snapshot)."""
        raise NotImplementedError

    def status_changes(self, since: object | None) -> tuple[object, dict[str, str | None], bool]:
        """What statuses() says now, as a change from a mark an earlier call returned:
        (mark, statuses, whole). whole: `statuses` is statuses() itself (first call, an
        unknown or too old mark, or the host's view was read anew). Otherwise it holds
        only the instances whose status changed since `since` (None: the domain is gone).
        A caller that keeps the stored statuses equal to the host's view writes only
        those. At most one call to the host, as statuses()."""
        return object(), self.statuses(), True

    def set_guest(self, instance_id: str, guest: GuestSpec) -> None:
        """The instance's persistent definition, seed and reservations match `guest` afterwards.

        A running guest keeps the devices and users it has; the new ones take
        effect at its next power-on or reboot (cloud-init reads the seed at
        every boot). NotFound if the instance has no domain.
        """
        raise NotImplementedError

    def destroy(self, instance_id: str) -> None:
        """Hard power-off, undefine the domain, delete its disk and seed and drop its reservations.

        Succeeds when any or all of them are already gone.
        """
        raise NotImplementedError

    def list_instances(self) -> list[str]:
        """Ids of instances that have a domain, a disk or a seed on this host, sorted."""
        raise NotImplementedError

    @contextlib.contextmanager
    def batch(self):
        """A block of many calls (reconcile rebuilding every domain of a sandbox) in which the
        adapter may postpone changes that cost more one at a time than together, and make
        them together when the block ends; an error in doing so is raised there. Calls in
        the block behave as documented, except that those changes (the libvirt adapter:
        DHCP reservations) exist only once the block has ended. Adapters with nothing
        to group run every call at once."""
        yield

    def describe(self, instance_id: str) -> InstanceInfo:
        """What the host holds for the instance: the persistent definition and, while a
        guest runs, its live shares. NotFound if it has neither a domain nor a disk."""
        raise NotImplementedError

    def console(self, instance_id: str, *, max_bytes: int, since: ConsoleMark | None = None) -> ConsoleOutput:
        """The last max_bytes (0 to console.MAX_BYTES) of the serial console output of the
        instance's last run (QEMU's last start; a reset keeps the run), after `since` when that
        mark (of an earlier call) is of this run, with the mark where the output ends now
        (None when no guest runs). The host keeps the output bounded; destroy deletes it.
        Empty output where none is kept (no domain, a host that keeps none)."""
        raise NotImplementedError


# --- validation shared by the implementations -------------------------------

# Ids end up in domain and volume names, hence in paths: no "/", no leading dot.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VOLUME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_TOKEN = re.compile(r"^[0-9a-f]{8}-$")

_QCOW2_MAGIC = b"QFI\xfb"
_QCOW2_EXTERNAL_DATA_FILE = 1 << 2


def check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidInput(f"invalid {what} {value!r}")
    return value


def check_volume_name(value: object) -> str:
    if not isinstance(value, str) or not _VOLUME.fullmatch(value):
        raise InvalidInput(f"invalid base image volume name {value!r}")
    return value


def check_positive(**values: object) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, not {value!r}")


def check_guest(value: object) -> GuestSpec:
    if not isinstance(value, GuestSpec):
        raise InvalidInput(f"guest must be a GuestSpec, not {type(value).__name__}")
    return value


class ImageSource:
    """A source image opened once, by open_image_source: checked from this descriptor
    and uploaded from it, so whatever is at the path later is never read.

    A context manager; `read(offset, n)` reads without moving a file position,
    so the header check and the upload cannot disturb each other.
    """

    def __init__(self, path: str, fd: int, size: int):
        self.path, self.fd, self.size = path, fd, size

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def sha256(self) -> str:
        """The SHA-256 of its `size` bytes, read from the descriptor."""
        digest, offset = hashlib.sha256(), 0
        while offset < self.size:
            chunk = self.read(offset, min(1 << 20, self.size - offset))
            if not chunk:
                break
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "ImageSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_qcow2_header(header: bytes, size_gb: int, what: str) -> None:
    """InvalidInput unless header (the first 80 bytes or all there are) is a qcow2 header fit for a
    base image: no backing file, no external data file, a virtual size of at most size_gb GiB."""
    if len(header) < 32 or header[:4] != _QCOW2_MAGIC:
        raise InvalidInput(f"{what} is not a qcow2 file (convert it with qemu-img convert -O qcow2)")
    version, backing_offset = struct.unpack(">IQ", header[4:16])
    # A backing file or external data file would let the guest read a host file.
    if backing_offset != 0:
        raise InvalidInput(f"{what} refers to a backing file; flatten it first")
    if version >= 3 and len(header) >= 80:
        (incompatible,) = struct.unpack(">Q", header[72:80])
        if incompatible & _QCOW2_EXTERNAL_DATA_FILE:
            raise InvalidInput(f"{what} uses an external data file")
    (virtual_size,) = struct.unpack(">Q", header[24:32])
    if virtual_size > size_gb * GiB:
        raise InvalidInput(f"{what} has a virtual size of {virtual_size} bytes, more than {size_gb} GiB")


def base_file_limit(size_gb: int) -> int:
    """The most bytes a base image's file of size_gb GiB may hold: its virtual size, the qcow2
    tables over it (about 2 % with the smallest clusters, 512 bytes) and room for the header.
    More is not a disk (internal snapshots, data past its end): refused when it is added, and
    a copy between hosts stops there, before it fills the head node's disk."""
    return size_gb * GiB + size_gb * GiB // 32 + 64 * 1024 * 1024


def open_image_source(source: str, size_gb: int) -> ImageSource:
    """Open a qcow2 file to become a base image and check it from that descriptor; InvalidInput
    if it cannot be read, is a symlink (O_NOFOLLOW) or not a regular file, or is unfit."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(source, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidInput(f"image source {source} is a symbolic link; give the file itself") from None
        raise InvalidInput(f"cannot read image source {source}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"image source {source} is not a regular file")
        if st.st_size > base_file_limit(size_gb):
            raise InvalidInput(f"image source {source} is {st.st_size} bytes, more than a qcow2 file of "
                               f"{size_gb} GiB holds ({base_file_limit(size_gb)}); remove its snapshots "
                               "(qemu-img convert -O qcow2)")
        image = ImageSource(source, fd, st.st_size)
        try:
            header = image.read(0, 80)
        except OSError as e:
            raise InvalidInput(f"cannot read image source {source}: {e.strerror}") from None
        check_qcow2_header(header, size_gb, f"image source {source}")
        return image
    except BaseException:
        os.close(fd)
        raise


class Names:
    """Domain and volume names of one deployment (one prefix)."""

    def __init__(self, prefix: str):
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise InvalidInput(f"invalid domain prefix {prefix!r}")
        self.prefix = prefix

    def domain(self, instance_id: str) -> str:
        return self.prefix + instance_id

    def disk(self, instance_id: str) -> str:
        return f"{self.prefix}disk-{instance_id}.qcow2"

    def seed(self, instance_id: str) -> str:
        return f"{self.prefix}seed-{instance_id}.iso"

    def base(self, image_id: str) -> str:
        return f"{self.prefix}base-{image_id}.qcow2"

    def partial_base(self, image_id: str, token: str) -> str:
        """Where an upload writes before the base image is published; `token` (8 hex digits)
        keeps two uploads of one image (two processes) apart."""
        return f"{self.prefix}part-{token}-{image_id}.qcow2"

    def _strip(self, name: str, head: str, tail: str) -> str | None:
        if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
            found = name[len(head) : len(name) - len(tail)]
            return found if _ID.fullmatch(found) else None
        return None

    def instance_of_domain(self, name: str) -> str | None:
        return self._strip(name, self.prefix, "")

    def instance_of_disk(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}disk-", ".qcow2")

    def instance_of_seed(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}seed-", ".iso")

    def image_of_base(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}base-", ".qcow2")

    def image_of_partial(self, name: str) -> str | None:
        found = self._strip(name, f"{self.prefix}part-", ".qcow2")
        if found is None or not _TOKEN.fullmatch(found[:9]):
            return None
        return found[9:] if _ID.fullmatch(found[9:]) else None


def domain_uuid(instance_id: str, domain_name: str) -> str:
    # Operators find an instance in `virsh list --uuid` by the controller's id.
    try:
        return str(uuid.UUID(instance_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, "libvirt-domain:" + domain_name))


def reservations_for(guest: GuestSpec) -> tuple[Reservation, ...]:
    """The DHCP reservations an instance's private NICs need (public NICs are static only)."""
    return tuple(
        Reservation(mac=n.mac, address=n.address, hostname=guest.hostname) for n in guest.nics if n.network
    )


def nic_devices_for(guest: GuestSpec) -> tuple[NicDevice, ...]:
    """The NICs a domain has for `guest`, each with its filter (host_adapters/nic_filters.py)."""
    return tuple(NicDevice(mac=n.mac, network=n.network, bridge=n.bridge, filter=filter_for(n)) for n in guest.nics)


# --- fake --------------------------------------------------------------------


# Statuses in which a guest exists (QEMU runs): its live shares are those it started with.
_FAKE_ACTIVE = ("running", "paused", "building")
_FAKE_RUNS = itertools.count(1)


@dataclass
class FakeInstance:
    """A fake domain; tests may change `status` to any of STATUSES.

    `guest` is the persistent definition (NICs, shares) and the seed's
    content; `live_guest` what the guest got when it last booted (like QEMU,
    the fake changes nothing live).
    """

    status: str
    guest: GuestSpec
    base_image: str
    vcpu: int
    memory_mb: int
    disk_gb: int
    live_guest: GuestSpec | None = None
    seed: dict[str, str] | None = None
    nics: tuple[NicDevice, ...] = ()
    # The serial console of the current run (`run`, counted per start); tests append what a
    # guest prints.
    console: bytearray = field(default_factory=bytearray)
    run: int = 0

    @property
    def shares(self) -> tuple[Share, ...]:
        return tuple(sorted(self.guest.shares))

    @property
    def live_shares(self) -> tuple[Share, ...]:
        return tuple(sorted(self.live_guest.shares)) if self.live_guest is not None else ()

    def start(self) -> None:
        self.live_guest = self.guest
        self.status = "running"
        # A new QEMU: its output starts afresh, as a real host's log file does.
        self.run = next(_FAKE_RUNS)
        self.console = bytearray(f"fake firmware: booting {self.guest.hostname}\r\n".encode())


class FakeHypervisor(Hypervisor):
    """In memory. `fail_on` maps a step to the exception it raises (until removed);
    `capacity` is what host_capacity() reports (a large head node unless a test sets it).

    Steps: every public method name, plus "volume", "seed", "reserve",
    "define" and "start", the steps of spawn. Tests may edit `instances`
    (domains), `disks` (instance id -> base image volume), `base_images`
    (volume -> size in GiB) and `networks` (name -> {mac: Reservation}; a
    missing name is a missing network).
    """

    pool_path = "/fake-pool"

    def __init__(self, *, domain_prefix: str = "cc-", network: str = "cc-private"):
        self._names = Names(domain_prefix)
        self.network = network
        self.instances: dict[str, FakeInstance] = {}
        self.disks: dict[str, str] = {}
        self.seeds: dict[str, dict[str, str]] = {}
        self.base_images: dict[str, int] = {}
        self.networks: dict[str, dict[str, Reservation]] = {network: {}}
        self.fail_on: dict[str, Exception] = {}
        self.capacity = HostCapacity(vcpus=64, memory_mb=256 * 1024)
        # A dead host: every call raises HostUnreachable (tests of many hosts).
        self.dead = False
        # False: a bridged network without DHCP (no reservations are made).
        self.dhcp = True
        # Base image content uploaded from a source file (volume -> bytes).
        self.base_content: dict[str, bytes] = {}
        # How often each step ran: tests count the calls a request makes to the host.
        self.calls: Counter[str] = Counter()
        # A slow host: a step named here waits for its event (at most 30 s) before it runs.
        self.slow_on: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    @property
    def host_calls(self) -> int:
        """Calls of the Hypervisor interface so far (spawn's inner steps are not calls)."""
        return sum(n for name, n in self.calls.items() if hasattr(Hypervisor, name))

    def _step(self, name: str) -> None:
        self.calls[name] += 1
        gate = self.slow_on.get(name)
        if gate is not None:
            gate.wait(timeout=30)
        if self.dead:
            raise HostUnreachable(f"cannot connect to libvirt at fake host ({name})")
        err = self.fail_on.get(name)
        if err is not None:
            raise err

    def _existing(self, instance_id: str) -> FakeInstance:
        if self.dead:
            raise HostUnreachable("cannot connect to libvirt at fake host")
        inst = self.instances.get(instance_id)
        if inst is None:
            raise NotFound(f"instance {instance_id} has no domain on the hypervisor")
        return inst

    def check(self) -> None:
        self._step("check")
        if self.network not in self.networks:
            raise HostError(f"network {self.network} is missing: run `cloud-agent init`")

    def probe_guest(self) -> None:
        self._step("probe_guest")

    def host_capacity(self) -> HostCapacity:
        self._step("host_capacity")
        return self.capacity

    def network_status(self) -> str:
        self._step("network_status")
        return "active" if self.network in self.networks else "missing"

    def list_reservations(self) -> list[Reservation]:
        self._step("list_reservations")
        return sorted(self.networks.get(self.network, {}).values(), key=lambda r: r.mac)

    def drop_reservations(self, macs: list[str]) -> None:
        self._step("drop_reservations")
        self._unreserve(macs)

    def ensure_network(self) -> bool:
        self._step("ensure_network")
        if self.network in self.networks:
            return False
        self.networks[self.network] = {}
        return True

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
        image = open_image_source(source, size_gb) if source is not None else None
        name = self._names.base(image_id)
        # Like the libvirt adapter: content goes to a temporary volume, visible as such while
        # it is uploaded (not under the lock: other calls go on, as on a host), and is
        # published under `name` once complete and checked.
        temp = self._names.partial_base(image_id, uuid.uuid4().hex[:8])
        try:
            with self._lock:
                self._step("create_base_image")
                if name in self.base_images:
                    raise Conflict(f"base image of image {image_id} already exists")
                if image is None:
                    self.base_images[name] = size_gb
                    return name
                self.base_images[temp] = size_gb
                self.base_content[temp] = b""
            try:
                # Sent in chunks like a stream: fail_on["upload"] fails it half way.
                chunk = 64 * 1024
                while len(self.base_content[temp]) < image.size:
                    self._step("upload")
                    done = len(self.base_content[temp])
                    self.base_content[temp] += image.read(done, min(chunk, image.size - done))
                    if progress is not None:
                        progress(len(self.base_content[temp]), image.size)
                with self._lock:
                    self._step("publish")
                    if hashlib.sha256(self.base_content[temp]).hexdigest() != image.sha256():
                        raise HostError(f"the uploaded base image of image {image_id} differs from its source")
                    if name in self.base_images:
                        raise Conflict(f"base image of image {image_id} already exists")
                    self.base_content[name] = self.base_content.pop(temp)
                    self.base_images[name] = self.base_images.pop(temp)
            finally:
                with self._lock:
                    self.base_images.pop(temp, None)
                    self.base_content.pop(temp, None)
        finally:
            if image is not None:
                image.close()
        return name

    def delete_base_image(self, image_id: str) -> None:
        check_id(image_id, "image id")
        name = self._names.base(image_id)
        with self._lock:
            self._step("delete_base_image")
            users = sorted(i for i, base in self.disks.items() if base == name)
            if name in self.base_images and users:
                raise Conflict(f"base image of image {image_id} is in use by volume {self._names.disk(users[0])}")
            self.base_images.pop(name, None)

    def list_base_images(self) -> list[str]:
        self._step("list_base_images")
        return sorted(i for i in map(self._names.image_of_base, list(self.base_images)) if i)

    def list_partial_base_images(self) -> list[str]:
        self._step("list_partial_base_images")
        return sorted(n for n in list(self.base_images) if self._names.image_of_partial(n))

    def delete_partial_base_image(self, volume: str) -> None:
        if not isinstance(volume, str) or not self._names.image_of_partial(volume):
            raise InvalidInput(f"{volume!r} is not a temporary base image volume")
        with self._lock:
            self._step("delete_partial_base_image")
            self.base_images.pop(volume, None)
            self.base_content.pop(volume, None)

    def read_base_image(self, image_id: str, dest: int, *, max_bytes: int,
                        progress: Progress | None = None) -> bool:
        check_id(image_id, "image id")
        self._step("read_base_image")
        name = self._names.base(image_id)
        if name not in self.base_images:
            raise NotFound(f"base image of image {image_id} is missing")
        content = self.base_content.get(name)
        if content is None:
            return False  # a blank disk, like the test driver's stand-ins
        if len(content) > max_bytes:
            raise HostError(f"volume {name} streamed {len(content)} bytes, more than the {max_bytes} bytes "
                            "taken from it; stopped")
        os.write(dest, content)
        if progress is not None:
            progress(len(content), len(content))
        return True

    def uses_dhcp_reservations(self) -> bool:
        self._step("uses_dhcp_reservations")
        return self.dhcp

    def _reserve(self, guest: GuestSpec) -> None:
        if not self.dhcp:
            return
        for r in reservations_for(guest):
            net = self.networks.get(self.network)
            if net is None:
                raise HostError(f"network {self.network} is missing")
            net[r.mac] = r

    def _unreserve(self, macs) -> None:
        for net in self.networks.values():
            for mac in macs:
                net.pop(mac, None)

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
                self._step("seed")
                self.seeds[instance_id] = seeds.render(instance_id, guest)
                self._step("reserve")
                self._reserve(guest)
                self._step("define")
                self.instances[instance_id] = FakeInstance(
                    "shutoff", guest, base_image, vcpu, memory_mb, disk_gb, nics=nic_devices_for(guest)
                )
                self._step("start")
                self.instances[instance_id].start()
            except BaseException as err:
                if self.dead:
                    # As the real one: a host that stopped answering mid-way cannot be cleaned up.
                    raise CleanupFailed(f"spawn instance {instance_id}: cleanup failed, what was made may "
                                        "remain") from err
                self.instances.pop(instance_id, None)
                self.disks.pop(instance_id, None)
                self.seeds.pop(instance_id, None)
                self._unreserve(n.mac for n in guest.nics)
                raise

    def power_on(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("power_on")
            if inst.status in _FAKE_ACTIVE:
                inst.status = "running"  # resumed: the same guest
            else:
                inst.start()

    def power_off(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("power_off")
            inst.status = "shutoff"
            inst.live_guest = None

    def reboot(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        with self._lock:
            inst = self._existing(instance_id)
            self._step("reboot")
            if inst.status != "running":
                raise Conflict(f"instance {instance_id} is not running")
            # As the real one: a reset when the guest has its definition's devices (the same
            # QEMU: its console goes on), else a power cycle.
            reset = inst.live_guest is not None and inst.live_shares == inst.shares \
                and nic_devices_for(inst.live_guest) == inst.nics
            run, output = inst.run, inst.console
            inst.start()  # a reset or a power cycle: either way the guest boots its definition
            if reset:
                inst.run, inst.console = run, output + inst.console

    def status(self, instance_id: str) -> str:
        check_id(instance_id, "instance id")
        self._step("status")
        inst = self.instances.get(instance_id)
        return "error" if inst is None else inst.status

    def statuses(self) -> dict[str, str]:
        self._step("statuses")
        with self._lock:
            return {i: inst.status for i, inst in self.instances.items()}

    def set_guest(self, instance_id: str, guest: GuestSpec) -> None:
        check_id(instance_id, "instance id")
        check_guest(guest)
        with self._lock:
            inst = self._existing(instance_id)
            self._step("set_guest")
            self._unreserve(n.mac for n in inst.guest.nics)
            self._reserve(guest)
            self.seeds[instance_id] = seeds.render(instance_id, guest)
            inst.guest = guest
            inst.nics = nic_devices_for(guest)

    def destroy(self, instance_id: str) -> None:
        check_id(instance_id, "instance id")
        with self._lock:
            self._step("destroy")
            inst = self.instances.pop(instance_id, None)
            if inst is not None:
                self._unreserve(n.mac for n in inst.nics)
            self.disks.pop(instance_id, None)
            self.seeds.pop(instance_id, None)

    def list_instances(self) -> list[str]:
        self._step("list_instances")
        return sorted(set(self.instances) | set(self.disks) | set(self.seeds))

    def describe(self, instance_id: str) -> InstanceInfo:
        check_id(instance_id, "instance id")
        self._step("describe")
        inst = self.instances.get(instance_id)
        if inst is None and instance_id not in self.disks and instance_id not in self.seeds:
            raise NotFound(f"instance {instance_id} has neither a domain nor a disk on the hypervisor")
        macs = {n.mac for n in inst.nics} if inst is not None else set()
        reservations = tuple(
            sorted((r for net in self.networks.values() for mac, r in net.items() if mac in macs), key=lambda r: r.mac)
        )
        return InstanceInfo(
            instance_id=instance_id,
            status="error" if inst is None else inst.status,
            defined=inst is not None,
            shares=inst.shares if inst is not None else (),
            live_shares=inst.live_shares if inst is not None and inst.status in _FAKE_ACTIVE else None,
            disk_path=f"{self.pool_path}/{self._names.disk(instance_id)}" if instance_id in self.disks else None,
            nics=tuple(sorted(inst.nics, key=lambda n: n.mac)) if inst is not None else (),
            reservations=reservations,
            seed=self.seeds.get(instance_id),
        )

    def console(self, instance_id: str, *, max_bytes: int, since: ConsoleMark | None = None) -> ConsoleOutput:
        check_id(instance_id, "instance id")
        check_max_bytes(max_bytes)
        self._step("console")
        with self._lock:
            inst = self.instances.get(instance_id)
            if inst is None:
                return ConsoleOutput(data=b"", mark=None)
            output = bytes(inst.console)
            run = str(inst.run) if inst.status in _FAKE_ACTIVE and inst.run else None
        start = start_of_tail(len(output), max_bytes, since, run)
        return ConsoleOutput(data=output[start:], mark=ConsoleMark(run, len(output)) if run else None)
