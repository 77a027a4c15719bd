"""Issue 19's proof on real guests: drain, then a host killed for good and evacuated.

Two hosts: the config's own (the test libvirtd, NAT network) and a second real libvirtd
reached over `qemu+tcp://` on a bridged network (tests/fixtures/remote_libvirtd.py). A
Debian guest boots on the first; alice writes a file in her home (the cluster
filesystem) and one on the root disk.

1. `cloud-agent host drain default` moves it cold to the second host: she logs in
   by SSH at the same address, her home's file and the root disk's file are there.
2. The second host is killed for good (its libvirtd and the guest's QEMU: fenced);
   `cloud-agent host evacuate remote --host-is-down` rebuilds the guest on the first
   host from its image: she logs in again at the same address, her home's file is
   intact (the root disk is new, as documented).
3. The killed daemon is started again: its stale domain is there, shut off;
   `cloud-agent reconcile --fix` removes it without starting it, and a second
   reconcile finds nothing.

Three boots in all (the create, the move, the rebuild): each costs about a minute under
software emulation.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.agent import run_agent
from tests.fixtures.api import make_caller
from tests.fixtures.libvirtd import _libvirt_answers
from tests.fixtures.guest_e2e import (  # noqa: F401 (boot_virt, service: fixtures)
    Guest, agent, boot_virt, console, ok, push_key, run, service, wait_until_ready)

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]


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


def test_a_guest_drained_then_evacuated_keeps_its_address_and_home(service, guest_image, libvirt_dir_pool,
                                                                   remote_libvirtd, tmp_path):
    ctx, client, config_path, _base = service
    remote = remote_libvirtd
    agent(config_path, "host", "add", "remote", "--uri", remote.uri, "--storage-pool", remote.pool,
          "--network", remote.network, "--insecure")
    image = agent(config_path, "image", "add", "--name", "Debian 12", "--os-name", "debian", "--os-major", "12",
                  "--os-minor", "0", "--min-disk", "2", "--min-ram", "512", "--source", str(guest_image))
    flavor = agent(config_path, "flavor", "add", "--name", "hosts", "--memory", "1024", "--disk", "3", "--vcpu", "1")
    alice = make_caller(ctx, "alice@example.org")
    agent(config_path, "account", "enable", "alice@example.org", "--username", "alice")
    account = ctx.store.get_account_by_username("alice")
    volume = ok(client.simulate_post("/v1/storage-volume", headers=alice.headers,
                                     json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 201)[0]
    home = Path(volume["volume-type"]["mount-point"])
    key = push_key(home, account["uid"], account["gid"], tmp_path, "alice")
    inst = ok(client.simulate_post("/v1/server-instance", headers=alice.headers,
                                   json={"server-image": image["id"], "server-flavor": flavor["id"]}), 201)[0]
    instance_id, address, hostname = inst["id"], inst["private-ip"], inst["hostname"]
    domain = ctx.config.libvirt.domain_prefix + instance_id

    def host_of() -> str:
        return ctx.store.list_instances(visible_to=None, instance_id=instance_id)[0]["host"]

    def log_in(uri: str) -> Guest:
        guest = Guest(uri, address)
        guest.wait_for_ssh(key, "alice", console(client, alice, instance_id)["console"][-3000:])
        # cloud-init's last stage done (a first boot restarts sshd with new host keys before it).
        assert wait_until_ready(client, alice, instance_id)["ready"] is True
        assert guest.ssh(key, "alice", "hostname").stdout.strip() == hostname
        return guest

    assert host_of() == "default"  # the same machine's memory on both: by name on a tie
    guest = log_in(libvirt_dir_pool.uri)
    guest.ssh(key, "alice", "echo kept in the home > ~/kept.txt; echo on the root disk > /var/tmp/alice-root.txt;"
                            " sync")

    # 1. Maintenance of the first host: drained (a clean shutdown, a boot on the second).
    rc, drained = agent_json(config_path, "host", "drain", "default")
    assert (rc, drained) == (0, {"host": "default", "moved": [{"id": instance_id, "to": "remote"}], "failed": []})
    assert host_of() == "remote" and domstate(libvirt_dir_pool.uri, domain) == "none"
    assert domstate(remote.uri, domain) == "running"
    shown = ok(client.simulate_get(f"/v1/server-instance/{instance_id}", headers=alice.headers))[0]
    assert shown["status"] == "running" and shown["private-ip"] == address and shown["hostname"] == hostname
    guest = log_in(remote.uri)
    assert guest.ssh(key, "alice", "cat ~/kept.txt /var/tmp/alice-root.txt").stdout == \
        "kept in the home\non the root disk\n"  # the home, and the root disk moved with it
    # The console shows the boot on the new host (the run there).
    assert "Linux version" in console(client, alice, instance_id)["console"]
    assert agent(config_path, "host", "enable", "default")["enabled"] is True  # the maintenance is over

    try:
        # 2. The second host dies for good: its daemon and the guest's QEMU are killed (fenced).
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
        assert (rc, evacuated) == (0, {"host": "remote", "rebuilt": [{"id": instance_id, "to": "default"}],
                                       "failed": []})
        assert host_of() == "default"
        guest = log_in(libvirt_dir_pool.uri)
        assert guest.ssh(key, "alice", "cat ~/kept.txt").stdout == "kept in the home\n"
        # Rebuilt from its image: a new root disk.
        assert guest.ssh(key, "alice", "test -e /var/tmp/alice-root.txt", check=False).returncode != 0
        assert (home / "kept.txt").read_text() == "kept in the home\n"

        # 3. The dead host's daemon comes back: its stale copy is removed, never started (the
        # only QEMU of that domain name is the rebuilt guest's, on the first host).
        rebuilt_qemu = qemu_of(domain)
        assert len(rebuilt_qemu) == 1
        remote.start()
        assert domstate(remote.uri, domain) == "shut off"
        proc = run_agent("--config", str(config_path), "--json", "reconcile", "--fix", timeout=900)
        fixed = json.loads(proc.stdout)["drift"]
        assert [(d["kind"], d["target"], d["fixed"]) for d in fixed] == [("domain-stale", instance_id, True)], fixed
        assert proc.returncode == 0
        assert domstate(remote.uri, domain) == "none" and qemu_of(domain) == rebuilt_qemu
        assert not [f for f in os.listdir(remote.pool_path) if instance_id in f]
        assert json.loads(run_agent("--config", str(config_path), "--json", "reconcile", timeout=900).stdout) == \
            {"drift": []}
        assert domstate(libvirt_dir_pool.uri, domain) == "running"
    finally:
        if not _libvirt_answers(remote.uri):
            remote.start()  # the session's other tests use this daemon
