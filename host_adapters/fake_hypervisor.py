"""An in-memory Hypervisor for tests, and many of them as the hosts of a HostPool.

What the libvirt adapter (host_adapters/libvirt/) does on a host, this does in
dictionaries, with knobs to make steps fail, hang or a host die; the contract
tests (tests/hypervisor/test_hypervisor.py) hold both to the same behaviour.
"""

import hashlib
import itertools
import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from common.errors import CleanupFailed, Conflict, HostError, HostUnreachable, InvalidInput, NotFound
from host_adapters.guests import seed as seeds
from host_adapters.guests.console import ConsoleMark, ConsoleOutput, check_max_bytes, start_of_tail
from host_adapters.fail_on import FailOn
from host_adapters.guests.guest import GuestSpec, Reservation, Share, check_guest, check_positive, reservations_for
from host_adapters.host_pool import HostSpec
from host_adapters.hypervisor import (HostCapacity, HostIdentity, Hypervisor, InstanceInfo, NicDevice, Progress,
                                      check_wait)
from host_adapters.images.image_source import open_image_source
from host_adapters.names import Names, check_id, check_volume_name
from host_adapters.libvirt.nic_filters import nic_devices_for

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


class FakeHypervisor(FailOn, Hypervisor):
    """In memory. `fail_on` maps a step to the exception it raises (until removed);
    `capacity` is what host_capacity() reports (a large head node unless a test sets it).

    Steps: every public method name, plus "volume", "seed", "reserve",
    "define" and "start", the steps of spawn (and of receive, which starts only if asked). Tests may edit `instances`
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
        # Which libvirt this is (identity()): one fake reached under two names is one host.
        self.host_uuid, self.pool_uuid = str(uuid.uuid4()), str(uuid.uuid4())
        # A dead host: every call raises HostUnreachable (tests of many hosts).
        self.dead = False
        # False: a bridged network without DHCP (no reservations are made).
        self.dhcp = True
        # Base image content uploaded from a source file (volume -> bytes).
        self.base_content: dict[str, bytes] = {}
        # What instance disks hold (instance id -> bytes; tests write it): a move copies it.
        self.disk_content: dict[str, bytes] = {}
        # Guests that ignore the ACPI power button: shut_down powers them off hard.
        self.ignores_acpi: set[str] = set()
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
        self._maybe_fail(name)

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

    def identity(self) -> HostIdentity:
        self._step("identity")
        return HostIdentity(host_uuid=self.host_uuid, pool_uuid=self.pool_uuid)

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
        self._make("spawn", instance_id, base_image=base_image, vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb,
                   guest=guest, content=None, start=True)

    def receive(self, instance_id: str, *, base_image: str, vcpu: int, memory_mb: int, disk_gb: int,
                guest: GuestSpec, disk: str | None, start: bool) -> None:
        content = None
        if disk is not None:
            with open(disk, "rb") as f:
                content = f.read()
        self._make("receive", instance_id, base_image=base_image, vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb,
                   guest=guest, content=content, start=start)

    def _make(self, what: str, instance_id: str, *, base_image: str, vcpu: int, memory_mb: int, disk_gb: int,
              guest: GuestSpec, content: bytes | None, start: bool) -> None:
        check_id(instance_id, "instance id")
        check_volume_name(base_image)
        check_positive(vcpu=vcpu, memory_mb=memory_mb, disk_gb=disk_gb)
        check_guest(guest)
        with self._lock:
            self._step(what)
            if base_image not in self.base_images:
                raise HostError(f"{what} instance {instance_id}: base image volume {base_image} is missing")
            if instance_id in self.instances or instance_id in self.disks:
                raise Conflict(f"instance {instance_id} already exists on the hypervisor")
            if self.base_images[base_image] > disk_gb:
                raise InvalidInput(f"disk of {disk_gb} GiB is smaller than base image {base_image}")
            try:
                self._step("volume")
                self.disks[instance_id] = base_image
                if content is not None:
                    self.disk_content[instance_id] = content
                self._step("seed")
                self.seeds[instance_id] = seeds.render(instance_id, guest)
                self._step("reserve")
                self._reserve(guest)
                self._step("define")
                self.instances[instance_id] = FakeInstance(
                    "shutoff", guest, base_image, vcpu, memory_mb, disk_gb, nics=nic_devices_for(guest)
                )
                if start:
                    self._step("start")
                    self.instances[instance_id].start()
            except BaseException as err:
                if self.dead:
                    # As the real one: a host that stopped answering mid-way cannot be cleaned up.
                    raise CleanupFailed(f"spawn instance {instance_id}: cleanup failed, what was made may "
                                        "remain") from err
                self.instances.pop(instance_id, None)
                self.disks.pop(instance_id, None)
                self.disk_content.pop(instance_id, None)
                self.seeds.pop(instance_id, None)
                self._unreserve(n.mac for n in guest.nics)
                raise

    def shut_down(self, instance_id: str, *, wait_seconds: float) -> bool:
        check_id(instance_id, "instance id")
        check_wait(wait_seconds)
        with self._lock:
            inst = self._existing(instance_id)
            self._step("shut_down")
            clean = self._obeys(instance_id, inst, wait_seconds)
            inst.status = "shutoff"
            inst.live_guest = None
            return clean

    def _obeys(self, instance_id: str, inst: FakeInstance, wait_seconds: float) -> bool:
        """Whether a shutdown ends without the hard power-off, as the real adapter decides: one
        shut off already does; a running guest that hears the button (not in ignores_acpi)
        does when given any time; a paused one never hears it."""
        if inst.status not in _FAKE_ACTIVE:
            return True
        return inst.status == "running" and wait_seconds > 0 and instance_id not in self.ignores_acpi

    def read_disk(self, instance_id: str, dest: int, *, max_bytes: int, progress: Progress | None = None) -> bool:
        check_id(instance_id, "instance id")
        self._step("read_disk")
        if instance_id not in self.disks:
            raise NotFound(f"instance {instance_id} has no disk on the hypervisor")
        content = self.disk_content.get(instance_id)
        if content is None:
            return False  # a disk without content, like the test driver's
        if len(content) > max_bytes:
            raise HostError(f"the disk of instance {instance_id} streamed {len(content)} bytes, more than the "
                            f"{max_bytes} bytes taken from it; stopped")
        os.write(dest, content)
        if progress is not None:
            progress(len(content), len(content))
        return True

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

    def reboot(self, instance_id: str, *, wait_seconds: float) -> bool:
        check_id(instance_id, "instance id")
        check_wait(wait_seconds)
        with self._lock:
            inst = self._existing(instance_id)
        # The step outside the lock: a slow host (slow_on) holds this reboot, not every call.
        self._step("reboot")
        with self._lock:
            inst = self._existing(instance_id)
            if inst.status != "running":
                raise Conflict(f"instance {instance_id} is not running")
            clean = self._obeys(instance_id, inst, wait_seconds)
            inst.start()  # shut down, then a new guest of its definition, as the real one
            return clean

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
            self.disk_content.pop(instance_id, None)
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


class FakeHosts:
    """FakeHypervisors by host name, for a HostPool in tests: `add(name, capacity)` makes
    one (a host record with a `fake://NAME` URI finds it); `kill(name)` makes every call
    to it raise HostUnreachable, `revive(name)` ends that."""

    def __init__(self, default: FakeHypervisor, default_name: str = "default"):
        self.fakes: dict[str, FakeHypervisor] = {default_name: default}

    def add(self, name: str, *, vcpus: int = 64, memory_mb: int = 256 * 1024, network: str = "cc-private",
            dhcp: bool = True) -> FakeHypervisor:
        fake = FakeHypervisor(network=network)
        fake.capacity = HostCapacity(vcpus=vcpus, memory_mb=memory_mb)
        fake.dhcp = dhcp
        self.fakes[name] = fake
        return fake

    def alias(self, name: str, *, of: str) -> FakeHypervisor:
        """Host `name` is the fake of host `of`: one libvirt reached under a second name."""
        self.fakes[name] = self.fakes[of]
        return self.fakes[of]

    def kill(self, name: str) -> None:
        self.fakes[name].dead = True

    def revive(self, name: str) -> None:
        self.fakes[name].dead = False

    def build(self, spec: HostSpec) -> Hypervisor:
        # A host's own name first, then the host its `fake://NAME` URI names: another record
        # with that URI reaches the same fake, as a second record of one libvirt would.
        fake = self.fakes.get(spec.name) or self.fakes.get(spec.uri.removeprefix("fake://"))
        if fake is None:
            if not spec.uri.startswith("fake://"):
                raise InvalidInput(f"no fake hypervisor host at {spec.uri}")
            fake = self.add(spec.name, network=spec.network)
        return fake
