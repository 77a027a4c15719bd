"""A real guest, end to end (issue: instances a user can log in to; issue 18: the `cloud` command).

A Debian 12 cloud image built from Debian's packages (tests/fixtures/guest_image.py)
is registered with `cloud-agent image add --source`; alice (with a UNIX group
made through the API) and bob get volumes holding their SSH keys; alice
creates an instance with bob among its users. alice's side is the `cloud`
command over HTTP: `cloud login`, `cloud volume create`, `cloud server create
--wait` (which returns once the console says the guest is ready: its address is
not reachable from the test's namespace), `cloud server console` and `cloud
server ssh -- id`. Both log in over SSH at the
instance's private address as themselves, with their cluster uid, gid and
groups and their home mounted by virtiofs. modify-users then takes bob out,
and after a reboot he can no longer log in and his home is not in the guest.
Delete leaves no domain, disk, seed, kept console or reservation. Throughout, the
console endpoint (CONTRACT.md section 10) shows the guest's boot, and `ready` is
false right after the create and after the reboot, true once cloud-init finished.

Two hypervisor hosts (issue 10): the config's own (the test libvirtd) and a
second real libvirtd reached over `qemu+tcp://` (tests/fixtures/remote_libvirtd.py),
added with `cloud-agent host add` on a bridged network. The config's host is
disabled, so the guest is placed on the remote host: its image is uploaded
there over the connection at the first create, and it is reached by SSH at its
private address across the bridge. One boot serves both issues.

The guest runs under KVM where KVM can boot Linux here, else under software
emulation (nested KVM on these machines cannot), decided by a probe boot.
Its network lives in the test libvirtd's own network namespace
(tests/fixtures/libvirtd.py); ssh runs there through nsenter.
"""

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from falcon import testing

from tests.fixtures.agent import agent_ok
from tests.fixtures.api import PASSWORD, config_values_for, make_caller, new_context
from tests.fixtures.cloud import Cloud
from tests.fixtures.libvirtd import GuestVirt, assert_same_image, in_netns

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

BOOT_TIMEOUT = 420  # seconds from start to SSH; software emulation on 2 shared cores
KVM_PROBE_SECONDS = 25


def run(argv, *, check=True, timeout=120, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout, **kwargs)


# -- how guests boot here ---------------------------------------------------------------------
def _kvm_boots_linux(uri: str, pool, image: Path, tmp_path: Path) -> bool:
    """Boot the image under KVM for a while; True when its kernel starts printing."""
    import libvirt

    overlay = tmp_path / "probe.qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image), str(overlay)])
    console = tmp_path / "probe-console.log"
    xml = f"""<domain type='kvm'><name>cc-kvm-probe-{uuid.uuid4().hex[:6]}</name>
      <memory unit='MiB'>512</memory><vcpu>1</vcpu><os><type>hvm</type><boot dev='hd'/></os>
      <cpu mode='host-model'/><features><acpi/><apic/></features>
      <devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
      <source file='{overlay}'/><target dev='vda' bus='virtio'/></disk>
      <serial type='file'><source path='{console}'/></serial></devices></domain>"""
    conn = libvirt.open(uri)
    try:
        dom = conn.createXML(xml, 0)
    except libvirt.libvirtError:
        conn.close()
        return False
    try:
        deadline = time.monotonic() + KVM_PROBE_SECONDS
        while time.monotonic() < deadline:
            text = console.read_text(errors="replace") if console.exists() else ""
            if "Linux version" in text:
                return True
            if dom.state()[0] != libvirt.VIR_DOMAIN_RUNNING:  # nested KVM: paused on an internal error
                return False
            time.sleep(1)
        return False
    finally:
        try:
            dom.destroy()
        except libvirt.libvirtError:
            pass
        conn.close()


@pytest.fixture(scope="module")
def boot_virt(libvirtd_system, libvirt_dir_pool, guest_virt, guest_image, tmp_path_factory) -> GuestVirt:
    if os.environ.get("CC_TEST_VIRT_TYPE"):
        return guest_virt
    if guest_virt.virt_type == "kvm" and _kvm_boots_linux(
        libvirtd_system, libvirt_dir_pool, guest_image, tmp_path_factory.mktemp("kvm-probe")
    ):
        return guest_virt
    return GuestVirt("qemu", "qemu64")


# -- the service on real parts ------------------------------------------------------------------
@pytest.fixture
def service(tmp_path, libvirt_dir_pool, libvirt_private_network, boot_virt, sysroot, btrfs_home_root,
            remote_libvirtd):
    # Homes with btrfs quotas, so a write in the guest is seen counting against its volume.
    home_root = Path(btrfs_home_root)
    prefix = f"e2e{uuid.uuid4().hex[:6]}-"
    values = config_values_for(tmp_path)
    values["controller"]["profile"] = "production"
    values["libvirt"].update(uri=libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix=prefix,
                             virt_type=boot_virt.virt_type, cpu_mode=boot_virt.cpu_mode)
    values["network"].update(name=libvirt_private_network.name, subnet=libvirt_private_network.subnet)
    values["volumes"].update(home_root=str(home_root), quota_backend="btrfs")
    values["unix"]["root"] = sysroot
    config_path = tmp_path / "controller.ini"
    ctx = new_context(values, path=config_path, real_adapters=True)
    store = ctx.store
    from api.app import create_app

    app = create_app(ctx)
    with served(app) as base:
        yield ctx, testing.TestClient(app), config_path, base
    from controller.host_routing import hypervisor_of_host

    for hv in [ctx.adapters.hypervisor] + ([hypervisor_of_host(ctx, "remote")] if ctx.store.get_host("remote") else []):
        for instance_id in hv.list_instances():
            hv.destroy(instance_id)
        for image_id in hv.list_base_images():
            hv.delete_base_image(image_id)
    store.close()


@contextlib.contextmanager
def served(app):
    """The same app served over HTTP on a free loopback port, for the `cloud` command."""
    from waitress.server import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=8)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        server.close()
        thread.join(timeout=5)


def cloud_as(home: Path, uri: str, key: Path) -> Cloud:
    """`cloud` as a cluster user runs it, with an `ssh` first on PATH that reaches the guest
    network's namespace with the user's key."""
    bin_dir = home / "cloud-bin"
    bin_dir.mkdir()
    # The real ssh by its path: the stand-in is first on PATH, and nsenter looks ssh up there.
    ssh = in_netns(uri, [shutil.which("ssh"), "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                         "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"])
    (bin_dir / "ssh").write_text("#!/bin/sh\nexec " + " ".join(map(shlex.quote, ssh)) + ' "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    return Cloud(home, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})


def agent(config_path, *args) -> dict:
    return agent_ok(config_path, *args, timeout=600)


def ok(r, status=200):
    assert r.status_code == status, r.text
    return r.json["data"]


def push_key(home: Path, uid: int, gid: int, key_dir: Path, name: str) -> Path:
    """What a user does on a cluster login node: put a public key in the home volume."""
    key = key_dir / name
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)])
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "authorized_keys").write_text((key_dir / f"{name}.pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    for path in (ssh, ssh / "authorized_keys"):
        os.chown(path, uid, gid)
    return key


class Guest:
    def __init__(self, uri: str, address: str):
        self.uri, self.address = uri, address

    def ssh(self, key: Path, user: str, command: str, *, check=True, timeout=60):
        argv = ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                f"{user}@{self.address}", command]
        return run(in_netns(self.uri, argv), check=check, timeout=timeout)

    def wait_for_ssh(self, key: Path, user: str, console: str = "") -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        last = None
        while time.monotonic() < deadline:
            last = self.ssh(key, user, "true", check=False, timeout=30)
            if last.returncode == 0:
                return
            time.sleep(3)
        pytest.fail(f"no SSH as {user}@{self.address} after {BOOT_TIMEOUT} s: {last.stderr.strip()}\n{console}")


READY_TIMEOUT = 180  # seconds from SSH answering to cloud-init's final stage printing its marker


def console(client, caller, instance_id) -> dict:
    """GET .../console (CONTRACT.md section 10): {"console": text, "ready": bool}."""
    return ok(client.simulate_get(f"/v1/server-instance/{instance_id}/console", headers=caller.headers,
                                  query_string="bytes=1048576"))[0]


def wait_until_ready(client, caller, instance_id) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        got = console(client, caller, instance_id)
        if got["ready"]:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"ready still false {READY_TIMEOUT} s after SSH answered; the console ends:\n"
                        f"{got['console'][-3000:]}")
        time.sleep(2)


def test_users_log_in_to_a_real_guest_with_their_homes(service, guest_image, libvirt_dir_pool, remote_libvirtd,
                                                       tmp_path):
    ctx, client, config_path, base = service
    # The guest runs on the second host; the config's own is disabled.
    remote = remote_libvirtd
    uri = remote.uri
    # The test daemon listens on plain tcp on the loopback, in a namespace of its own.
    added = agent(config_path, "host", "add", "remote", "--uri", remote.uri, "--storage-pool", remote.pool,
                  "--network", remote.network, "--insecure")
    assert added["reachable"] is True and added["enabled"] is True and added["instances"] == 0
    assert agent(config_path, "host", "disable", "default")["enabled"] is False

    # The admin's part, with the agent.
    image = agent(config_path, "image", "add", "--name", "Debian 12", "--os-name", "debian", "--os-major", "12",
                  "--os-minor", "0", "--min-disk", "2", "--min-ram", "512", "--source", str(guest_image))
    flavor = agent(config_path, "flavor", "add", "--name", "e2e", "--memory", "1024", "--disk", "3", "--vcpu", "1")
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org", owner=alice)  # alice may grant her managed user access
    accounts = {}
    for name in ("alice", "bob"):
        agent(config_path, "account", "enable", f"{name}@example.org", "--username", name)
        accounts[name] = ctx.store.get_account_by_username(name)

    # The users' part, through the API.
    def post(caller, path, body):
        return ok(client.simulate_post(path, headers=caller.headers, json=body), 201)[0]

    # alice with the `cloud` command, over HTTP; bob through the API.
    volumes = {"bob": post(bob, "/v1/storage-volume", {"volume-size": 1, "volume-type": {"visibility": "cluster"}})}
    login_dir = tmp_path / "alice-login"
    login_dir.mkdir()
    keys = {}
    alice_cloud = cloud_as(login_dir, uri, tmp_path / "alice")  # her key is made once her home exists
    alice_cloud.ok("login", "--url", base, "--email", "alice@example.org", stdin=PASSWORD + "\n")
    volumes["alice"] = alice_cloud.ok("--json", "volume", "create", "--size", "1")
    assert volumes["alice"]["volume-size"] == 1
    for name, volume in volumes.items():
        account = accounts[name]
        keys[name] = push_key(Path(volume["volume-type"]["mount-point"]), account["uid"], account["gid"],
                              tmp_path, name)
    post(alice, "/v1/group", {"group-name": "alab", "group-members": ["alice"]})
    lab_gid = ctx.adapters.groups.gid("alab")
    creating = alice_cloud.start("--json", "server", "create", "--image", "Debian 12", "--flavor", "e2e",
                                 "--user", accounts["bob"]["uuid"], "--wait",
                                 "--timeout", str(BOOT_TIMEOUT + READY_TIMEOUT))
    try:
        deadline = time.monotonic() + 300
        while not (listed_now := ok(client.simulate_get("/v1/server-instance", headers=alice.headers))):
            assert creating.poll() is None, creating.communicate()
            assert time.monotonic() < deadline, "the create did not answer within 300 s"
            time.sleep(1)
        inst = listed_now[0]
        # Right after the create the guest is booting: not ready; its console shows the firmware.
        booting = console(client, alice, inst["id"])
        assert booting["ready"] is False
    except BaseException:
        creating.kill()
        raise
    assert inst["status"] == "running" and inst["private-ip"] and inst["hostname"]
    assert ctx.store.list_instances(visible_to=None, instance_id=inst["id"])[0]["host"] == "remote"
    base_volume = ctx.store.get_image(image["id"])["base_volume"]
    uploaded = Path(remote.pool_path) / base_volume
    assert_same_image(uploaded, Path(libvirt_dir_pool.path, base_volume))  # over the connection
    listed = {h["name"]: h for h in agent(config_path, "host", "list")["hosts"]}
    assert listed["remote"]["instances"] == 1 and listed["remote"]["allocated_memory_mb"] == 1024
    assert set(inst["users"]) == {accounts["alice"]["uuid"], accounts["bob"]["uuid"]}
    domain = ctx.config.libvirt.domain_prefix + inst["id"]
    guest = Guest(uri, inst["private-ip"])
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, inst["id"])["console"][-3000:])
    ssh_at = time.monotonic()
    # `cloud server create --wait` returns once the guest is ready (from here the guest's address
    # is not reachable: the console says when), and prints the created server.
    try:
        out, err = creating.communicate(timeout=READY_TIMEOUT)
    except subprocess.TimeoutExpired:
        creating.kill()
        pytest.fail(f"cloud server create --wait still waiting {READY_TIMEOUT} s after SSH answered")
    assert creating.returncode == 0, err
    assert json.loads(out)["id"] == inst["id"]
    print(f"cloud server create --wait returned {time.monotonic() - ssh_at:.1f} s after SSH answered")
    # Ready once cloud-init's final stage ran; the console shows the guest's boot, from the firmware on.
    booted = wait_until_ready(client, alice, inst["id"])
    assert booted["ready"] is True
    shown = alice_cloud.ok("--json", "server", "console", inst["hostname"])
    assert shown["ready"] is True and "Linux version" in shown["console"]
    # `cloud server ssh` logs her in as her own username at the private address.
    assert alice_cloud.ok("server", "ssh", inst["id"][:8], "--", "id", "-u").strip() == str(accounts["alice"]["uid"])
    assert "SeaBIOS" in booted["console"] and "Linux version" in booted["console"]
    assert f"instance {inst['id']} finished its boot setup" in booted["console"]
    # bob uses the instance but does not see it through the API (owners and their owners do):
    # its console is 404 for him, as the instance is.
    for path in (f"/v1/server-instance/{inst['id']}/console", f"/v1/server-instance/{inst['id']}"):
        assert client.simulate_get(path, headers=bob.headers).status_code == 404
    # The end only, with ?bytes.
    tail = ok(client.simulate_get(f"/v1/server-instance/{inst['id']}/console", headers=alice.headers,
                                  query_string="bytes=100"))[0]
    assert len(tail["console"].encode()) <= 100 and booted["console"].endswith(tail["console"][-20:])

    # alice: her cluster identity, her home by virtiofs, files owned by her on the head node.
    home = volumes["alice"]["volume-type"]["mount-point"]
    out = guest.ssh(keys["alice"], "alice", "id -u; id -g; id -Gn; hostname; echo $HOME").stdout.split("\n")
    assert out[0] == str(accounts["alice"]["uid"]) and out[1] == str(accounts["alice"]["gid"])
    assert "alab" in out[2].split()
    assert out[3] == inst["hostname"] and out[4] == home
    assert guest.ssh(keys["alice"], "alice", "getent group alab | cut -d: -f3").stdout.strip() == str(lab_gid)
    mount = guest.ssh(keys["alice"], "alice", f"findmnt -no FSTYPE,SOURCE,OPTIONS {home}").stdout.split()
    assert mount[0] == "virtiofs" and mount[1] == "alice"
    assert {"nosuid", "nodev"} <= set(mount[2].split(","))
    guest.ssh(keys["alice"], "alice", "echo written in the guest > ~/from-guest.txt")
    written = Path(home) / "from-guest.txt"
    assert written.read_text() == "written in the guest\n"
    assert (written.stat().st_uid, written.stat().st_gid) == (accounts["alice"]["uid"], accounts["alice"]["gid"])
    assert guest.ssh(keys["alice"], "alice", "sudo -n true", check=False).returncode != 0  # [guest] sudo = none
    # Writes in the guest count against the volume's quota (1 GB, btrfs): past it they fail.
    over = guest.ssh(keys["alice"], "alice", "dd if=/dev/zero of=~/big bs=1M count=1200 conv=fsync status=none",
                     check=False, timeout=600)
    assert over.returncode != 0 and "quota" in over.stderr.lower(), over.stderr
    assert 0 < (Path(home) / "big").stat().st_size < 1200 * 2**20
    guest.ssh(keys["alice"], "alice", "rm -f ~/big")

    # bob logs in too, with his own home.
    bob_home = volumes["bob"]["volume-type"]["mount-point"]
    out = guest.ssh(keys["bob"], "bob", "id -u; findmnt -no FSTYPE $HOME").stdout.split()
    assert out == [str(accounts["bob"]["uid"]), "virtiofs"]

    # alice takes bob out; after a reboot he cannot log in and his home is gone from the guest.
    ok(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=alice.headers,
                           json={"task": {"what": "modify-users", "how": "delete",
                                          "users": [accounts["bob"]["uuid"]]}}))
    ok(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=alice.headers,
                           json={"task": {"what": "reboot"}}))
    # A reboot clears ready; the console answers the new boot only.
    rebooting = console(client, alice, inst["id"])
    assert rebooting["ready"] is False and "finished its boot setup" not in rebooting["console"]
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, inst["id"])["console"][-3000:])
    assert "finished its boot setup" in wait_until_ready(client, alice, inst["id"])["console"]
    assert guest.ssh(keys["bob"], "bob", "true", check=False).returncode != 0
    assert guest.ssh(keys["alice"], "alice", f"findmnt {bob_home} || echo not-mounted",
                     check=False).stdout.strip() == "not-mounted"
    assert guest.ssh(keys["alice"], "alice", "getent passwd bob || echo no-bob", check=False).stdout.strip() == "no-bob"
    assert (Path(bob_home) / ".ssh" / "authorized_keys").exists()  # his data stays on the head node

    # Delete leaves no domain, disk, seed, console file or reservation.
    pool_files = lambda: sorted(os.listdir(remote.pool_path))  # noqa: E731
    assert any(inst["id"] in f for f in pool_files())
    ok(client.simulate_delete(f"/v1/server-instance/{inst['id']}", headers=alice.headers))
    assert run(["virsh", "-c", uri, "dominfo", domain], check=False).returncode != 0
    assert not any(inst["id"] in f for f in pool_files())
    # No reservation anywhere: the bridged network has none, and the NAT network of the config's host got none.
    net = ET.fromstring(run(["virsh", "-c", libvirt_dir_pool.uri, "net-dumpxml",
                             ctx.config.network.name]).stdout)
    assert inst["private-ip"] not in {h.get("ip") for h in net.findall("ip/dhcp/host")}
