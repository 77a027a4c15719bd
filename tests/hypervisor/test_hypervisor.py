import inspect
import ipaddress
import os
import struct
import time
import uuid
import xml.etree.ElementTree as ET

import pytest

from controller.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.guests.guest import GuestSpec, GuestUser, Nic, Reservation, Share
from host_adapters.network.guest_firewall import NicRules, tap_name
from host_adapters.fake_hypervisor import FakeHypervisor
from host_adapters.hypervisor import (
    STATUSES,
    Hypervisor,
    InstanceInfo,
)
from host_adapters.libvirt.driver import LibvirtHypervisor
from host_adapters.libvirt.statuses import status_of
from host_adapters.libvirt.volume_io import InProcessVolumeIO
from tests.fixtures.interfaces import assert_offers_the_interface
from tests.fixtures.libvirtd import TEST_POOL, TEST_URI, cleanup_hypervisor, unique_prefix

GiB = 1024**3


def new_id() -> str:
    return str(uuid.uuid4())


_ADDRESSES = iter(range(2, 60000))


def nic_for(hv) -> Nic:
    """A private NIC on the adapter's network with a fresh MAC and an address of its subnet."""
    n = next(_ADDRESSES)
    subnet = getattr(hv, "subnet", ipaddress.IPv4Network("10.213.0.0/16"))
    address = subnet.network_address + 2 + n % (subnet.num_addresses - 3)
    return Nic(mac=f"52:54:00:7f:{n >> 8:02x}:{n & 255:02x}", address=str(address), prefix=subnet.prefixlen,
               gateway=str(subnet.network_address + 1), network=hv.network)


def guest_for(hv, shares=(), *, nics=None, hostname=None) -> GuestSpec:
    """A guest whose users are the share tags, each with its home (the share's directory) mounted."""
    if isinstance(shares, (str, bytes)):
        raise InvalidInput("shares must be (tag, dir) pairs")
    users = []
    for i, item in enumerate(shares):
        try:
            tag, path = item
        except (TypeError, ValueError):
            raise InvalidInput(f"invalid share {item!r}") from None
        users.append(GuestUser(username=tag, uid=10000 + i, gid=10000 + i, home=path, mounted=True))
    nics = (nic_for(hv),) if nics is None else tuple(nics)
    hostname = hostname or (f"vm-{nics[0].mac.replace(':', '')}" if nics else "vm-test")
    return GuestSpec(hostname=hostname, users=tuple(users), nics=nics)


def qcow2_header(*, virtual_size: int = GiB, backing_offset: int = 0, incompatible: int = 0) -> bytes:
    """The start of a qcow2 v3 file: enough for the adapter's checks of a source image."""
    head = struct.pack(">4sIQIIQ", b"QFI\xfb", 3, backing_offset, 0, 16, virtual_size)
    return head.ljust(72, b"\0") + struct.pack(">Q", incompatible) + b"\0" * 24


class HypervisorContract:
    """What every Hypervisor does; subclasses provide an `hv` fixture (emptied at teardown)."""

    memory_mb = 64
    # Whether a spawned guest answers the ACPI power button (the fake and the test driver
    # stand one in; a real domain on a blank disk runs no OS to answer it, so it is powered off).
    answers_acpi = True
    # Whether read_disk hands over the disk's content (a real libvirtd streams it; the fake and
    # the test driver keep none).
    streams_disks = False

    @pytest.fixture
    def base_image(self, hv) -> str:
        return hv.create_base_image(new_id(), size_gb=1)

    @pytest.fixture
    def shares(self, tmp_path) -> list[tuple[str, str]]:
        result = []
        for user in ("alice", "bob"):
            (tmp_path / user).mkdir()
            result.append((user, str(tmp_path / user)))
        return result

    def spawn(self, hv, base_image, shares=(), **overrides) -> str:
        instance_id = overrides.pop("instance_id", new_id())
        if "shares" in overrides:
            shares = overrides.pop("shares")
        guest = overrides.pop("guest") if "guest" in overrides else guest_for(hv, shares)
        if isinstance(guest, GuestSpec):
            self.__dict__.setdefault("nics", {})[instance_id] = guest.nics
        args = dict(base_image=base_image, vcpu=1, memory_mb=self.memory_mb, disk_gb=1, guest=guest)
        hv.spawn(instance_id, **{**args, **overrides})
        return instance_id

    def guest_of(self, hv, instance_id, shares):
        """A guest with these shares and the NICs the instance was spawned with."""
        return guest_for(hv, shares, nics=self.__dict__.get("nics", {}).get(instance_id, ()))

    def assert_gone(self, hv, instance_id):
        assert instance_id not in hv.list_instances()
        assert hv.status(instance_id) == "error"
        with pytest.raises(NotFound):
            hv.describe(instance_id)

    def assert_orphan_disk_listed_and_destroyed(self, hv, instance_id):
        """A disk whose domain is gone: listed, described as undefined and in error, then destroyed."""
        assert instance_id in hv.list_instances()
        info = hv.describe(instance_id)
        assert (info.defined, info.status, info.shares, info.live_shares) == (False, "error", (), None)
        assert info.disk_path
        hv.destroy(instance_id)
        self.assert_gone(hv, instance_id)

    def test_check(self, hv):
        hv.check()

    def test_host_capacity_is_what_the_host_has(self, hv):
        capacity = hv.host_capacity()
        assert capacity.vcpus >= 1 and capacity.memory_mb >= 1
        assert hv.host_capacity() == capacity

    def test_identity_names_the_libvirt_and_its_pool_and_stays(self, hv):
        identity = hv.identity()
        assert identity.pool_uuid and identity == hv.identity() and identity.same_as(hv.identity())
        other = type(identity)(host_uuid="00000000-0000-4000-8000-000000000001",
                               pool_uuid="00000000-0000-4000-8000-000000000002")
        assert not identity.same_as(other)

    def test_statuses_gives_every_instance_of_the_host_in_one_call(self, hv, base_image):
        running, stopped, gone = (self.spawn(hv, base_image) for _ in range(3))
        hv.power_off(stopped)
        hv.destroy(gone)
        found = hv.statuses()
        assert found[running] == "running" and found[stopped] == "shutoff"
        assert gone not in found
        # Only this host's instances: every key is an instance id the host's names map back.
        assert set(found) <= set(hv.list_instances())
        assert all(hv.status(i) == s for i, s in found.items())

    def test_spawn_runs_the_instance_with_its_shares_and_disk(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares)
        assert hv.status(instance_id) == "running"
        assert instance_id in hv.list_instances()
        info = hv.describe(instance_id)
        assert isinstance(info, InstanceInfo)
        assert info.instance_id == instance_id
        assert info.status == "running"
        assert info.defined is True
        assert info.shares == tuple(Share(tag, path) for tag, path in sorted(shares))
        assert info.live_shares == info.shares
        assert info.disk_path and info.disk_path.endswith(".qcow2")

    def test_spawn_of_an_existing_instance_is_a_conflict_and_keeps_it(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares)
        with pytest.raises(Conflict):
            self.spawn(hv, base_image, instance_id=instance_id)
        assert hv.status(instance_id) == "running"
        assert hv.describe(instance_id).shares == tuple(Share(*s) for s in sorted(shares))

    def test_spawn_on_a_missing_base_image_leaves_nothing(self, hv, shares):
        instance_id = new_id()
        with pytest.raises(HostError, match="base image"):
            self.spawn(hv, "cc-base-missing.qcow2", shares, instance_id=instance_id)
        self.assert_gone(hv, instance_id)

    def test_spawn_with_a_disk_smaller_than_the_base_image_is_refused(self, hv):
        base = hv.create_base_image(new_id(), size_gb=2)
        instance_id = new_id()
        with pytest.raises(InvalidInput):
            self.spawn(hv, base, instance_id=instance_id, disk_gb=1)
        self.assert_gone(hv, instance_id)

    @pytest.mark.parametrize(
        "overrides",
        [
            {"instance_id": "../etc"},
            {"instance_id": ""},
            {"base_image": "../x.qcow2"},
            {"vcpu": 0},
            {"memory_mb": "64"},
            {"disk_gb": True},
            {"shares": [("Bad;tag", "/home/x")]},
            {"shares": [("alice", "home/alice")]},
            {"shares": [("alice", "/home/../etc")]},
            {"shares": [("alice", "/home/a"), ("alice", "/home/b")]},
            {"shares": [("alice",)]},
            {"shares": "alice"},
            {"guest": "not a guest"},
            {"guest": None},
        ],
    )
    def test_spawn_refuses_bad_input_before_touching_the_host(self, hv, base_image, overrides):
        overrides = dict(overrides)  # parametrize shares one dict between the subclasses
        base_image = overrides.pop("base_image", base_image)
        before = hv.list_instances()
        with pytest.raises(InvalidInput):
            self.spawn(hv, base_image, **overrides)
        assert hv.list_instances() == before

    def test_power_off_and_on_are_idempotent(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        hv.power_off(instance_id)
        assert hv.status(instance_id) == "shutoff"
        hv.power_off(instance_id)
        assert hv.status(instance_id) == "shutoff"
        hv.power_on(instance_id)
        assert hv.status(instance_id) == "running"
        hv.power_on(instance_id)
        assert hv.status(instance_id) == "running"

    def test_reboot_restarts_a_running_instance_and_refuses_a_stopped_one(self, hv, base_image, shares):
        """Issue 25: clean first (True: the guest shut down when asked), forced after the wait
        (False: a real guest on a blank disk hears no power button)."""
        instance_id = self.spawn(hv, base_image, shares)
        assert hv.reboot(instance_id, wait_seconds=3) is self.answers_acpi
        assert hv.status(instance_id) == "running"
        assert hv.describe(instance_id).live_shares == tuple(Share(*s) for s in sorted(shares))
        hv.power_off(instance_id)
        with pytest.raises(Conflict, match="not running"):
            hv.reboot(instance_id, wait_seconds=5)
        assert hv.status(instance_id) == "shutoff"

    @pytest.mark.parametrize("method", ["power_on", "power_off", "reboot", "shut_down"])
    def test_power_actions_on_a_missing_instance_are_not_found(self, hv, method):
        waits = {"wait_seconds": 5} if method in ("reboot", "shut_down") else {}
        with pytest.raises(NotFound):
            getattr(hv, method)(new_id(), **waits)

    def test_a_missing_instance(self, hv):
        instance_id = new_id()
        self.assert_gone(hv, instance_id)
        with pytest.raises(NotFound):
            hv.set_guest(instance_id, self.guest_of(hv, instance_id, []))
        hv.destroy(instance_id)

    def test_set_shares_replaces_them_and_keeps_the_instance_running(self, hv, base_image, shares, tmp_path):
        instance_id = self.spawn(hv, base_image, shares[:1])
        (tmp_path / "carol").mkdir()
        wanted = [shares[1], ("carol", str(tmp_path / "carol"))]
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, wanted))
        info = hv.describe(instance_id)
        assert info.shares == tuple(Share(*s) for s in sorted(wanted))
        # Live where the hypervisor can hot-plug shares, else at the next start.
        assert info.live_shares in (info.shares, (Share(*shares[0]),))
        assert hv.status(instance_id) == "running"
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, []))
        assert hv.describe(instance_id).shares == ()

    def test_reboot_applies_shares_removed_from_a_running_instance(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares[1:]))
        hv.reboot(instance_id, wait_seconds=5)
        info = hv.describe(instance_id)
        assert info.status == "running"
        assert info.live_shares == info.shares == (Share(*shares[1]),)
        hv.reboot(instance_id, wait_seconds=5)
        assert hv.describe(instance_id).live_shares == (Share(*shares[1]),)

    def test_power_on_applies_shares_set_while_running(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares[:1])
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares))
        hv.power_off(instance_id)
        assert hv.describe(instance_id).live_shares is None
        hv.power_on(instance_id)
        assert hv.describe(instance_id).live_shares == tuple(Share(*s) for s in sorted(shares))

    def test_set_shares_on_a_stopped_instance(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image)
        hv.power_off(instance_id)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares))
        info = hv.describe(instance_id)
        assert info.shares == tuple(Share(*s) for s in sorted(shares))
        assert (info.status, info.live_shares) == ("shutoff", None)

    def test_set_shares_refuses_bad_input(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        with pytest.raises(InvalidInput):
            hv.set_guest(instance_id, self.guest_of(hv, instance_id, [("root;x", "/home/x")]))
        assert hv.describe(instance_id).shares == ()

    def test_destroy_removes_domain_and_disk_and_may_be_repeated(self, hv, base_image):
        running = self.spawn(hv, base_image)
        stopped = self.spawn(hv, base_image)
        hv.power_off(stopped)
        for instance_id in (running, stopped):
            hv.destroy(instance_id)
            self.assert_gone(hv, instance_id)
            hv.destroy(instance_id)

    def test_base_image_lifecycle(self, hv):
        image_id = new_id()
        name = hv.create_base_image(image_id, size_gb=1)
        assert image_id in name and name.endswith(".qcow2")
        assert image_id in hv.list_base_images()
        with pytest.raises(Conflict):
            hv.create_base_image(image_id, size_gb=1)
        hv.delete_base_image(image_id)
        assert image_id not in hv.list_base_images()
        hv.delete_base_image(image_id)

    def test_a_base_image_in_use_cannot_be_deleted(self, hv):
        image_id = new_id()
        base = hv.create_base_image(image_id, size_gb=1)
        instance_id = self.spawn(hv, base)
        with pytest.raises(Conflict, match="in use"):
            hv.delete_base_image(image_id)
        hv.destroy(instance_id)
        hv.delete_base_image(image_id)
        assert image_id not in hv.list_base_images()

    @pytest.mark.parametrize(
        "content",
        [
            b"\0" * 4096,  # raw
            qcow2_header(backing_offset=512),
            qcow2_header(incompatible=1 << 2),  # external data file
            qcow2_header(virtual_size=GiB + 1),
            b"QFI",
        ],
    )
    def test_create_base_image_refuses_an_unfit_source(self, hv, tmp_path, content):
        source = tmp_path / "image.qcow2"
        source.write_bytes(content)
        image_id = new_id()
        with pytest.raises(InvalidInput):
            hv.create_base_image(image_id, size_gb=1, source=str(source))
        assert image_id not in hv.list_base_images()

    def test_create_base_image_from_a_missing_source(self, hv, tmp_path):
        with pytest.raises(InvalidInput, match="cannot read"):
            hv.create_base_image(new_id(), size_gb=1, source=str(tmp_path / "nope"))

    def test_create_base_image_refuses_a_symlink_source(self, hv, tmp_path):
        """Issue 8, finding 8: the path could be pointed elsewhere between check and upload."""
        target = tmp_path / "image.qcow2"
        target.write_bytes(qcow2_header())
        link = tmp_path / "link.qcow2"
        link.symlink_to(target)
        image_id = new_id()
        with pytest.raises(InvalidInput, match="symbolic link"):
            hv.create_base_image(image_id, size_gb=1, source=str(link))
        assert image_id not in hv.list_base_images()

    @pytest.mark.parametrize("special", ["/dev/null", "fifo", "directory"])
    def test_create_base_image_refuses_what_is_not_a_regular_file(self, hv, tmp_path, special):
        if special == "fifo":
            special = str(tmp_path / "fifo")
            os.mkfifo(special)  # opening it must not wait for a writer
        elif special == "directory":
            special = str(tmp_path)
        image_id = new_id()
        with pytest.raises(InvalidInput):
            hv.create_base_image(image_id, size_gb=1, source=special)
        assert image_id not in hv.list_base_images()

    @pytest.mark.parametrize("size_gb", [0, -1, "1", None])
    def test_create_base_image_refuses_a_bad_size(self, hv, size_gb):
        with pytest.raises(InvalidInput):
            hv.create_base_image(new_id(), size_gb=size_gb)

    def test_list_instances_holds_only_this_adapters_instances(self, hv, base_image):
        ids = sorted(self.spawn(hv, base_image) for _ in range(2))
        assert hv.list_instances() == ids

    def test_each_nic_carries_its_network_filter(self, hv, base_image):
        """Issue 16, finding 8: a NIC sends only from its own MAC and address (its rules,
        cloud-controller-clean), and with isolation only to its gateway on the private subnet."""
        import dataclasses

        from host_adapters.libvirt.xml import FilterRef

        instance_id = self.spawn(hv, base_image)
        guest = self.guest_of(hv, instance_id, [])
        [nic] = guest.nics
        assert [n.filter for n in hv.describe(instance_id).nics] == [FilterRef("cloud-controller-clean", (("IP", nic.address),))]
        isolated = dataclasses.replace(guest, nics=(dataclasses.replace(nic, isolated=True),))
        hv.set_guest(instance_id, isolated)
        [found] = hv.describe(instance_id).nics
        assert found.filter.name == "cloud-controller-isolated"
        assert dict(found.filter.parameters)["GATEWAY"] == nic.gateway

    def test_shut_down_leaves_the_instance_shut_off(self, hv, base_image):
        """Issue 19 (drain): the guest is asked to shut down, then powered off; an instance
        already shut off stays so; a missing domain is NotFound."""
        instance_id = self.spawn(hv, base_image)
        assert hv.shut_down(instance_id, wait_seconds=5) is self.answers_acpi  # False: powered off after the wait
        assert hv.status(instance_id) == "shutoff" and hv.describe(instance_id).live_shares is None
        assert hv.shut_down(instance_id, wait_seconds=5) is True and hv.status(instance_id) == "shutoff"
        with pytest.raises(NotFound):
            hv.shut_down(new_id(), wait_seconds=5)
        with pytest.raises(InvalidInput):
            hv.shut_down(instance_id, wait_seconds=-1)
        # Issue 25: no wait ([guest] shutdown_timeout_seconds = 0) is a hard power-off at once.
        hv.power_on(instance_id)
        assert hv.shut_down(instance_id, wait_seconds=0) is False and hv.status(instance_id) == "shutoff"
        with pytest.raises(InvalidInput):
            hv.reboot(instance_id, wait_seconds=-1)

    def test_receive_defines_the_moved_instance_started_only_when_asked(self, hv, base_image, shares):
        """Issue 19 (drain): where the sending host keeps no disk content (read_disk False), a
        new overlay; the domain, seed and reservations as spawn makes them; all or nothing."""
        from host_adapters.guests import seed as seeds
        from host_adapters.guests.guest import reservations_for

        stopped, running = new_id(), new_id()
        guests = {i: guest_for(hv, shares) for i in (stopped, running)}
        args = dict(base_image=base_image, vcpu=1, memory_mb=self.memory_mb, disk_gb=1)
        hv.receive(stopped, **args, guest=guests[stopped], disk=None, start=False)
        hv.receive(running, **args, guest=guests[running], disk=None, start=True)
        assert hv.status(stopped) == "shutoff" and hv.status(running) == "running"
        for i, guest in guests.items():
            info = hv.describe(i)
            assert info.defined and info.disk_path and info.shares == tuple(Share(*s) for s in sorted(shares))
            assert info.seed == seeds.render(i, guest)
            assert info.reservations == tuple(reservations_for(guest))
        with pytest.raises(Conflict):
            hv.receive(stopped, **args, guest=guests[stopped], disk=None, start=False)
        assert hv.status(stopped) == "shutoff"
        # The fake and the test driver keep no disk content (no streams): nothing is written;
        # a real libvirtd streams the overlay.
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            assert hv.read_disk(stopped, fd, max_bytes=1 << 30) is self.streams_disks
            with pytest.raises(NotFound):
                hv.read_disk(new_id(), fd, max_bytes=1 << 30)
        finally:
            os.close(fd)
        broken = new_id()
        with pytest.raises(HostError, match="receive instance .*base image"):
            hv.receive(broken, **dict(args, base_image="cc-base-missing.qcow2"), guest=guest_for(hv), disk=None,
                       start=True)
        self.assert_gone(hv, broken)

# --- the fake ----------------------------------------------------------------


class TestFakeHypervisor(HypervisorContract):
    @pytest.fixture
    def hv(self):
        return FakeHypervisor()

    @pytest.mark.parametrize("step", ["spawn", "volume", "define", "start"])
    def test_a_failing_spawn_step_leaves_nothing(self, hv, base_image, step):
        hv.fail_on = {step: HostError(f"{step} failed")}
        instance_id = new_id()
        with pytest.raises(HostError, match=f"{step} failed"):
            self.spawn(hv, base_image, instance_id=instance_id)
        self.assert_gone(hv, instance_id)

    def test_fail_on_applies_until_removed(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        hv.fail_on["power_off"] = HostUnavailable("libvirt is down")
        for _ in range(2):
            with pytest.raises(HostUnavailable):
                hv.power_off(instance_id)
        assert hv.status(instance_id) == "running"
        del hv.fail_on["power_off"]
        hv.power_off(instance_id)
        assert hv.status(instance_id) == "shutoff"

    def test_check_can_be_made_to_fail(self, hv):
        hv.fail_on["check"] = HostUnavailable("down")
        with pytest.raises(HostUnavailable):
            hv.check()

    def test_tests_may_set_any_status(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        hv.instances[instance_id].status = "paused"
        assert hv.status(instance_id) == "paused"
        with pytest.raises(Conflict):
            hv.reboot(instance_id, wait_seconds=5)
        hv.power_on(instance_id)
        assert hv.status(instance_id) == "running"

    def test_like_qemu_a_running_guest_keeps_its_shares_until_it_starts_again(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares[:1]))
        info = hv.describe(instance_id)
        assert info.live_shares == tuple(Share(*s) for s in shares)
        assert info.shares == (Share(*shares[0]),)
        # Resuming a paused guest is no start either.
        hv.instances[instance_id].status = "paused"
        assert hv.describe(instance_id).live_shares == tuple(Share(*s) for s in shares)
        hv.power_on(instance_id)
        assert hv.describe(instance_id).live_shares == tuple(Share(*s) for s in shares)
        hv.instances[instance_id].status = "crashed"
        assert hv.describe(instance_id).live_shares is None
        hv.power_on(instance_id)
        assert hv.describe(instance_id).live_shares == (Share(*shares[0]),)

    def test_an_orphan_disk_is_listed_and_destroyed(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        del hv.instances[instance_id]
        self.assert_orphan_disk_listed_and_destroyed(hv, instance_id)

    def test_create_base_image_from_a_source_reports_progress(self, hv, tmp_path):
        source = tmp_path / "image.qcow2"
        source.write_bytes(qcow2_header())
        seen = []
        image_id = new_id()
        hv.create_base_image(image_id, size_gb=1, source=str(source), progress=lambda *a: seen.append(a))
        assert image_id in hv.list_base_images()
        assert seen[-1] == (source.stat().st_size, source.stat().st_size)


# --- libvirt's test driver ---------------------------------------------------


def _libvirt_error(code: int, domain: int, message: str = "boom"):
    import libvirt

    err = libvirt.libvirtError(message)
    err.err = (code, domain, message, 2, None, None, None, -1, -1)
    return err


class TestLibvirtTestDriver(HypervisorContract):
    @pytest.fixture
    def hv(self, libvirt_test_driver):
        return libvirt_test_driver

    @staticmethod
    def conn():
        import libvirt

        return libvirt.open(TEST_URI)

    def domain(self, hv, instance_id):
        return self.conn().lookupByName(hv._names.domain(instance_id))

    def test_domain_definition(self, hv, base_image, shares):
        instance_id = self.spawn(hv, base_image, shares, vcpu=2, memory_mb=96)
        dom = ET.fromstring(self.domain(hv, instance_id).XMLDesc(0))
        assert dom.findtext("uuid") == instance_id
        assert dom.find("memory").text == str(96 * 1024) and dom.find("memory").get("unit") == "KiB"
        assert dom.findtext("vcpu") == "2"
        disk, seed = dom.findall("devices/disk")
        assert disk.find("source").get("file") == hv.describe(instance_id).disk_path
        assert seed.find("source").get("file").endswith(f"seed-{instance_id}.iso")
        assert (seed.find("target").get("bus"), seed.find("driver").get("type")) == ("virtio", "raw")
        assert seed.find("readonly") is not None
        [nic] = dom.findall("devices/interface")
        assert nic.get("type") == "network" and nic.find("source").get("network") == hv.network
        assert nic.find("mac").get("address") == self.guest_of(hv, instance_id, []).nics[0].mac
        assert nic.find("model").get("type") == "virtio"
        found = {
            (fs.get("type"), fs.get("accessmode"), fs.find("driver").get("type"), fs.find("target").get("dir"),
             fs.find("source").get("dir"))
            for fs in dom.findall("devices/filesystem")
        }
        assert found == {("mount", "passthrough", "virtiofs", tag, path) for tag, path in shares}
        # virtiofsd maps the guest's RAM: it must be shared.
        assert dom.find("memoryBacking/access").get("mode") == "shared"
        assert dom.find("memoryBacking/source").get("type") == "memfd"
        assert self.domain(hv, instance_id).isPersistent()

    def test_disk_is_an_overlay_on_the_base_image(self, hv, base_image):
        instance_id = self.spawn(hv, base_image, disk_gb=3)
        pool = self.conn().storagePoolLookupByName(TEST_POOL)
        disk = pool.storageVolLookupByName(hv._names.disk(instance_id))
        vol = ET.fromstring(disk.XMLDesc(0))
        assert vol.findtext("backingStore/path") == pool.storageVolLookupByName(base_image).path()
        assert vol.find("target/format").get("type") == "qcow2"
        assert int(vol.findtext("capacity")) == 3 * GiB

    @pytest.mark.parametrize("broken", ["defineXML", "create"])
    def test_a_failing_spawn_step_leaves_nothing(self, hv, base_image, monkeypatch, broken):
        import libvirt

        def fail(*args, **kwargs):
            raise _libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, "no room")

        owner = libvirt.virConnect if broken == "defineXML" else libvirt.virDomain
        monkeypatch.setattr(owner, broken, fail)
        instance_id = new_id()
        with pytest.raises(HostError, match="no room") as err:
            self.spawn(hv, base_image, instance_id=instance_id)
        assert f"spawn instance {instance_id}" in err.value.message
        monkeypatch.undo()
        self.assert_gone(hv, instance_id)

    def test_a_failing_cleanup_is_reported(self, hv, base_image, monkeypatch):
        import libvirt

        def fail(*args, **kwargs):
            raise _libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, "stuck")

        monkeypatch.setattr(libvirt.virDomain, "create", fail)
        monkeypatch.setattr(libvirt.virStorageVol, "delete", fail)
        instance_id = new_id()
        with pytest.raises(HostError, match="cleanup failed") as err:
            self.spawn(hv, base_image, instance_id=instance_id)
        monkeypatch.undo()
        # The domain was removed; the disk the cleanup could not delete is reported and listed.
        assert hv.describe(instance_id).defined is False
        hv.destroy(instance_id)
        self.assert_gone(hv, instance_id)

    @staticmethod
    def lose_connection_once(monkeypatch, name: str) -> list:
        """virDomain.<name> loses the connection the first time it is called, then works; its calls."""
        import libvirt

        real = getattr(libvirt.virDomain, name)
        calls = []

        def once_lost(self_, *args):
            calls.append(1)
            if len(calls) == 1:
                raise _libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, "connection reset")
            return real(self_, *args)

        monkeypatch.setattr(libvirt.virDomain, name, once_lost)
        return calls

    def test_a_lost_connection_is_opened_again_once(self, hv, base_image, monkeypatch):
        instance_id = self.spawn(hv, base_image)
        first = hv._conn
        self.lose_connection_once(monkeypatch, "state")
        # describe() asks the domain itself (status() answers from the lifecycle events).
        assert hv.describe(instance_id).status == "running"
        assert hv._conn is not first

    def test_a_connection_lost_during_spawn_is_cleaned_up_on_a_new_one(self, hv, base_image, monkeypatch):
        import libvirt

        def lost(*args):
            raise _libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, "connection reset")

        monkeypatch.setattr(libvirt.virConnect, "defineXML", lost)
        instance_id = new_id()
        first = hv._conn
        with pytest.raises(HostUnavailable, match="lost the connection"):
            self.spawn(hv, base_image, instance_id=instance_id)
        assert hv._conn is not first
        self.assert_gone(hv, instance_id)

    def test_a_connection_lost_twice_is_host_unavailable(self, hv, base_image, monkeypatch):
        import libvirt

        instance_id = self.spawn(hv, base_image)

        def lost(*args):
            raise _libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, "connection reset")

        monkeypatch.setattr(libvirt.virDomain, "state", lost)
        with pytest.raises(HostUnavailable, match="lost the connection"):
            hv.describe(instance_id)

    def test_other_libvirt_errors_become_host_errors(self, hv, base_image, monkeypatch):
        import libvirt

        instance_id = self.spawn(hv, base_image)

        def fail(*args):
            raise _libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, "monitor gone")

        monkeypatch.setattr(libvirt.virDomain, "shutdown", fail)
        with pytest.raises(HostError, match=f"reboot instance {instance_id}: monitor gone") as err:
            hv.reboot(instance_id, wait_seconds=5)
        assert type(err.value) is HostError

    @staticmethod
    def live_tags(dom) -> list[str]:
        filesystems = ET.fromstring(dom.XMLDesc(0)).findall("devices/filesystem")
        return sorted(fs.find("target").get("dir") for fs in filesystems)

    @staticmethod
    def spy(monkeypatch, calls: list, *names):
        import libvirt

        for name in names:
            real = getattr(libvirt.virDomain, name)

            def call(self_, *args, _name=name, _real=real):
                calls.append(_name)
                return _real(self_, *args)

            monkeypatch.setattr(libvirt.virDomain, name, call)

    def test_reboot_shuts_down_and_starts_a_guest_that_still_has_removed_shares(self, hv, base_image, shares,
                                                                                 monkeypatch):
        instance_id = self.spawn(hv, base_image, shares)
        dom = self.domain(hv, instance_id)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares[:1]))
        # The test driver, like QEMU for 9p, cannot detach live: the guest keeps bob.
        assert self.live_tags(dom) == ["alice", "bob"]
        assert [s.tag for s in hv.describe(instance_id).live_shares] == ["alice", "bob"]
        calls = []
        self.spy(monkeypatch, calls, "reset", "shutdown", "destroy", "create")
        assert hv.reboot(instance_id, wait_seconds=5) is True  # the test driver's guest obeys at once
        assert calls == ["shutdown", "create"]
        assert self.live_tags(dom) == ["alice"]
        assert hv.status(instance_id) == "running"
        calls.clear()
        hv.reboot(instance_id, wait_seconds=5)
        assert calls == ["shutdown", "create"]  # never a reset: a pulled plug for the guest's disk
        calls.clear()
        assert hv.reboot(instance_id, wait_seconds=0) is False  # 0: powered off at once, not asked
        assert calls == ["destroy", "create"] and hv.status(instance_id) == "running"

    def test_a_failed_start_in_the_power_cycle_leaves_it_shut_off(self, hv, base_image, shares, monkeypatch):
        import libvirt

        instance_id = self.spawn(hv, base_image, shares)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, []))

        def fail(*args):
            raise _libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, "no memory")

        monkeypatch.setattr(libvirt.virDomain, "create", fail)
        with pytest.raises(HostError, match="cannot start it again .*no memory"):
            hv.reboot(instance_id, wait_seconds=5)
        assert hv.status(instance_id) == "shutoff"

    def test_a_connection_lost_in_the_power_cycle_finishes_it_on_a_new_one(self, hv, base_image, shares, monkeypatch):
        instance_id = self.spawn(hv, base_image, shares)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares[1:]))
        calls = self.lose_connection_once(monkeypatch, "create")
        hv.reboot(instance_id, wait_seconds=5)
        assert len(calls) == 2
        info = hv.describe(instance_id)
        assert info.status == "running" and info.live_shares == info.shares == (Share(*shares[1]),)

    def test_paused_instance(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        self.domain(hv, instance_id).suspend()
        assert hv.status(instance_id) == "paused"
        with pytest.raises(Conflict):
            hv.reboot(instance_id, wait_seconds=5)
        hv.power_on(instance_id)
        assert hv.status(instance_id) == "running"
        self.domain(hv, instance_id).suspend()
        hv.power_off(instance_id)
        assert hv.status(instance_id) == "shutoff"
        # Issue 25: a paused guest runs no code to hear the power button: powered off at once.
        hv.power_on(instance_id)
        self.domain(hv, instance_id).suspend()
        started = time.monotonic()
        assert hv.shut_down(instance_id, wait_seconds=60) is False
        assert time.monotonic() - started < 10 and hv.status(instance_id) == "shutoff"

    def test_an_orphan_disk_is_listed_and_destroyed(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        dom = self.domain(hv, instance_id)
        dom.destroy()
        dom.undefine()
        self.assert_orphan_disk_listed_and_destroyed(hv, instance_id)

    def test_a_checked_source_stands_in_as_a_blank_disk_on_the_test_driver(self, hv, tmp_path):
        # The test driver has no upload streams (the sandbox boots no real guest).
        source = tmp_path / "image.qcow2"
        source.write_bytes(qcow2_header())
        image_id = new_id()
        name = hv.create_base_image(image_id, size_gb=1, source=str(source))
        assert image_id in hv.list_base_images()
        pool = self.conn().storagePoolLookupByName(TEST_POOL)
        assert pool.storageVolLookupByName(name).info()[1] == GiB

    def test_a_stand_in_base_disk_is_made_on_first_use(self, libvirt_test_driver):
        # The sandbox: an image the agent added in another process has no disk in this one.
        hv = libvirt_test_driver
        hv._stand_in = True
        instance_id = self.spawn(hv, hv._names.base(new_id()))
        assert hv.status(instance_id) == "running"
        assert len(hv.list_base_images()) == 1

    def test_the_seed_is_written_and_read_back(self, hv, base_image, shares):
        from host_adapters.guests import seed as seeds

        instance_id = self.spawn(hv, base_image, shares)
        guest = self.guest_of(hv, instance_id, shares)
        assert hv.describe(instance_id).seed == seeds.render(instance_id, guest)
        hv.set_guest(instance_id, self.guest_of(hv, instance_id, shares[:1]))
        assert hv.describe(instance_id).seed == seeds.render(instance_id, self.guest_of(hv, instance_id, shares[:1]))

    def test_reservations_follow_the_guest_and_go_with_it(self, hv, base_image):
        instance_id = self.spawn(hv, base_image)
        guest = self.guest_of(hv, instance_id, [])
        [nic] = guest.nics
        expected = (Reservation(mac=nic.mac, address=nic.address, hostname=guest.hostname),)
        assert hv.describe(instance_id).reservations == expected
        assert [r.mac for r in hv.list_reservations()] == [nic.mac]
        hv.destroy(instance_id)
        assert hv.list_reservations() == []

    def test_a_reservation_without_its_dns_name_is_found_and_repaired(self, hv, base_image):
        # The name is what other guests resolve (dnsmasq answers a DHCP host's name only
        # while it holds a lease, and guests take their address from the seed).
        import libvirt

        instance_id = self.spawn(hv, base_image)
        guest = self.guest_of(hv, instance_id, [])
        [nic] = guest.nics
        net = libvirt.open(TEST_URI).networkLookupByName(hv.network)
        names = ET.fromstring(net.XMLDesc(0)).findall("dns/host")
        assert [(h.get("ip"), [n.text for n in h.findall("hostname")]) for h in names
                if h.get("ip") == nic.address] == [(nic.address, [guest.hostname])]
        net.update(libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE, libvirt.VIR_NETWORK_SECTION_DNS_HOST, -1,
                   f"<host ip='{nic.address}'><hostname>{guest.hostname}</hostname></host>",
                   libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG)
        assert hv.describe(instance_id).reservations == (Reservation(mac=nic.mac, address=nic.address),)
        hv.set_guest(instance_id, guest)
        assert hv.describe(instance_id).reservations == (
            Reservation(mac=nic.mac, address=nic.address, hostname=guest.hostname),)
        hv.destroy(instance_id)
        assert not [h for h in ET.fromstring(net.XMLDesc(0)).findall("dns/host") if h.get("ip") == nic.address]


class _RecordedNetwork:
    """A started, defined network of a QEMU libvirtd, as far as NetworkPart._update_hosts asks."""

    def __init__(self, definition: str, served: str):
        self.documents = {0: served, 1: definition}  # 1: VIR_NETWORK_XML_INACTIVE
        self.updates = []

    def XMLDesc(self, flags):
        return self.documents[flags]

    def isActive(self):
        return True

    def isPersistent(self):
        return True

    def bridgeName(self):
        return "virbr9"

    def update(self, command, section, index, xml, flags):
        self.updates.append((command, section, ET.fromstring(xml).attrib, flags))


def test_a_reservation_changes_dhcp_hosts_in_the_definition_and_dns_names_live_too(monkeypatch):
    """A DHCP host changed live makes libvirt rebuild the network's firewall rules (0.45 s,
    the serial step of a burst): it goes into the definition only; the DNS name, which
    dnsmasq answers, live and in the definition. Names go first and come last."""
    import libvirt
    from types import SimpleNamespace

    old = "<host mac='52:54:00:00:00:01' ip='10.9.0.5' name='vm-old'/>"
    definition = (f"<network><name>n</name><ip address='10.9.0.1' netmask='255.255.0.0'><dhcp>{old}"
                  "</dhcp></ip></network>")
    served = ("<network><name>n</name><dns><host ip='10.9.0.5'><hostname>vm-old</hostname></host></dns>"
              f"<ip address='10.9.0.1' netmask='255.255.0.0'><dhcp>{old}</dhcp></ip></network>")
    net = _RecordedNetwork(definition, served)
    conn = SimpleNamespace(getType=lambda: "QEMU", networkLookupByName=lambda name: net)
    hv = LibvirtHypervisor(TEST_URI, storage_pool=TEST_POOL, domain_prefix=unique_prefix())
    hv._update_hosts(conn, add=[Reservation(mac="52:54:00:00:00:02", address="10.9.0.5", hostname="vm-new")],
                     remove=["52:54:00:00:00:01"])
    config, live = libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG, libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE
    add, delete = libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE
    dns, dhcp = libvirt.VIR_NETWORK_SECTION_DNS_HOST, libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST
    assert net.updates == [
        (delete, dns, {"ip": "10.9.0.5"}, config | live),
        (delete, dhcp, {"mac": "52:54:00:00:00:01", "name": "vm-old", "ip": "10.9.0.5"}, config),
        (add, dhcp, {"mac": "52:54:00:00:00:02", "name": "vm-new", "ip": "10.9.0.5"}, config),
        (add, dns, {"ip": "10.9.0.5"}, config | live),
    ]


def test_check_of_an_unreachable_hypervisor_is_host_unavailable(tmp_path):
    hv = LibvirtHypervisor(f"test://{tmp_path}/missing.xml", storage_pool=TEST_POOL)
    with pytest.raises(HostUnavailable, match="cannot connect to libvirt"):
        hv.check()


def test_check_of_a_missing_pool_is_host_unavailable():
    hv = LibvirtHypervisor(TEST_URI, storage_pool="no-such-pool", domain_prefix=unique_prefix())
    with pytest.raises(HostUnavailable, match="no-such-pool"):
        hv.check()
    with pytest.raises(HostUnavailable):
        hv.list_instances()


@pytest.mark.parametrize("prefix", ["", "a/b", "-x", 5])
def test_bad_domain_prefix(prefix):
    with pytest.raises(InvalidInput):
        LibvirtHypervisor(TEST_URI, storage_pool=TEST_POOL, domain_prefix=prefix)


def test_adapters_with_other_prefixes_do_not_see_each_other(libvirt_test_driver):
    other = LibvirtHypervisor(TEST_URI, storage_pool=TEST_POOL, domain_prefix=unique_prefix(),
                              network=libvirt_test_driver.network, volume_io=InProcessVolumeIO())
    try:
        base = other.create_base_image(new_id(), size_gb=1)
        instance_id = new_id()
        other.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest_for(other, nics=()))
        assert libvirt_test_driver.list_instances() == []
        assert libvirt_test_driver.list_base_images() == []
        assert libvirt_test_driver.status(instance_id) == "error"
    finally:
        cleanup_hypervisor(other)


def _state(name):
    import libvirt

    return getattr(libvirt, name)


@pytest.mark.parametrize(
    "state, reason, expected",
    [
        ("VIR_DOMAIN_NOSTATE", 0, "building"),
        ("VIR_DOMAIN_RUNNING", 1, "running"),
        ("VIR_DOMAIN_BLOCKED", 0, "running"),
        ("VIR_DOMAIN_PAUSED", "VIR_DOMAIN_PAUSED_USER", "paused"),
        ("VIR_DOMAIN_PAUSED", "VIR_DOMAIN_PAUSED_STARTING_UP", "building"),
        ("VIR_DOMAIN_PMSUSPENDED", 0, "paused"),
        ("VIR_DOMAIN_SHUTDOWN", 1, "shutoff"),
        ("VIR_DOMAIN_SHUTOFF", "VIR_DOMAIN_SHUTOFF_DESTROYED", "shutoff"),
        ("VIR_DOMAIN_SHUTOFF", "VIR_DOMAIN_SHUTOFF_CRASHED", "crashed"),
        ("VIR_DOMAIN_SHUTOFF", "VIR_DOMAIN_SHUTOFF_FAILED", "error"),
        ("VIR_DOMAIN_CRASHED", 0, "crashed"),
    ],
)
def test_status_of_libvirt_states(state, reason, expected):
    reason = _state(reason) if isinstance(reason, str) else reason
    assert status_of(_state(state), reason) == expected
    assert expected in STATUSES


def test_status_of_an_unknown_state_is_error():
    assert status_of(99, 0) == "error"


# --- signatures --------------------------------------------------------------


@pytest.mark.parametrize("impl", [LibvirtHypervisor, FakeHypervisor])
def test_public_methods_match_the_interface(impl):
    assert_offers_the_interface(impl, Hypervisor)


def test_constructor_signatures():
    assert list(inspect.signature(LibvirtHypervisor).parameters) == [
        "uri", "storage_pool", "domain_prefix", "network", "subnet", "virt_type", "cpu_mode", "volume_io",
        "stand_in_base_images", "connect_timeout", "status_max_age", "lean_definitions", "host_files",
        "firewall",
    ]
    assert str(inspect.signature(FakeHypervisor)) == "(*, domain_prefix: str = 'cc-', network: str = 'cc-private')"


# -- issue 28: the guests' NIC rules (host_adapters/network/guest_firewall.py), on the test driver ----------
def _rules_for(hv, guest) -> set:
    from host_adapters.network.guest_firewall import NicRules, tap_name

    return {NicRules(tap=tap_name(n.mac, hv.tap_tag), mac=n.mac, address=n.address,
                     gateway=n.gateway if n.isolated else None,
                     subnet=str(ipaddress.IPv4Interface(f"{n.address}/{n.prefix}").network) if n.isolated else None)
            for n in guest.nics}


def test_a_spawn_writes_its_nics_rules_before_the_start_and_a_destroy_removes_them(libvirt_test_driver):
    import libvirt

    from host_adapters.network.fake_guest_firewall import FakeGuestFirewall

    hv = libvirt_test_driver
    fw = hv.firewall
    assert isinstance(fw, FakeGuestFirewall)
    base = hv.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(hv)
    seen = []
    real_allow = fw.allow

    def allow(nics):
        try:
            seen.append(libvirt.open(TEST_URI).lookupByName(hv._names.domain(instance_id)).isActive())
        except libvirt.libvirtError:
            seen.append("no domain")
        real_allow(nics)

    fw.allow = allow
    hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest)
    assert seen == ["no domain"]  # before the domain is defined, so before it starts
    assert fw.rules == _rules_for(hv, guest)
    dom = ET.fromstring(libvirt.open(TEST_URI).lookupByName(hv._names.domain(instance_id)).XMLDesc(0))
    [nic] = guest.nics
    assert dom.find("devices/interface/target").get("dev") == f"cc-{hv.tap_tag}-{nic.mac.replace(':', '')[6:]}"
    assert dom.find("devices/interface/filterref") is None
    hv.destroy(instance_id)
    assert fw.rules == set() and fw.calls[-1][0] == "forget"


def test_a_spawn_whose_rules_cannot_be_written_leaves_nothing(libvirt_test_driver):
    hv = libvirt_test_driver
    base = hv.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(hv)
    hv.firewall.fail = HostUnavailable("cannot write the guests' network rules on this machine: nft is not installed")
    with pytest.raises(HostUnavailable, match="nft is not installed"):
        hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest)
    hv.firewall.fail = None
    assert instance_id not in hv.list_instances()
    assert hv._reservations(libvirt_conn(), {guest.nics[0].mac}) == []
    assert hv.firewall.rules == set()


def libvirt_conn():
    import libvirt

    return libvirt.open(TEST_URI)


def _spawned(hv) -> tuple[str, GuestSpec]:
    """A new instance of a blank base image on `hv`, started; its id and guest."""
    base = hv.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(hv)
    hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest)
    return instance_id, guest


def test_power_on_and_reboot_write_the_rules_the_domain_keeps_before_they_start(libvirt_test_driver):
    hv = libvirt_test_driver
    instance_id, guest = _spawned(hv)
    hv.firewall.rules.clear()  # as a host that lost its table
    hv.power_off(instance_id)
    hv.power_on(instance_id)
    assert hv.firewall.rules == _rules_for(hv, guest)
    hv.firewall.rules.clear()
    hv.reboot(instance_id, wait_seconds=0)
    assert hv.firewall.rules == _rules_for(hv, guest)
    # A start that cannot write them does not start the guest.
    hv.power_off(instance_id)
    hv.firewall.fail = HostError("nft failed")
    with pytest.raises(HostError, match="nft failed"):
        hv.power_on(instance_id)
    hv.firewall.fail = None
    assert hv.status(instance_id) == "shutoff"


def test_set_guest_replaces_the_rules_and_describe_reads_them_from_the_domain(libvirt_test_driver):
    import dataclasses

    from host_adapters.libvirt.nic_filters import filter_for

    hv = libvirt_test_driver
    instance_id, guest = _spawned(hv)
    isolated = dataclasses.replace(guest, nics=tuple(dataclasses.replace(n, isolated=True) for n in guest.nics))
    hv.set_guest(instance_id, isolated)
    assert hv.firewall.rules == _rules_for(hv, isolated)
    [nic] = hv.describe(instance_id).nics
    assert nic.filter == filter_for(isolated.nics[0])
    hv.set_guest(instance_id, guest)
    assert hv.firewall.rules == _rules_for(hv, guest)


def test_a_removal_whose_rules_cannot_be_removed_is_logged_not_raised(libvirt_test_driver, caplog):
    hv = libvirt_test_driver
    base = hv.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest_for(hv))
    hv.firewall.fail = HostError("nft failed")
    hv.destroy(instance_id)
    hv.firewall.fail = None
    assert instance_id not in hv.list_instances()
    assert "were not removed" in caplog.text and "nft failed" in caplog.text


def test_lean_definitions_keep_their_nics_rules(libvirt_test_driver):
    """The sandbox's lean domains (test_driver.lean_domain) too: describe() and starts read them."""
    from host_adapters.libvirt.nic_filters import filter_for

    hv = LibvirtHypervisor(TEST_URI, storage_pool=TEST_POOL, domain_prefix=libvirt_test_driver._names.prefix,
                           network=libvirt_test_driver.network, lean_definitions=True,
                           stand_in_base_images=True, volume_io=InProcessVolumeIO())
    instance_id, guest = _spawned(hv)
    [nic] = hv.describe(instance_id).nics
    assert nic.filter == filter_for(guest.nics[0])
    hv.firewall.rules.clear()
    hv.power_off(instance_id)
    hv.power_on(instance_id)
    assert hv.firewall.rules == _rules_for(hv, guest)
    hv.destroy(instance_id)


def test_the_check_restores_every_running_domains_rules_once_per_connection_and_then_every_minute(monkeypatch):
    """After a new connection (libvirtd or the host restarted: the table may be gone) and every
    RESTORE_SECONDS; only our domains (the prefix), only running ones (listed so)."""
    from host_adapters.network.fake_guest_firewall import FakeGuestFirewall
    from host_adapters.libvirt import firewall as firewall_part
    from host_adapters.libvirt import xml as dx

    hv = LibvirtHypervisor("qemu+ssh://node1/system", storage_pool=TEST_POOL, domain_prefix="cc-",
                           firewall=FakeGuestFirewall())
    guest = guest_for(hv)
    ours = dx.Domain(name="cc-1", uuid="u", memory_mb=64, vcpu=1, interfaces=hv._interfaces(guest),
                     nic_rules=hv._nic_rules(guest)).to_xml()
    other = dx.Domain(name="other", uuid="v", memory_mb=64, vcpu=1, interfaces=hv._interfaces(guest_for(hv)),
                      nic_rules=hv._nic_rules(guest_for(hv))).to_xml()
    listed = []

    class Dom:
        def __init__(self, name, xml):
            self._name, self.xml = name, xml

        def name(self):
            return self._name

        def XMLDesc(self, flags):
            return self.xml

    class Conn:
        def getType(self):
            return "QEMU"

        def listAllDomains(self, flags):
            listed.append(flags)
            return [Dom("cc-1", ours), Dom("other", other)]

    import libvirt

    now = [1000.0]
    monkeypatch.setattr(firewall_part.time, "monotonic", lambda: now[0])
    conn = Conn()
    hv._restore_rules(conn)
    assert hv.firewall.rules == _rules_for(hv, guest)
    assert listed == [libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE]
    hv.firewall.rules.clear()
    hv._restore_rules(conn)
    assert hv.firewall.rules == set()  # the same connection, within the minute
    now[0] += firewall_part.RESTORE_SECONDS
    hv._restore_rules(conn)
    assert hv.firewall.rules == _rules_for(hv, guest)
    hv.firewall.rules.clear()
    hv._restore_rules(Conn())  # a new connection
    assert hv.firewall.rules == _rules_for(hv, guest)


class _RestoreDom:
    """A running domain as the restore reads it: its persistent definition (flag
    VIR_DOMAIN_XML_INACTIVE) and its live one, which set_guest does not change."""

    def __init__(self, name, persistent, live=None):
        self._name, self.persistent, self.live = name, persistent, live or persistent

    def name(self):
        return self._name

    def XMLDesc(self, flags):
        import libvirt

        return self.persistent if flags & libvirt.VIR_DOMAIN_XML_INACTIVE else self.live


class _RestoreConn:
    def __init__(self, *doms):
        self.doms = list(doms)

    def getType(self):
        return "QEMU"

    def listAllDomains(self, flags):
        return list(self.doms)


def _restore_host():
    from host_adapters.network.fake_guest_firewall import FakeGuestFirewall

    return LibvirtHypervisor("qemu+ssh://node1/system", storage_pool=TEST_POOL, domain_prefix="cc-",
                             firewall=FakeGuestFirewall())


def _domain_xml(hv, name, guest, *, bridge=None):
    from host_adapters.libvirt import xml as dx

    xml = dx.Domain(name=name, uuid=name, memory_mb=64, vcpu=1, interfaces=hv._interfaces(guest),
                    nic_rules=hv._nic_rules(guest)).to_xml()
    if bridge:  # as a running domain's NIC names its network's bridge
        xml = xml.replace("<source network=", f"<source bridge='{bridge}' network=")
    return xml


def test_the_restore_removes_the_elements_no_running_domain_of_this_host_claims():
    """A removal that failed, or a guest stopped outside the controller, left elements: the
    restore removes those of this host's taps, but not a start's in flight nor another host's."""
    hv = _restore_host()
    running, stopped, starting = guest_for(hv), guest_for(hv), guest_for(hv)
    other_host = NicRules(tap=tap_name("52:54:00:aa:bb:cc", "fffff"), mac="52:54:00:aa:bb:cc", address="10.9.9.9")
    hv.firewall.rules |= _rules_for(hv, stopped) | _rules_for(hv, starting) | {other_host}
    with hv._writing(tuple(_rules_for(hv, starting))):
        hv._restore_rules(_RestoreConn(_RestoreDom("cc-1", _domain_xml(hv, "cc-1", running))))
    assert hv.firewall.rules == _rules_for(hv, running) | _rules_for(hv, starting) | {other_host}


def test_the_restore_writes_the_rules_of_the_persistent_definition_that_set_guest_changed():
    """set_guest replaced a running guest's rules (an address changed): the live definition
    still holds the old ones, which the restore must not write back."""
    import dataclasses

    hv = _restore_host()
    old = guest_for(hv)
    new = dataclasses.replace(old, nics=(dataclasses.replace(old.nics[0], address="10.213.77.7"),))
    dom = _RestoreDom("cc-1", _domain_xml(hv, "cc-1", new), live=_domain_xml(hv, "cc-1", old))
    hv.firewall.rules |= _rules_for(hv, new)
    hv._restore_rules(_RestoreConn(dom))
    assert hv.firewall.rules == _rules_for(hv, new)


def test_the_check_fails_while_a_running_guests_tap_is_not_where_its_rules_are():
    hv = _restore_host()
    guest = guest_for(hv)
    conn = _RestoreConn(_RestoreDom("cc-1", _domain_xml(hv, "cc-1", guest)))
    hv.firewall.missing_taps = {r.tap for r in _rules_for(hv, guest)}
    with pytest.raises(HostUnavailable, match="pass unfiltered"):
        hv._restore_rules(conn)
    hv.firewall.missing_taps = set()
    hv._restore_rules(conn)  # not remembered as restored: tried again at once


def test_the_check_fails_on_a_host_without_the_libvirt_hook_and_seals_the_guests_bridges():
    hv = _restore_host()
    guest = guest_for(hv)
    conn = _RestoreConn(_RestoreDom("cc-1", _domain_xml(hv, "cc-1", guest), live=_domain_xml(hv, "cc-1", guest,
                                                                                             bridge="virbr7")))
    hv.firewall.hook = False
    with pytest.raises(HostUnavailable, match="libvirt hook"):
        hv._restore_rules(conn)
    assert hv.firewall.sealed == {"virbr7"}
    hv.firewall.hook = True
    hv._restore_rules(conn)


def test_a_start_whose_taps_are_not_where_the_rules_went_is_stopped(libvirt_test_driver):
    hv = libvirt_test_driver
    instance_id, guest = _spawned(hv)
    hv.power_off(instance_id)
    hv.firewall.missing_taps = {r.tap for r in _rules_for(hv, guest)}
    with pytest.raises(HostError, match="where its network rules were written"):
        hv.power_on(instance_id)
    assert hv.status(instance_id) == "shutoff"
    # A create likewise leaves nothing behind.
    base = hv.create_base_image(new_id(), size_gb=1)
    other, other_guest = new_id(), guest_for(hv)
    hv.firewall.missing_taps |= {r.tap for r in _rules_for(hv, other_guest)}
    with pytest.raises(HostError, match="where its network rules were written"):
        hv.spawn(other, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=other_guest)
    assert other not in hv.list_instances()
    assert not _rules_for(hv, other_guest) & hv.firewall.rules
