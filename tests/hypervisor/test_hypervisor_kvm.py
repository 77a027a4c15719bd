"""The libvirt adapter on a real libvirtd with QEMU/KVM (see tests/fixtures/libvirtd.py)."""

import glob
import json
import os
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET

import pytest

from controller.errors import CommandError, HostError
from host_adapters import subp
from host_adapters.libvirt.driver import LibvirtHypervisor
from tests.fixtures.agent import AGENT
from tests.fixtures.libvirtd import SYSTEM_URI, assert_same_image, cleanup_hypervisor, in_netns, unique_prefix
from tests.hypervisor.test_hypervisor import HypervisorContract, guest_for, new_id

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

GiB = 1024**3
QEMU_LOG_DIR = "/var/log/libvirt/qemu"


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
def kvm(libvirt_dir_pool, libvirt_private_network, guest_virt, prefix):
    hv = LibvirtHypervisor(
        libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=prefix,
        network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
        virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode,
    )
    yield hv
    cleanup_hypervisor(hv)
    for log in glob.glob(f"{QEMU_LOG_DIR}/{glob.escape(prefix)}*.log"):
        os.unlink(log)


class TestKvmContract(HypervisorContract):
    memory_mb = 96
    answers_acpi = False  # a blank disk: no OS hears the power button
    streams_disks = True

    @pytest.fixture
    def hv(self, kvm):
        return kvm


def virsh(*args: str, ok_codes=(0,)):
    return subp.run(["virsh", "-c", SYSTEM_URI, *args], ok_codes=ok_codes)


def domstate(name: str) -> str:
    return virsh("domstate", name).stdout.strip()


def share_tags(name: str, *flags: str) -> list[str]:
    """Tags of the domain's shares: of the running guest, or with --inactive of its persistent definition."""
    dom = ET.fromstring(virsh("dumpxml", *flags, name).stdout)
    return sorted(fs.find("target").get("dir") for fs in dom.findall("devices/filesystem"))


def qemu_img_info(path: str) -> dict:
    return json.loads(subp.run(["qemu-img", "info", "--force-share", "--output=json", path]).stdout)


def pool_files(pool) -> list[str]:
    return sorted(os.listdir(pool.path))


def test_instance_lifecycle(kvm, prefix, libvirt_dir_pool, tmp_path):
    home = tmp_path / "alice"
    home.mkdir()
    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    name = prefix + instance_id
    guest = guest_for(kvm, [("alice", str(home))])
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=128, disk_gb=2, guest=guest)
    assert domstate(name) == "running"

    dom = ET.fromstring(virsh("dumpxml", "--inactive", name).stdout)
    [fs] = dom.findall("devices/filesystem")
    assert (fs.get("type"), fs.get("accessmode"), fs.find("driver").get("type")) == ("mount", "passthrough", "virtiofs")
    assert fs.find("target").get("dir") == "alice"
    assert fs.find("source").get("dir") == str(home)
    assert dom.findtext("uuid") == instance_id
    [nic] = dom.findall("devices/interface")
    assert nic.find("mac").get("address") == guest.nics[0].mac
    assert nic.find("source").get("network") == kvm.network
    # QEMU itself has no USB controller, no memory balloon and no option ROM on the NIC.
    pci = json.loads(virsh("qemu-monitor-command", name, '{"execute": "query-pci"}').stdout)["return"]
    devices = [d for bus in pci for d in bus["devices"]]
    assert [d["class_info"]["class"] for d in devices if d["class_info"]["class"] == 0x0C03] == []  # USB
    assert [d for d in devices if d["id"]["vendor"] == 0x1AF4 and d["id"]["device"] in (0x1002, 0x1045)] == []
    assert any(d["qdev_id"] == "net0" for d in devices)
    rom = json.loads(virsh("qemu-monitor-command", name, json.dumps(
        {"execute": "qom-get", "arguments": {"path": "/machine/peripheral/net0", "property": "romfile"}})).stdout)
    assert rom["return"] == ""
    # The reservation: the DHCP host in the network's definition (changed live, libvirt would
    # rebuild the network's firewall rules), the name in the running network's DNS.
    reserved = (guest.nics[0].mac, guest.nics[0].address, guest.hostname)
    assert reserved in dhcp_hosts("--inactive", kvm.network)
    assert reserved not in dhcp_hosts(kvm.network)
    assert dns_answer(kvm, guest.hostname) == guest.nics[0].address
    # The seed is a read-only virtio disk holding the guest's documents.
    from host_adapters.guests import seed as seeds

    seed_disk = [d for d in dom.findall("devices/disk") if d.find("target").get("dev") == "vdb"][0]
    assert seed_disk.find("readonly") is not None
    with open(seed_disk.find("source").get("file"), "rb") as f:
        assert seeds.read_iso(f.read()) == seeds.render(instance_id, guest)

    disk = kvm.describe(instance_id).disk_path
    assert os.path.dirname(disk) == libvirt_dir_pool.path
    info = qemu_img_info(disk)
    assert info["format"] == "qcow2"
    assert info["virtual-size"] == 2 * GiB
    assert info["backing-filename"] == os.path.join(libvirt_dir_pool.path, base)
    assert info["backing-filename-format"] == "qcow2"

    kvm.power_off(instance_id)
    assert domstate(name) == "shut off"
    kvm.power_on(instance_id)
    assert domstate(name) == "running"
    domid = virsh("domid", name).stdout.strip()
    # Issue 25: a blank disk runs no OS to hear the power button: forced after the wait, then
    # started (a new QEMU process; never a reset, which pulls the plug on a guest's disk).
    started = time.monotonic()
    assert kvm.reboot(instance_id, wait_seconds=2) is False
    assert 2 <= time.monotonic() - started < 30
    assert domstate(name) == "running"
    assert virsh("domid", name).stdout.strip() != domid

    kvm.destroy(instance_id)
    with pytest.raises(CommandError):
        virsh("dominfo", name)
    assert not os.path.exists(disk)
    assert reserved not in dhcp_hosts("--inactive", kvm.network)
    assert dns_answer(kvm, guest.hostname) is None


def dhcp_hosts(*args: str) -> set[tuple[str, str, str]]:
    net = ET.fromstring(virsh("net-dumpxml", *args).stdout)
    return {(h.get("mac"), h.get("ip"), h.get("name")) for h in net.findall("ip/dhcp/host")}


def dns_answer(kvm, name: str) -> str | None:
    """The address the network's dnsmasq (on its gateway address) gives `name`, or None."""
    from host_adapters.libvirt.network import gateway_of

    argv = in_netns(SYSTEM_URI, [sys.executable, "-m", "tests.fixtures.dns_query", gateway_of(str(kvm.subnet)), name])
    # dnsmasq reads its hosts again on the signal libvirt sends: bounded, it is at once.
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))).stdout
        if out.strip() or time.monotonic() > deadline:
            return out.strip() or None
        time.sleep(0.2)


def test_set_guest_on_a_running_instance_changes_the_next_boot(kvm, prefix, tmp_path):
    for user in ("alice", "bob"):
        (tmp_path / user).mkdir()
    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(kvm, [("alice", str(tmp_path / "alice"))])
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=96, disk_gb=1, guest=guest)
    kvm.set_guest(instance_id, guest_for(kvm, [("bob", str(tmp_path / "bob"))], nics=guest.nics))
    name = prefix + instance_id
    assert share_tags(name, "--inactive") == ["bob"]
    assert share_tags(name) == ["alice"]  # the running guest keeps what it booted with
    kvm.power_off(instance_id)
    kvm.power_on(instance_id)
    assert share_tags(name) == ["bob"]


def test_reboot_applies_a_share_removed_from_a_running_instance(kvm, prefix, tmp_path):
    shares = []
    for user in ("alice", "bob"):
        (tmp_path / user).mkdir()
        shares.append((user, str(tmp_path / user)))
    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    name = prefix + instance_id
    guest = guest_for(kvm, shares)
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=96, disk_gb=1, guest=guest)
    kvm.set_guest(instance_id, guest_for(kvm, shares[:1], nics=guest.nics))
    # bob keeps his home in the running guest until it boots again.
    assert share_tags(name) == ["alice", "bob"]
    assert [s.tag for s in kvm.describe(instance_id).live_shares] == ["alice", "bob"]
    domid = virsh("domid", name).stdout.strip()

    kvm.reboot(instance_id, wait_seconds=1)
    assert domstate(name) == "running"
    assert share_tags(name) == ["alice"]
    assert virsh("domid", name).stdout.strip() != domid  # a new QEMU process: a reset would keep the share
    info = kvm.describe(instance_id)
    assert info.live_shares == info.shares and [s.tag for s in info.shares] == ["alice"]


def test_a_paused_instance(kvm, prefix):
    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=96, disk_gb=1, guest=guest_for(kvm))
    virsh("suspend", prefix + instance_id)
    assert kvm.status(instance_id) == "paused"
    kvm.power_on(instance_id)
    assert domstate(prefix + instance_id) == "running"


@pytest.mark.parametrize("failure", ["memory", "base_image", "share_dir"])
def test_a_failed_spawn_leaves_no_domain_and_no_disk(kvm, prefix, libvirt_dir_pool, tmp_path, failure):
    base = kvm.create_base_image(new_id(), size_gb=1)
    before = pool_files(libvirt_dir_pool)
    instance_id = new_id()
    args = dict(base_image=base, vcpu=1, memory_mb=96, disk_gb=1, guest=guest_for(kvm, []))
    if failure == "memory":
        args["memory_mb"] = 64 * 1024 * 1024  # 64 TiB: QEMU cannot start
    elif failure == "base_image":
        args["base_image"] = prefix + "base-missing.qcow2"
    else:
        args["guest"] = guest_for(kvm, [("alice", str(tmp_path / "missing"))])
    with pytest.raises(HostError) as err:
        kvm.spawn(instance_id, **args)
    assert instance_id in err.value.message
    with pytest.raises(CommandError):
        virsh("dominfo", prefix + instance_id)
    assert pool_files(libvirt_dir_pool) == before
    assert instance_id not in kvm.list_instances()


def test_base_image_from_a_qcow2_file(kvm, libvirt_dir_pool, tmp_path):
    raw = tmp_path / "image.raw"
    with open(raw, "wb") as f:
        f.truncate(GiB)
        f.write(b"cloud controller test image\n" * 40000)
    source = tmp_path / "image.qcow2"
    subp.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(source)])
    seen = []
    image_id = new_id()
    base = kvm.create_base_image(image_id, size_gb=1, source=str(source), progress=lambda *a: seen.append(a))
    assert seen[-1] == (source.stat().st_size, source.stat().st_size)
    base_path = os.path.join(libvirt_dir_pool.path, base)
    # Published by a copy within the pool (libvirt has no rename): qemu-img rewrites the
    # qcow2 container, so the content is compared, strictly (size and allocation too).
    assert_same_image(source, base_path)
    assert qemu_img_info(base_path)["virtual-size"] == GiB
    assert qemu_img_info(base_path)["format"] == "qcow2" and "backing-filename" not in qemu_img_info(base_path)
    assert [p for p in pool_files(libvirt_dir_pool) if "-part-" in p] == []  # the temporary volume is gone

    instance_id = new_id()
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=96, disk_gb=2, guest=guest_for(kvm))
    assert kvm.status(instance_id) == "running"
    disk = kvm.describe(instance_id).disk_path
    # The guest sees the image's content on its disk.
    subp.run(["qemu-img", "compare", "--force-share", "-f", "raw", "-F", "qcow2", str(raw), disk])


def test_a_failed_upload_leaves_no_volume(kvm, libvirt_dir_pool, tmp_path):
    source = tmp_path / "image.qcow2"
    subp.run(["qemu-img", "create", "-q", "-f", "qcow2", str(source), "64M"])
    before = pool_files(libvirt_dir_pool)

    def interrupt(sent, total):
        raise KeyboardInterrupt

    image_id = new_id()
    with pytest.raises(KeyboardInterrupt):
        kvm.create_base_image(image_id, size_gb=1, source=str(source), progress=interrupt)
    assert image_id not in kvm.list_base_images()
    assert pool_files(libvirt_dir_pool) == before


def test_probe_guest_passes_with_what_starts_here_and_names_the_setting_otherwise(kvm, guest_virt, libvirt_dir_pool,
                                                                                 libvirt_private_network):
    kvm.probe_guest()  # guest_virt is what QEMU starts here
    kvm.check()
    if (guest_virt.virt_type, guest_virt.cpu_mode) == ("kvm", "host-passthrough"):
        return  # a head node: the default works, nothing to refuse
    # Here the default does not start (nested KVM aborts on -cpu host): check says what to set.
    default = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name,
                                network=libvirt_private_network.name, subnet=libvirt_private_network.subnet)
    with pytest.raises(HostError, match=r"cpu_mode|virt_type"):
        default.probe_guest()


def test_check_names_a_network_whose_subnet_differs(libvirt_dir_pool, libvirt_private_network):
    other = "10.214.0.0/24"
    hv = LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name,
                           network=libvirt_private_network.name, subnet=other)
    with pytest.raises(HostError, match="subnet"):
        hv.check()


def test_agent_init_creates_starts_and_autostarts_the_network_and_check_reports_it(
        tmp_path, libvirt_dir_pool, guest_virt):
    from controller.config import sandbox_values, write_config
    from tests.fixtures.libvirtd import remove_network

    name = f"cc-init-{uuid.uuid4().hex[:6]}"
    values = sandbox_values(str(tmp_path))
    values["controller"]["profile"] = "production"
    values["libvirt"].update(uri=libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name,
                             virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode)
    values["network"].update(name=name, subnet="10.213.250.0/24")
    (tmp_path / "home").mkdir(mode=0o755)
    from host_adapters.accounts.sysroot import make_sysroot

    make_sysroot(str(values["unix"]["root"]))
    config = tmp_path / "controller.ini"
    write_config(values, str(config))
    agent = [str(AGENT), "--config", str(config)]
    try:
        out = subp.run([*agent, "init"]).stdout
        assert f"network {name}: created" in out
        info = virsh("net-info", name).stdout
        assert "Active:         yes" in info and "Autostart:      yes" in info
        assert f"network {name}: present" in subp.run([*agent, "init"]).stdout
        checks = json.loads(subp.run([*agent, "--json", "check"], ok_codes=(0, 1)).stdout)["checks"]
        assert {c["name"]: c["ok"] for c in checks}["libvirt"] is True
        virsh("net-destroy", name)
        checks = json.loads(subp.run([*agent, "--json", "check"], ok_codes=(0, 1)).stdout)["checks"]
        [libvirt_check] = [c for c in checks if c["name"] == "libvirt"]
        assert not libvirt_check["ok"] and name in libvirt_check["detail"]
    finally:
        import libvirt

        conn = libvirt.open(libvirt_dir_pool.uri)
        remove_network(conn, name)
        conn.close()


def _table() -> set:
    """The NIC rules the test libvirtd's network namespace holds (nft_ruleset.parse)."""
    from host_adapters.network import nft_ruleset

    done = subp.run(in_netns(SYSTEM_URI, nft_ruleset.list_argv()), ok_codes=(0, 1))
    return nft_ruleset.parse(done.stdout) if done.returncode == 0 else set()


@pytest.mark.parametrize("isolated", [False, True])
def test_a_started_domain_has_its_nics_rules_in_the_hosts_table_and_no_nwfilter(kvm, prefix, isolated):
    """Issue 16, finding 8, and issue 28: the controller's nftables table filters what each NIC
    sends, keyed by the tap the domain names (no guest boots: the base disk is blank; what the
    rules let through is tests/hypervisor/test_nft_guest_firewall.py's)."""
    import dataclasses

    import libvirt

    from host_adapters.network.guest_firewall import NicRules, tap_name

    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(kvm)
    guest = dataclasses.replace(guest, nics=tuple(dataclasses.replace(n, isolated=isolated) for n in guest.nics))
    [nic] = guest.nics
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest)
    conn = libvirt.open(SYSTEM_URI)
    try:
        live = ET.fromstring(conn.lookupByName(prefix + instance_id).XMLDesc(0))
        tap = live.find("devices/interface/target").get("dev")
        assert tap == tap_name(nic.mac, kvm.tap_tag) and len(tap) <= 15
        assert live.find("devices/interface/filterref") is None
        assert not [b for b in conn.listAllNWFilterBindings(0)
                    if ET.fromstring(b.XMLDesc(0)).find("mac").get("address") == nic.mac]
        subnet = kvm.subnet
        wanted = (NicRules(tap=tap, mac=nic.mac, address=nic.address, gateway=nic.gateway, subnet=str(subnet))
                  if isolated else NicRules(tap=tap, mac=nic.mac, address=nic.address))
        assert wanted in _table()
        # The tap is in the namespace whose table holds its rules.
        subp.run(in_netns(SYSTEM_URI, ["ip", "link", "show", tap]))
        kvm.check()
        kvm.destroy(instance_id)
        assert not [r for r in _table() if r.tap == tap]
    finally:
        conn.close()


def test_a_table_deleted_by_hand_is_back_before_the_next_start_and_after_a_reconnection(kvm, prefix):
    """The rules of a domain started again (power-on) are written before its start, the table
    with them; the host check restores those of running domains after a new connection."""
    base = kvm.create_base_image(new_id(), size_gb=1)
    instance_id = new_id()
    guest = guest_for(kvm)
    [nic] = guest.nics
    kvm.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest)
    subp.run(in_netns(SYSTEM_URI, ["nft", "delete", "table", "bridge", "cloud_controller"]))
    assert _table() == set()
    kvm.power_off(instance_id)
    kvm.power_on(instance_id)
    assert [r.mac for r in _table() if r.mac == nic.mac] == [nic.mac]
    assert domstate(prefix + instance_id) == "running"
    kvm.check()  # the first on this connection: restores
    subp.run(in_netns(SYSTEM_URI, ["nft", "delete", "table", "bridge", "cloud_controller"]))
    kvm.check()  # the same connection, within a minute: nothing written
    assert _table() == set()
    kvm._restored_on = None  # as after a reconnection
    kvm.check()
    assert [r.mac for r in _table() if r.mac == nic.mac] == [nic.mac]
    kvm.destroy(instance_id)


# -- issue 16, finding 6: the default cpu_mode follows virt_type -------------------------------
def _qemu_hypervisor(libvirt_dir_pool, libvirt_private_network, prefix, **kwargs):
    return LibvirtHypervisor(libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=prefix,
                             network=libvirt_private_network.name, subnet=libvirt_private_network.subnet,
                             virt_type="qemu", **kwargs)


def test_virt_type_qemu_with_the_default_cpu_mode_is_healthy_and_gets_qemus_cpu(
        tmp_path, libvirt_dir_pool, libvirt_private_network, prefix):
    from controller.config import config_from_dict
    from controller.context import build_context
    from controller.monitoring.health import run_checks
    from controller.security.crypto import generate_key_file
    from controller.store import Store
    from host_adapters.factory import build_hypervisor, fake_adapters
    from tests.fixtures.api import config_values_for

    values = config_values_for(tmp_path)
    values["controller"]["profile"] = "production"
    values["libvirt"] = {"uri": libvirt_dir_pool.uri, "storage_pool": libvirt_dir_pool.name,
                         "domain_prefix": prefix, "virt_type": "qemu"}  # no cpu_mode: the default
    values["network"].update(name=libvirt_private_network.name, subnet=libvirt_private_network.subnet)
    config = config_from_dict(values)
    hv = build_hypervisor(config)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    adapters = fake_adapters()
    adapters.hypervisor = hv
    ctx = build_context(config, store=store, adapters=adapters)
    try:
        [libvirt_check] = [c for c in run_checks(ctx) if c["name"] == "libvirt"]
        assert libvirt_check == {"name": "libvirt", "ok": True, "detail": ""}
        # The domain it defines is the one the check passed: no <cpu>, QEMU's default model.
        base = hv.create_base_image(new_id(), size_gb=1)
        instance_id = new_id()
        hv.spawn(instance_id, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=guest_for(hv, []))
        assert domstate(prefix + instance_id) == "running"
        dom = ET.fromstring(virsh("dumpxml", "--inactive", prefix + instance_id).stdout)
        assert dom.get("type") == "qemu"
        cpu = dom.find("cpu")
        assert cpu is None or cpu.get("mode") not in ("host-passthrough", "host-model"), ET.tostring(cpu)
    finally:
        store.close()
        cleanup_hypervisor(hv)


def test_an_explicit_host_passthrough_with_virt_type_qemu_is_refused_by_check(
        libvirt_dir_pool, libvirt_private_network, prefix):
    hv = _qemu_hypervisor(libvirt_dir_pool, libvirt_private_network, prefix, cpu_mode="host-passthrough")
    assert hv.cpu_mode == "host-passthrough" and hv._cpu() == ("host-passthrough", None)  # never swapped
    with pytest.raises(HostError, match="cpu_mode host-passthrough is not supported with virt_type qemu"):
        hv.check()
    # A named model QEMU emulates is taken as given.
    named = _qemu_hypervisor(libvirt_dir_pool, libvirt_private_network, prefix, cpu_mode="qemu64")
    named.check()
    assert named._cpu() == ("custom", "qemu64")
