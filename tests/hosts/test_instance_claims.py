"""The per-instance claim on its host state (controller/instances/instance_claims.py), across processes.

Other processes (as `cloud-agent` is to the service) take the claim of an instance on the
same database: exactly one of several racing takes it, the others (and this process) are
told what is in progress; a holder that dies without letting go leaves a stale claim that
the next taker takes over and that reconcile --fix removes.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.instances import instance_claims
from controller.errors import Conflict, NotFound
from controller.instances.guests import refresh_guest
from controller.maintenance.reconcile import reconcile
from tests.hosts.test_hosts import alice, boot, flavor, ok  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
# Another process: waits for the start file, takes the claim, says so, then holds it until
# its stdin closes and exits without letting go (as a process that dies does).
TAKER = """
import os, sys, time, types
from controller.store import Store
from controller.instances import instance_claims
from controller.errors import Conflict
db, instance_id, go, operation = sys.argv[1:5]
ctx = types.SimpleNamespace(store=Store(db))
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
try:
    instance_claims.claim(ctx, instance_id, operation)
except Conflict as e:
    print("busy", e.message, flush=True)
    sys.exit(0)
print("taken", os.getpid(), flush=True)
sys.stdin.read()
os._exit(0)
"""


def takers(cctx, instance_id, n, tmp_path, operation="move"):
    go = tmp_path / f"go-{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, cctx.store.path, instance_id, str(go), operation],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    time.sleep(0.5)  # all started and waiting
    go.touch()
    lines = [p.stdout.readline().strip() for p in procs]
    return procs, lines


def end(procs):
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)


@pytest.fixture
def instance(client, cctx, alice, catalog, flavor):
    return ok(boot(client, alice, catalog, flavor))[0]["id"]


def test_one_of_several_processes_takes_the_claim_and_the_others_are_told_what_runs(cctx, instance, tmp_path):
    procs, lines = takers(cctx, instance, 5, tmp_path)
    try:
        taken = [line for line in lines if line.startswith("taken")]
        busy = [line for line in lines if line.startswith("busy")]
        assert len(taken) == 1 and len(busy) == 4, lines
        assert all(f"server-instance {instance} is busy: a move to another host by an admin" in b for b in busy)
        [row] = cctx.store.list_instance_claims()
        assert (row["instance_id"], row["operation"], row["pid"]) == (instance, "move", int(taken[0].split()[1]))
        # This process too is refused while the holder lives.
        with pytest.raises(Conflict, match="is busy: a move to another host by an admin .* is in progress"):
            instance_claims.claim(cctx, instance, "power-on")
        assert cctx.store.list_instance_claims() == [row] and instance_claims.stale_claims(cctx) == []
    finally:
        end(procs)
    # The holder died without letting go: its claim is stale, and the next taker takes it over.
    [stale] = instance_claims.stale_claims(cctx)
    assert stale["token"] == row["token"]
    with instance_claims.held(cctx, instance, "power-on", refresh=None) as mine:
        [now] = cctx.store.list_instance_claims()
        assert (now["token"], now["operation"], now["pid"]) == (mine.token, "power-on", os.getpid())
        assert instance_claims.stale_claims(cctx) == []
    assert cctx.store.list_instance_claims() == []


def test_a_stale_claim_is_reported_and_removed_by_reconcile_fix(cctx, instance, tmp_path):
    procs, lines = takers(cctx, instance, 1, tmp_path, operation="evacuation")
    assert lines[0].startswith("taken")
    found = [d for d in reconcile(cctx) if d["kind"] == "instance-claim-stale"]
    assert found == []  # a live holder is no drift
    end(procs)
    found = [(d["kind"], d["target"], d["fixable"]) for d in reconcile(cctx)]
    assert found == [("instance-claim-stale", instance, True)]
    fixed = reconcile(cctx, fix=True)
    assert [(d["kind"], d["fixed"]) for d in fixed] == [("instance-claim-stale", True)]
    assert cctx.store.list_instance_claims() == [] and reconcile(cctx) == []


def test_a_reused_pid_is_another_process(cctx, instance):
    taken = instance_claims.claim(cctx, instance, "reboot")
    [row] = cctx.store.list_instance_claims()
    assert instance_claims.holder_alive(row)
    assert not instance_claims.holder_alive(dict(row, proc_start="1"))  # the same pid, started at another time
    assert not instance_claims.holder_alive(dict(row, boot_id="another-boot"))
    assert instance_claims.holder_alive(dict(row, machine="another-machine", boot_id="x"))  # never taken from
    instance_claims.release(cctx, taken, refresh=None)
    assert cctx.store.list_instance_claims() == []


def test_a_refresh_asked_meanwhile_is_done_by_the_holder_before_it_lets_go(cctx, instance):
    refreshed = []
    assert not instance_claims.defer_refresh(cctx, instance)  # nobody holds it: the caller refreshes
    with instance_claims.held(cctx, instance, "move", refresh=lambda: refreshed.append(1)):
        assert instance_claims.defer_refresh(cctx, instance)
        assert instance_claims.defer_refresh(cctx, instance)  # two asks, one rebuild
    assert refreshed == [1] and cctx.store.list_instance_claims() == []
    with pytest.raises(NotFound):
        instance_claims.claim(cctx, "0f8fad5b-d9cb-469f-a165-70867728950e", "move")


def test_a_task_is_409_while_another_process_moves_the_instance_and_runs_after(client, cctx, alice, instance,
                                                                              tmp_path, adapters):
    procs, lines = takers(cctx, instance, 1, tmp_path)
    assert lines[0].startswith("taken")
    try:
        r = client.simulate_put(f"/v1/server-instance/{instance}", headers=alice.headers,
                                json={"task": {"what": "power-off"}})
        assert r.status_code == 409 and r.json["msg"].startswith(
            f"server-instance {instance} is busy: a move to another host by an admin (`cloud-agent host drain`) "
            "is in progress")
        assert adapters.hypervisor.instances[instance].status == "running"  # nothing was done
        r = client.simulate_delete(f"/v1/server-instance/{instance}", headers=alice.headers)
        assert r.status_code == 409 and adapters.hypervisor.instances[instance].status == "running"
        assert cctx.store.find_instance(instance) is not None
    finally:
        end(procs)
    # Its holder gone, the next task takes the claim over.
    r = client.simulate_put(f"/v1/server-instance/{instance}", headers=alice.headers,
                            json={"task": {"what": "power-off"}})
    assert r.status_code == 200 and adapters.hypervisor.instances[instance].status == "shutoff"
    assert cctx.store.list_instance_claims() == []


def test_user_changes_while_another_process_holds_the_claim_are_done_by_the_holder(client, cctx, alice, instance,
                                                                                  tmp_path, adapters):
    from controller.users import accounts, users
    from controller.permissions import Requester
    from tests.fixtures.api import enable, make_caller

    bob = make_caller(cctx, "bob@example.org", owner=alice)
    bob_uuid = enable(cctx, bob, username="bob")["uuid"]
    carol = make_caller(cctx, "carol@example.org", owner=alice)
    carol_uuid = enable(cctx, carol, username="carol")["uuid"]
    ok(client.simulate_put(f"/v1/server-instance/{instance}", headers=alice.headers,
                           json={"task": {"what": "modify-users", "how": "add", "users": [bob_uuid, carol_uuid]}}), 200)
    guest = adapters.hypervisor.instances[instance]
    assert {"bob", "carol"} <= {u.username for u in guest.guest.users}
    procs, lines = takers(cctx, instance, 1, tmp_path)
    assert lines[0].startswith("taken")
    try:
        # Neither waits for the holder, and neither is lost: the database has them, the claim asks.
        users.update_user(cctx, Requester(id="admin", roles=frozenset({"superuser"})), bob.id, active=0)
        accounts.disable_account(cctx, "carol@example.org")
        assert carol_uuid not in cctx.store.find_instance(instance)["users"]
        [held] = cctx.store.list_instance_claims()
        assert held["refresh_wanted"] == 1
        assert {"bob", "carol"} <= {u.username for u in guest.guest.users}  # the holder's to do
    finally:
        end(procs)
    # The holder died without doing it: the next taker does (it took the mark over with the claim).
    instance_claims.release(cctx, instance_claims.claim(cctx, instance, "reboot"),
                            refresh=lambda: refresh_guest(cctx, instance))
    assert {u.username for u in guest.guest.users} == {"alice"}
    assert cctx.store.list_instance_claims() == []
