"""One real guest through its whole life: users log in with their homes, clean power tasks,
drain to another host, the host killed for good and the guest evacuated, its lease's end.

Each boot of a guest costs about a minute under software emulation, so every check
that needs a real guest is made on this one (six boots in all: the create, a reboot
right after the first login, a reboot after a user is taken out, a power-off and
power-on, the move of a drain, the rebuild of an evacuation).

Two hypervisor hosts: the config's own (the test libvirtd, NAT network) and a second
real libvirtd reached over `qemu+tcp://` (tests/fixtures/remote_libvirtd.py), added
with `cloud-agent host add` on a bridged network.

1. The users. A Debian 12 cloud image built from Debian's packages
   (tests/fixtures/guest_image.py) is registered with `cloud-agent image add
   --source`; alice (with a UNIX group made through the API) and bob get volumes
   holding their SSH keys. alice uses the `cloud` command over HTTP: `cloud login`,
   `cloud volume create`, `cloud server create --wait` with bob among the users (it
   returns once the console says the guest is ready), `cloud server console` and
   `cloud server ssh -- id`. Both log in over SSH at the instance's private address
   as themselves, with their cluster uid, gid and groups and their home mounted by
   virtiofs; writes count against the home's quota. Throughout, the console endpoint
   shows the guest's boot, and `ready` is false right after the create and after a
   reboot, true once cloud-init finished.
2. Clean power tasks (nothing on the guest's disk lost). Right after alice's first
   login (well within 30 s of SSH first answering) she writes a file on the root
   disk without `sync` and reboots through the API: she logs in again and the file
   is whole (before the fix, a reset right after a first boot left sshd unable to
   start: the host keys cloud-init had just written were not on the disk yet). The
   same later with power-off and power-on. Each task's history entry says the guest
   obeyed the power button.
3. modify-users takes bob out; after a reboot he can no longer log in and his home
   is not in the guest (his files stay on the head node).
4. `cloud-agent host drain default` moves the guest cold to the second host (its
   image uploaded there over the connection): alice logs in at the same address,
   her home's file and the root disk's file are there.
5. The second host is killed for good (its libvirtd and the guest's QEMU: fenced);
   `cloud-agent host evacuate remote --host-is-down` rebuilds the guest on the first
   host from its image: she logs in again at the same address, her home's file is
   intact (the root disk is new, as documented). The killed daemon is started
   again: its stale domain is there, shut off; `cloud-agent reconcile --fix`
   removes it without starting it, and a second reconcile finds nothing.
6. The lease the admin sets ends: the sweep powers the guest off cleanly (its shutdown on
   its console) and `keep` later deletes it, as a DELETE does: no domain, disk, seed, kept
   console or reservation; alice's home keeps its files.

The guest runs under KVM where KVM can boot Linux here, else under software
emulation (nested KVM on these machines cannot), decided by a probe boot.
Its network lives in the test libvirtd's own network namespace
(tests/fixtures/libvirtd.py); ssh runs there through nsenter.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from controller.instances import leases
from tests.fixtures.agent import run_agent
from tests.fixtures.api import PASSWORD, make_caller
from tests.fixtures.cloud import Cloud
from tests.fixtures.guest_e2e import (  # noqa: F401 (boot_virt, service: fixtures)
    BOOT_TIMEOUT, READY_TIMEOUT, Guest, agent, boot_virt, console, ok, push_key, run, service, wait_until_ready)
from tests.fixtures.libvirtd import _libvirt_answers, assert_same_image, in_netns

pytestmark = [pytest.mark.integration, pytest.mark.real_commands, pytest.mark.guest]

# A file of random bytes on the root disk, written with no sync; its digest printed.
WRITE = "head -c 4194304 /dev/urandom > /var/tmp/{name} && sha256sum /var/tmp/{name} | cut -d' ' -f1"
DIGEST = "sha256sum /var/tmp/{name} | cut -d' ' -f1"
# How often sshd started in the guest's boots, printed at the end (no sudo in this guest).
DIAGNOSE = "systemctl status ssh --no-pager -n 0 2>&1 | head -5"


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


def agent_json(config_path, *args) -> tuple[int, dict]:
    proc = run_agent("--config", str(config_path), "--json", *args, timeout=900)
    return proc.returncode, json.loads(proc.stdout)


def qemu_of(domain: str) -> list[int]:
    """The QEMU processes running `domain` (its name is on their command line)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"qemu" in Path(argv[0].decode(errors="replace")).name.encode() and \
                any(f"guest={domain},".encode() in a or a == f"guest={domain}".encode() for a in argv):
            found.append(int(pid))
    return found


def domstate(uri: str, domain: str) -> str:
    got = run(["virsh", "-c", uri, "domstate", domain], check=False)
    return got.stdout.strip() if got.returncode == 0 else "none"


def test_one_guest_through_its_life(service, guest_image, libvirt_dir_pool, remote_libvirtd, tmp_path):
    ctx, client, config_path, base = service
    # 120 s: a guest under software emulation on 2 shared cores may take long to shut down;
    # a power task must not force it here.
    ctx.config = ctx.config.with_values({"guest": {"shutdown_timeout_seconds": "120"}})
    remote = remote_libvirtd
    added = agent(config_path, "host", "add", "remote", "--uri", remote.uri, "--storage-pool", remote.pool,
                  "--network", remote.network, "--insecure")
    assert added["reachable"] is True and added["enabled"] is True and added["instances"] == 0

    # The admin's part, with the agent.
    image = agent(config_path, "image", "add", "--name", "Debian 12", "--os-name", "debian", "--os-major", "12",
                  "--os-minor", "0", "--min-disk", "2", "--min-ram", "512", "--source", str(guest_image))
    agent(config_path, "flavor", "add", "--name", "e2e", "--memory", "1024", "--disk", "3", "--vcpu", "1")
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org", owner=alice)  # alice may grant her managed user access
    accounts = {}
    for name in ("alice", "bob"):
        agent(config_path, "account", "enable", f"{name}@example.org", "--username", name)
        accounts[name] = ctx.store.get_account_by_username(name)

    # The users' part, through the API.
    def post(caller, path, body):
        return ok(client.simulate_post(path, headers=caller.headers, json=body), 201)[0]

    def task(what):
        started = time.monotonic()
        r = client.simulate_put(f"/v1/server-instance/{iid}", headers=alice.headers, json={"task": {"what": what}})
        return ok(r)[0], time.monotonic() - started

    def last_action() -> dict:
        return ok(client.simulate_get(f"/v1/server-instance/{iid}/actions", headers=alice.headers))[-1]

    # 1. The users. alice with the `cloud` command, over HTTP; bob through the API.
    volumes = {"bob": post(bob, "/v1/storage-volume", {"volume-size": 1, "volume-type": {"visibility": "cluster"}})}
    login_dir = tmp_path / "alice-login"
    login_dir.mkdir()
    keys = {}
    alice_cloud = cloud_as(login_dir, libvirt_dir_pool.uri, tmp_path / "alice")  # her key is made once her home exists
    alice_cloud.ok("login", "--url", base, "--email", "alice@example.org", stdin=PASSWORD + "\n")
    volumes["alice"] = alice_cloud.ok("--json", "volume", "create", "--size", "1")
    assert volumes["alice"]["volume-size"] == 1
    for name, volume in volumes.items():
        account = accounts[name]
        keys[name] = push_key(Path(volume["volume-type"]["mount-point"]), account["uid"], account["gid"],
                              tmp_path, name)
    home = Path(volumes["alice"]["volume-type"]["mount-point"])
    post(alice, "/v1/group", {"group-name": "alab", "group-members": ["alice"]})
    lab_gid = ctx.adapters.groups.gid("alab")
    created_at = time.monotonic()
    creating = alice_cloud.start("--json", "server", "create", "--image", "Debian 12", "--flavor", "e2e",
                                 "--user", accounts["bob"]["uuid"], "--wait",
                                 "--timeout", str(BOOT_TIMEOUT + 2 * READY_TIMEOUT))
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
    iid, address, hostname = inst["id"], inst["private-ip"], inst["hostname"]
    assert inst["status"] == "running" and address and hostname
    domain = ctx.config.libvirt.domain_prefix + iid

    def host_of() -> str:
        return ctx.store.list_instances(visible_to=None, instance_id=iid)[0]["host"]

    assert host_of() == "default"  # the same machine's memory on both hosts: by name on a tie
    listed = {h["name"]: h for h in agent(config_path, "host", "list")["hosts"]}
    assert listed["default"]["instances"] == 1 and listed["default"]["allocated_memory_mb"] == 1024
    assert set(inst["users"]) == {accounts["alice"]["uuid"], accounts["bob"]["uuid"]}
    guest = Guest(libvirt_dir_pool.uri, address)

    # 2. A reboot right after the first login loses nothing written on the root disk.
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, iid)["console"][-3000:])
    first_login = time.monotonic()
    print(f"first SSH login {first_login - created_at:.0f} s after the create")
    digest = guest.ssh(keys["alice"], "alice", WRITE.format(name="before-reboot")).stdout.strip()
    asked = time.monotonic()
    assert asked - first_login < 30, "the reboot must come within 30 s of the first login"
    rebooted, took = task("reboot")
    print(f"reboot answered after {took:.1f} s")
    assert rebooted["status"] == "running"
    entry = last_action()
    assert (entry["action"], entry["result"]) == ("reboot", "success")
    assert entry["message"].startswith("obeyed: the guest shut down when asked"), entry["message"]
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, iid)["console"][-3000:])
    ssh_at = time.monotonic()
    print(f"SSH again {ssh_at - asked:.0f} s after the reboot was asked")
    kept = guest.ssh(keys["alice"], "alice", DIGEST.format(name="before-reboot"), check=False)
    assert kept.stdout.strip() == digest, kept.stderr
    # A second login a few seconds later works too (no sshd restart in between).
    time.sleep(5)
    assert guest.ssh(keys["alice"], "alice", "hostname").stdout.strip() == hostname

    # `cloud server create --wait` returns once the guest is ready (from here the guest's address
    # is not reachable: the console says when), and prints the created server.
    try:
        out, err = creating.communicate(timeout=READY_TIMEOUT)
    except subprocess.TimeoutExpired:
        creating.kill()
        pytest.fail(f"cloud server create --wait still waiting {READY_TIMEOUT} s after SSH answered")
    assert creating.returncode == 0, err
    assert json.loads(out)["id"] == iid
    print(f"cloud server create --wait returned {time.monotonic() - ssh_at:.1f} s after SSH answered")
    # Ready once cloud-init's final stage ran; the console shows the guest's boot, from the firmware on.
    booted = wait_until_ready(client, alice, iid)
    assert booted["ready"] is True
    shown = alice_cloud.ok("--json", "server", "console", hostname)
    assert shown["ready"] is True and "Linux version" in shown["console"]
    # `cloud server ssh` logs her in as her own username at the private address.
    assert alice_cloud.ok("server", "ssh", iid[:8], "--", "id", "-u").strip() == str(accounts["alice"]["uid"])
    assert "SeaBIOS" in booted["console"] and "Linux version" in booted["console"]
    assert f"instance {iid} finished its boot setup" in booted["console"]
    # bob uses the instance but does not see it through the API (owners and their owners do):
    # its console is 404 for him, as the instance is.
    for path in (f"/v1/server-instance/{iid}/console", f"/v1/server-instance/{iid}"):
        assert client.simulate_get(path, headers=bob.headers).status_code == 404
    # The end only, with ?bytes.
    tail = ok(client.simulate_get(f"/v1/server-instance/{iid}/console", headers=alice.headers,
                                  query_string="bytes=100"))[0]
    assert len(tail["console"].encode()) <= 100 and booted["console"].endswith(tail["console"][-20:])

    # alice: her cluster identity, her home by virtiofs, files owned by her on the head node.
    out = guest.ssh(keys["alice"], "alice", "id -u; id -g; id -Gn; hostname; echo $HOME").stdout.split("\n")
    assert out[0] == str(accounts["alice"]["uid"]) and out[1] == str(accounts["alice"]["gid"])
    assert "alab" in out[2].split()
    assert out[3] == hostname and out[4] == str(home)
    assert guest.ssh(keys["alice"], "alice", "getent group alab | cut -d: -f3").stdout.strip() == str(lab_gid)
    mount = guest.ssh(keys["alice"], "alice", f"findmnt -no FSTYPE,SOURCE,OPTIONS {home}").stdout.split()
    assert mount[0] == "virtiofs" and mount[1] == "alice"
    assert {"nosuid", "nodev"} <= set(mount[2].split(","))
    guest.ssh(keys["alice"], "alice", "echo written in the guest > ~/from-guest.txt")
    written = home / "from-guest.txt"
    assert written.read_text() == "written in the guest\n"
    assert (written.stat().st_uid, written.stat().st_gid) == (accounts["alice"]["uid"], accounts["alice"]["gid"])
    assert guest.ssh(keys["alice"], "alice", "sudo -n true", check=False).returncode != 0  # [guest] sudo = none
    # Writes in the guest count against the volume's quota (1 GB, btrfs): past it they fail.
    over = guest.ssh(keys["alice"], "alice", "dd if=/dev/zero of=~/big bs=1M count=1200 conv=fsync status=none",
                     check=False, timeout=600)
    assert over.returncode != 0 and "quota" in over.stderr.lower(), over.stderr
    assert 0 < (home / "big").stat().st_size < 1200 * 2**20
    guest.ssh(keys["alice"], "alice", "rm -f ~/big")

    # bob logs in too, with his own home.
    bob_home = volumes["bob"]["volume-type"]["mount-point"]
    out = guest.ssh(keys["bob"], "bob", "id -u; findmnt -no FSTYPE $HOME").stdout.split()
    assert out == [str(accounts["bob"]["uid"]), "virtiofs"]

    # 3. alice takes bob out; after a reboot he cannot log in and his home is gone from the guest.
    ok(client.simulate_put(f"/v1/server-instance/{iid}", headers=alice.headers,
                           json={"task": {"what": "modify-users", "how": "delete",
                                          "users": [accounts["bob"]["uuid"]]}}))
    task("reboot")
    # A reboot clears ready; the console answers the new boot only.
    rebooting = console(client, alice, iid)
    assert rebooting["ready"] is False and "finished its boot setup" not in rebooting["console"]
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, iid)["console"][-3000:])
    assert "finished its boot setup" in wait_until_ready(client, alice, iid)["console"]
    assert guest.ssh(keys["bob"], "bob", "true", check=False).returncode != 0
    assert guest.ssh(keys["alice"], "alice", f"findmnt {bob_home} || echo not-mounted",
                     check=False).stdout.strip() == "not-mounted"
    assert guest.ssh(keys["alice"], "alice", "getent passwd bob || echo no-bob", check=False).stdout.strip() == "no-bob"
    assert (Path(bob_home) / ".ssh" / "authorized_keys").exists()  # his data stays on the head node

    # 2, continued. Power-off and power-on lose nothing written on the root disk either.
    digest = guest.ssh(keys["alice"], "alice", WRITE.format(name="before-power-off")).stdout.strip()
    stopped, took = task("power-off")
    print(f"power-off answered after {took:.1f} s")
    assert stopped["status"] == "shutoff"
    entry = last_action()
    assert (entry["action"], entry["result"]) == ("power-off", "success")
    assert entry["message"].startswith("obeyed: the guest shut down when asked"), entry["message"]
    started, _ = task("power-on")
    assert started["status"] == "running"
    guest.wait_for_ssh(keys["alice"], "alice", console(client, alice, iid)["console"][-3000:])
    kept = guest.ssh(keys["alice"], "alice", DIGEST.format(name="before-power-off"), check=False)
    assert kept.stdout.strip() == digest, kept.stderr
    print("sshd in the guest:\n" + guest.ssh(keys["alice"], "alice", DIAGNOSE, check=False, timeout=120).stdout)

    # 4. Maintenance of the first host: drained (a clean shutdown, a boot on the second).
    def log_in(uri: str) -> Guest:
        moved = Guest(uri, address)
        moved.wait_for_ssh(keys["alice"], "alice", console(client, alice, iid)["console"][-3000:])
        # cloud-init's last stage done (a first boot restarts sshd with new host keys before it).
        assert wait_until_ready(client, alice, iid)["ready"] is True
        assert moved.ssh(keys["alice"], "alice", "hostname").stdout.strip() == hostname
        return moved

    wait_until_ready(client, alice, iid)
    guest.ssh(keys["alice"], "alice", "echo kept in the home > ~/kept.txt; echo on the root disk > "
                                      "/var/tmp/alice-root.txt; sync")
    rc, drained = agent_json(config_path, "host", "drain", "default")
    assert (rc, drained) == (0, {"host": "default", "moved": [{"id": iid, "to": "remote"}], "failed": []})
    assert host_of() == "remote" and domstate(libvirt_dir_pool.uri, domain) == "none"
    assert domstate(remote.uri, domain) == "running"
    # The image was uploaded to the second host over the connection.
    base_volume = ctx.store.get_image(image["id"])["base_volume"]
    assert_same_image(Path(remote.pool_path) / base_volume, Path(libvirt_dir_pool.path, base_volume))
    listed = {h["name"]: h for h in agent(config_path, "host", "list")["hosts"]}
    assert listed["remote"]["instances"] == 1 and listed["remote"]["allocated_memory_mb"] == 1024
    assert listed["default"]["instances"] == 0
    shown = ok(client.simulate_get(f"/v1/server-instance/{iid}", headers=alice.headers))[0]
    assert shown["status"] == "running" and shown["private-ip"] == address and shown["hostname"] == hostname
    guest = log_in(remote.uri)
    assert guest.ssh(keys["alice"], "alice", "cat ~/kept.txt /var/tmp/alice-root.txt").stdout == \
        "kept in the home\non the root disk\n"  # the home, and the root disk moved with it
    # The console shows the boot on the new host (the run there).
    assert "Linux version" in console(client, alice, iid)["console"]
    assert agent(config_path, "host", "enable", "default")["enabled"] is True  # the maintenance is over

    try:
        # 5. The second host dies for good: its daemon and the guest's QEMU are killed (fenced).
        qemu = qemu_of(domain)
        assert qemu, "the guest's QEMU is not found"
        remote.kill()
        for pid in qemu:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while qemu_of(domain) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not qemu_of(domain)
        rc, evacuated = agent_json(config_path, "host", "evacuate", "remote", "--host-is-down")
        assert (rc, evacuated) == (0, {"host": "remote", "rebuilt": [{"id": iid, "to": "default"}], "failed": []})
        assert host_of() == "default"
        guest = log_in(libvirt_dir_pool.uri)
        assert guest.ssh(keys["alice"], "alice", "cat ~/kept.txt").stdout == "kept in the home\n"
        # Rebuilt from its image: a new root disk.
        assert guest.ssh(keys["alice"], "alice", "test -e /var/tmp/alice-root.txt", check=False).returncode != 0
        assert (home / "kept.txt").read_text() == "kept in the home\n"

        # The dead host's daemon comes back: its stale copy is removed, never started (the only
        # QEMU of that domain name is the rebuilt guest's, on the first host).
        rebuilt_qemu = qemu_of(domain)
        assert len(rebuilt_qemu) == 1
        remote.start()
        assert domstate(remote.uri, domain) == "shut off"
        proc = run_agent("--config", str(config_path), "--json", "reconcile", "--fix", timeout=900)
        fixed = json.loads(proc.stdout)["drift"]
        assert [(d["kind"], d["target"], d["fixed"]) for d in fixed] == [("domain-stale", iid, True)], fixed
        assert proc.returncode == 0
        assert domstate(remote.uri, domain) == "none" and qemu_of(domain) == rebuilt_qemu
        assert not [f for f in os.listdir(remote.pool_path) if iid in f]
        assert json.loads(run_agent("--config", str(config_path), "--json", "reconcile", timeout=900).stdout) == \
            {"drift": []}
        assert domstate(libvirt_dir_pool.uri, domain) == "running"
    finally:
        if not _libvirt_answers(remote.uri):
            remote.start()  # the session's other tests use this daemon

    # 6. Its lease ends (the admin's `server lease --hours`, a few seconds): the sweep powers
    # it off cleanly (the guest's own shutdown is on its console), then `keep` later deletes
    # it: no domain, disk, seed, console file or reservation; alice's home keeps its files.
    # `keep` is an hour while the expiry is checked (a clean power-off takes seconds under
    # emulation), then the admin shortens it: the sweep reads it each time.
    ctx.config = ctx.config.with_values({"leases": {"warn": "1h", "keep": "1h"}})
    pool_files = lambda: sorted(os.listdir(libvirt_dir_pool.path))  # noqa: E731
    assert any(iid in f for f in pool_files())
    ends = agent(config_path, "server", "lease", hostname, "--hours", "0.001")["expires-at"]
    time.sleep(4)
    swept = leases.sweep(ctx)
    assert [(d["kind"], d["instance"]) for d in swept] == [("expire", iid)], swept
    entry = last_action()
    assert (entry["action"], entry["result"]) == ("expire", "success")
    assert entry["message"].startswith(f"the lease ended at {ends}; powered off: obeyed"), entry["message"]
    assert domstate(libvirt_dir_pool.uri, domain) == "shut off"
    assert "reboot: Power down" in console(client, alice, iid)["console"][-3000:]
    r = client.simulate_put(f"/v1/server-instance/{iid}", headers=alice.headers, json={"task": {"what": "power-on"}})
    assert (r.status_code, r.json["msg"]) == (409, f"lease expired at {ends}; renew it first")
    assert leases.sweep(ctx) == []  # within keep: kept, powered off
    ctx.config = ctx.config.with_values({"leases": {"warn": "1h", "keep": "1s"}})
    assert [(d["kind"], d["instance"]) for d in leases.sweep(ctx)] == [("delete", iid)]
    assert run(["virsh", "-c", libvirt_dir_pool.uri, "dominfo", domain], check=False).returncode != 0
    assert not any(iid in f for f in pool_files())
    for which in ("--inactive", None):  # the definition keeps DHCP hosts; both keep DNS names
        net = ET.fromstring(run(["virsh", "-c", libvirt_dir_pool.uri, "net-dumpxml",
                                 *filter(None, [which]), ctx.config.network.name]).stdout)
        assert address not in {h.get("ip") for h in [*net.findall("ip/dhcp/host"), *net.findall("dns/host")]}
    assert ctx.store.find_instance(iid) is None
    assert (home / "kept.txt").read_text() == "kept in the home\n"
    print(f"whole test {time.monotonic() - created_at:.0f} s after the create")
