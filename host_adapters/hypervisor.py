"""Virtual machines: the interface every hypervisor adapter implements, and its value types.

An instance is a persistent domain named `<domain_prefix><instance id>` with
an overlay disk on its image's base disk, a NoCloud seed disk (label
`cidata`, host_adapters/guests/seed.py) telling the guest its name, addresses and
users, one NIC per address, and one virtiofs share per home. The libvirt
implementation is in host_adapters/libvirt/ (driver.py), the in-memory one
for tests in host_adapters/fake_hypervisor.py.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from common.errors import InvalidInput
from host_adapters.guests.console import ConsoleMark, ConsoleOutput
from host_adapters.guests.guest import GuestSpec, Reservation, Share

STATUSES = ("building", "running", "paused", "shutoff", "crashed", "error")

GiB = 1024**3

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class FilterRef:
    """A NIC's rules, by name, with their parameters sorted (which NIC gets which:
    host_adapters/libvirt/nic_filters.py; what they guarantee: host_adapters/network/guest_firewall.py)."""

    name: str
    parameters: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NicDevice:
    """A NIC of a domain definition, as the host holds it."""

    mac: str
    network: str | None = None
    bridge: str | None = None
    filter: FilterRef | None = None  # the rules of what the guest sends and receives


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


@dataclass(frozen=True)
class HostIdentity:
    """Which libvirt a connection reaches, whatever URI reached it: the host's UUID (libvirt's
    capabilities; None where the driver reports none, as the test driver) and the UUID of the
    storage pool the host record names (random at the pool's definition)."""

    host_uuid: str | None
    pool_uuid: str

    def same_as(self, other: "HostIdentity") -> bool:
        """One libvirt (one set of domains and disks) behind both: the same host UUID, or the
        same pool."""
        return (self.host_uuid is not None and self.host_uuid == other.host_uuid) or self.pool_uuid == other.pool_uuid


def check_wait(wait_seconds: object) -> None:
    """A bounded wait: a number of seconds, at least 0 (bool refused)."""
    if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, (int, float)) or not 0 <= wait_seconds < 1e6:
        raise InvalidInput(f"wait_seconds must be a number of seconds from 0, not {wait_seconds!r}")


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

    def identity(self) -> HostIdentity:
        """Which libvirt this connection reaches (HostIdentity): two host records whose
        identities are the same_as each other are one host, whatever their URIs."""
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

    def shut_down(self, instance_id: str, *, wait_seconds: float) -> bool:
        """Afterwards the instance is shut off: a running guest is asked to shut down (the guest
        agent where one answers, else the ACPI power button) and given wait_seconds to do so,
        then powered off hard. A guest that cannot hear it (paused), or a wait of 0, is powered
        off at once. True when it was shut off without the hard power-off (also when it already
        was). NotFound if it has no domain."""
        raise NotImplementedError

    def read_disk(self, instance_id: str, dest: int, *, max_bytes: int, progress: Progress | None = None) -> bool:
        """Write the content of the instance's disk (its overlay volume: a qcow2 file whose
        backing file is its image's base volume) to the open file descriptor `dest`, streamed
        from the host as read_base_image does; for a shut-off instance (a cold move). False,
        writing nothing, where the host keeps no content (libvirt's test driver). NotFound if
        the disk is missing; HostError once more than max_bytes arrive."""
        raise NotImplementedError

    def receive(self, instance_id: str, *, base_image: str, vcpu: int, memory_mb: int, disk_gb: int,
                guest: GuestSpec, disk: str | None, start: bool) -> None:
        """As spawn, for an instance moved from another host: its disk holds the content of
        the local file `disk` (what read_disk wrote there; None where that host keeps no
        content: a new overlay), pointed at this host's `base_image` (the file's header is
        changed in place: host_adapters/images/disk_copy.py), and the domain is started only when
        `start`. The stored disk is read back and checked against the file (SHA-256) before
        this returns. Conflict if the instance already has a domain or a disk here. All or
        nothing: on any other failure no domain, disk, seed or reservation remains."""
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

    def reboot(self, instance_id: str, *, wait_seconds: float) -> bool:
        """Restart a running instance cleanly; afterwards it runs its persistent definition and
        reads its seed again.

        The guest is shut down as shut_down() does (asked, given wait_seconds, then powered off
        hard), then started: a new guest with the devices of its persistent definition (shares
        changed by set_guest take effect). Never a reset: a reset is a pulled plug for the
        guest's disk. True when the guest shut down when asked, False when it was powered off
        hard.

        Conflict if it is not running; NotFound if it has no domain. HostError if the instance
        was shut down but could not be started again (it is left shut off).
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
