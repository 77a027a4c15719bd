"""reconcile: drift made on purpose behind the service's back is reported, and --fix repairs it."""

import dataclasses
import json
import os
import shutil
import subprocess

import pytest
from falcon import testing

from controller.storage import images
from controller.users.accounts import enable_account
from controller.maintenance.reconcile import reconcile
from host_adapters.subp import run
from tests.fixtures.agent import AGENT
from tests.fixtures.api import config_values_for, make_caller, new_context

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

@pytest.fixture
def service(tmp_path, sysroot):
    """The sandbox profile on real parts: libvirt test driver, homes on disk, a system root."""
    import libvirt

    from tests.fixtures.libvirtd import cleanup_hypervisor, unique_prefix

    values = config_values_for(tmp_path)
    values["unix"]["root"] = sysroot
    values["libvirt"]["domain_prefix"] = unique_prefix()
    (tmp_path / "home").mkdir(exist_ok=True)
    config_path = str(tmp_path / "controller.ini")
    # The test driver forgets its state when its last connection closes.
    anchor = libvirt.open("test:///default")
    ctx = new_context(values, path=config_path, real_adapters=True)
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org", owner=alice)
    enable_account(ctx, alice.email, username="alice")
    enable_account(ctx, bob.email, username="bob")
    image = images.add_image(ctx, name="img", os_name="x", os_major="1", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="f", memory=128, disk=1, vcpu=1)
    for who in (alice, bob):
        r = client.simulate_post("/v1/storage-volume", headers=who.headers,
                                 json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})
        assert r.status_code == 201, r.json
    r = client.simulate_post("/v1/server-instance", headers=alice.headers,
                             json={"server-image": image["id"], "server-flavor": flavor["id"]})
    assert r.status_code == 201, r.json
    instance = r.json["data"][0]
    r = client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": "lab", "group-members": ["alice"]})
    assert r.status_code == 201, r.json
    yield {"ctx": ctx, "conn": anchor, "instance": instance, "sysroot": sysroot, "config": config_path}
    cleanup_hypervisor(ctx.adapters.hypervisor)
    anchor.close()


def kinds(drift):
    return sorted((d["kind"], d["target"]) for d in drift)


def group_members(sysroot, name):
    with open(os.path.join(sysroot, "etc", "group")) as f:
        for line in f:
            fields = line.rstrip("\n").split(":")
            if fields[0] == name:
                return [m for m in fields[3].split(",") if m]
    return None


def test_no_drift_after_normal_use(service):
    assert reconcile(service["ctx"]) == []


def test_drift_is_reported_then_fixed(service):
    ctx, conn, instance = service["ctx"], service["conn"], service["instance"]
    prefix = ctx.config.libvirt.domain_prefix
    # A domain undefined behind the service's back (its disk goes with it: the test driver
    # cannot keep a disk without the domain here, so delete both).
    dom = conn.lookupByName(prefix + instance["id"])
    dom.destroy()
    dom.undefine()
    pool = conn.storagePoolLookupByName("default-pool")
    pool.storageVolLookupByName(f"{prefix}disk-{instance['id']}.qcow2").delete(0)
    pool.storageVolLookupByName(f"{prefix}seed-{instance['id']}.iso").delete(0)
    # A home directory removed.
    shutil.rmtree(ctx.adapters.homes.path("bob"))
    # A group member added by hand.
    run(["gpasswd", "-Q", service["sysroot"], "-a", "bob", "lab"])
    assert group_members(service["sysroot"], "lab") == ["alice", "bob"]

    drift = reconcile(ctx)
    found = kinds(drift)
    volume_of_bob = ctx.store.volume_of_user(ctx.store.get_user_by_email("bob@example.org")["id"])["id"]
    assert ("domain-missing", instance["id"]) in found
    assert ("home-missing", volume_of_bob) in found
    assert ("group-members", "lab") in found
    assert all(not d["fixed"] for d in drift)
    # Nothing was changed by the report.
    assert group_members(service["sysroot"], "lab") == ["alice", "bob"]

    fixed = reconcile(ctx, fix=True)
    assert all(d["fixed"] for d in fixed if d["kind"] in ("domain-missing", "home-missing", "group-members"))
    assert ctx.adapters.hypervisor.status(instance["id"]) == "running"
    state = ctx.adapters.homes.inspect("bob")
    assert state.exists and state.mode == 0o700
    assert group_members(service["sysroot"], "lab") == ["alice"]
    # bob's home is back, so alice's instance (bob has no access) keeps alice's share only.
    assert [s.tag for s in ctx.adapters.hypervisor.describe(instance["id"]).shares] == ["alice"]
    assert reconcile(ctx) == []


def test_orphans_and_state_are_reported_not_destroyed(service):
    ctx, instance = service["ctx"], service["instance"]
    hv = ctx.adapters.hypervisor
    ctx.store.delete_instance(instance["id"])  # the record is gone, the domain stays
    drift = reconcile(ctx, fix=True)
    orphan = [d for d in drift if d["kind"] == "domain-orphan"]
    assert orphan and orphan[0]["target"] == instance["id"] and not orphan[0]["fixed"] and not orphan[0]["fixable"]
    assert hv.status(instance["id"]) == "running"  # nothing a user did not ask to lose


def test_state_and_shares_drift(service):
    ctx, instance = service["ctx"], service["instance"]
    hv = ctx.adapters.hypervisor
    hv.power_off(instance["id"])

    from controller.instances.guests import guest_spec

    [row] = ctx.store.list_instances(visible_to=None, instance_id=instance["id"])
    hv.set_guest(instance["id"], dataclasses.replace(guest_spec(ctx, row), users=()))
    found = kinds(reconcile(ctx))
    assert ("instance-status", instance["id"]) in found and ("domain-shares", instance["id"]) in found
    assert ("seed-content", instance["id"]) in found
    reconcile(ctx, fix=True)
    assert ctx.store.all_instances()[0]["status"] == "shutoff"
    assert [s.tag for s in hv.describe(instance["id"]).shares] == ["alice"]


def test_missing_account_and_group_are_recreated(service):
    ctx, sysroot = service["ctx"], service["sysroot"]
    run(["groupdel", "-R", sysroot, "lab"])
    found = kinds(reconcile(ctx))
    assert ("group-missing", "lab") in found
    reconcile(ctx, fix=True)
    assert group_members(sysroot, "lab") == ["alice"]


def test_cli_reports_file_drift_as_json_and_fixes_it(service):
    """The agent in its own process: homes and groups live in files, so it sees their drift."""
    ctx, sysroot = service["ctx"], service["sysroot"]
    run(["gpasswd", "-Q", sysroot, "-a", "bob", "lab"])
    os.chmod(ctx.adapters.homes.path("alice"), 0o755)
    env = dict(os.environ, CLOUD_CONTROLLER_CONFIG=service["config"])
    report = subprocess.run([AGENT, "--json", "reconcile"], capture_output=True, text=True, env=env)
    assert report.returncode == 1, report.stderr
    drift = json.loads(report.stdout)["drift"]
    assert {"group-members", "home-owner"} <= {d["kind"] for d in drift}
    fixed = subprocess.run([AGENT, "--json", "reconcile", "--fix"], capture_output=True, text=True, env=env)
    assert {d["kind"] for d in json.loads(fixed.stdout)["drift"] if d["fixed"]} >= {"group-members", "home-owner"}
    assert group_members(sysroot, "lab") == ["alice"]
    assert os.stat(ctx.adapters.homes.path("alice")).st_mode & 0o777 == 0o700


def test_cli_in_the_sandbox_leaves_the_servers_domains_alone(service):
    """The server (here: this test process) runs the domains; the agent's own test driver has none."""
    env = dict(os.environ, CLOUD_CONTROLLER_CONFIG=service["config"])
    report = subprocess.run([AGENT, "--json", "reconcile"], capture_output=True, text=True, env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    assert json.loads(report.stdout) == {"drift": []}
    human = subprocess.run([AGENT, "reconcile"], capture_output=True, text=True, env=env)
    assert "no drift" in human.stdout and "sandbox profile" in human.stdout


def test_access_removed_from_a_running_guest_is_reported_until_a_reboot(service):
    """QEMU cannot unplug a 9p share: the guest keeps it, reconcile says so, reboot applies the record."""
    from controller.instances.instances import run_task
    from controller.permissions import Requester

    ctx, instance = service["ctx"], service["instance"]
    hv = ctx.adapters.hypervisor
    alice = Requester.from_user(ctx.store.get_user_by_email("alice@example.org"))
    bob = ctx.store.account_of_user(ctx.store.get_user_by_email("bob@example.org")["id"], ctx.config.controller_id)

    def task(**body):
        return run_task(ctx, alice, instance["id"], body)

    def live_drift():
        return [d for d in reconcile(ctx, fix=True) if d["kind"] == "domain-live-shares"]

    task(what="modify-users", how="add", users=[bob["uuid"]])
    [added] = live_drift()  # the running guest does not have bob's home yet
    assert "bob" in added["detail"] and "power-off" in added["detail"]
    task(what="reboot")
    assert reconcile(ctx) == []

    task(what="modify-users", how="delete", users=[bob["uuid"]])
    assert [s.tag for s in hv.describe(instance["id"]).shares] == ["alice"]
    assert [s.tag for s in hv.describe(instance["id"]).live_shares] == ["alice", "bob"]
    [removed] = live_drift()
    assert (removed["target"], removed["fixable"], removed["fixed"]) == (instance["id"], False, False)
    assert "reboot" in removed["detail"]
    assert [s.tag for s in hv.describe(instance["id"]).live_shares] == ["alice", "bob"]  # --fix left it

    task(what="reboot")
    assert hv.status(instance["id"]) == "running"
    assert [s.tag for s in hv.describe(instance["id"]).live_shares] == ["alice"]
    assert reconcile(ctx) == []


def test_a_home_without_a_volume_record_is_reported_not_removed(service):
    ctx = service["ctx"]
    bob = ctx.store.get_user_by_email("bob@example.org")
    ctx.store.delete_volume(ctx.store.volume_of_user(bob["id"])["id"])  # the row lost, the home kept
    drift = reconcile(ctx, fix=True)
    [item] = [d for d in drift if d["kind"] == "home-without-volume"]
    assert item["target"] == "bob" and not item["fixable"] and not item["fixed"]
    assert ctx.adapters.homes.inspect("bob").exists


def test_a_host_read_that_fails_is_reported_and_the_run_goes_on(service, monkeypatch):
    from controller.errors import HostError

    ctx = service["ctx"]
    real_inspect = ctx.adapters.homes.inspect

    def flaky(name):
        if name == "bob":
            raise HostError("subvolume moved; try again")
        return real_inspect(name)

    monkeypatch.setattr(ctx.adapters.homes, "inspect", flaky)
    shutil.rmtree(ctx.adapters.homes.path("alice"))
    drift = reconcile(ctx)
    kinds_found = {d["kind"] for d in drift}
    assert "check-failed" in kinds_found and "home-missing" in kinds_found
    [failed] = [d for d in drift if d["kind"] == "check-failed"]
    assert "moved" in failed["detail"] and not failed["fixable"]


def test_a_home_is_never_chowned_back_across_a_uid_mismatch(service):
    """Issue 8, finding 7: alice's uid was changed in the account files (and her home with
    it); the recorded uid may now be anyone's. reconcile --fix reports both and leaves them."""
    ctx, sysroot = service["ctx"], service["sysroot"]
    recorded = ctx.store.get_account_by_username("alice")["uid"]
    run(["usermod", "-R", sysroot, "-u", "23456", "alice"])
    home = ctx.adapters.homes.path("alice")
    os.chown(home, 23456, -1)
    drift = reconcile(ctx, fix=True)
    found = {d["kind"]: d for d in drift if d["target"] in ("alice", ctx.store.volume_of_user(
        ctx.store.get_user_by_email("alice@example.org")["id"])["id"])}
    assert found["account-uid"]["fixed"] is False
    assert found["home-owner"]["fixable"] is False and found["home-owner"]["fixed"] is False
    assert f"uid 23456, the record says {recorded}" in found["home-owner"]["detail"]
    assert os.stat(home).st_uid == 23456
