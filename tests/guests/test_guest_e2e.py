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
console endpoint (the console, docs/api.md) shows the guest's boot, and `ready` is
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

import json
import os
import shlex
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fixtures.api import PASSWORD, make_caller
from tests.fixtures.cloud import Cloud
from tests.fixtures.guest_e2e import (  # noqa: F401 (boot_virt, service: fixtures)
    BOOT_TIMEOUT, READY_TIMEOUT, Guest, agent, boot_virt, console, ok, push_key, run, service, wait_until_ready)
from tests.fixtures.libvirtd import assert_same_image, in_netns

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

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
    for which in ("--inactive", None):  # the definition keeps DHCP hosts; both keep DNS names
        net = ET.fromstring(run(["virsh", "-c", libvirt_dir_pool.uri, "net-dumpxml",
                                 *filter(None, [which]), ctx.config.network.name]).stdout)
        assert inst["private-ip"] not in {h.get("ip") for h in [*net.findall("ip/dhcp/host"), *net.findall("dns/host")]}
