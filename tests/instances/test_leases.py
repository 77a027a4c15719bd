"""Issue 42 on fake host adapters: instance leases (docs/leases.md).

The service's clock is the context's (`cctx.clock`), moved by each test: a create takes
its lease from the flavor or `[leases] default`; a renewal by the owner, a manager or a
superuser moves it (never past the max, which the 400 names); the sweep warns once at each
`[leases] warn`, powers the instance off once at the end, deletes it once `keep` later
(homes untouched), and hands each event to `notify_command`, bounded. Reconcile reports
and fixes what the sweep has not done; the metrics count the leases near and past their end.

Processes killed and racing are in tests/server/test_lease_faults.py; the real guest in
tests/guests/test_guest_e2e.py.
"""

import json
import os
import sqlite3
import stat
import time

import pytest

from controller.instances import lease_terms, leases
from controller.maintenance.reconcile import reconcile
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401 (people: a fixture)
from tests.fixtures.api import config_values_for, give_volume
from tests.server.test_metrics import scrape, value

T0 = 1_900_000_000.0  # 2030-03-17T17:46:40Z
HOUR = 3600


@pytest.fixture
def config_values(tmp_path):
    values = config_values_for(tmp_path)
    values["leases"] = {"default": "2d", "max": "5d", "warn": "24h, 1h", "keep": "1d"}
    return values


class Clock:
    def __init__(self, at: float):
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def clock(cctx):
    cctx.clock = Clock(T0)
    return cctx.clock


@pytest.fixture
def made(client, cctx, clock, people, catalog):
    """The owner's instance, created at T0 with the default lease (2 days)."""
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    return inst


def renew(client, caller, instance_id, **body):
    return client.simulate_post(f"/v1/server-instance/{instance_id}/lease", headers=caller.headers, json=body)


def task(client, caller, instance_id, what):
    return client.simulate_put(f"/v1/server-instance/{instance_id}", headers=caller.headers,
                               json={"task": {"what": what}})


def actions(cctx, instance_id) -> list[tuple[str, str]]:
    return [(a["action"], a["result"]) for a in cctx.store.list_instance_actions(instance_id, visible_to=None)]


def at(seconds: float) -> str:
    return lease_terms.rfc3339(seconds)


ENDS = T0 + 2 * 24 * HOUR


# -- the lease a create gives -------------------------------------------------------------------
def test_a_create_takes_the_default_lease_and_a_flavor_its_own(client, cctx, clock, people, made, catalog):
    from controller.storage import images

    assert (made["expires-at"], made["lease"]) == (at(ENDS), "active")
    assert cctx.store.find_instance(made["id"])["expires_at"] == at(ENDS)
    short = images.add_flavor(cctx, name="short", memory=512, disk=2, vcpu=1, lease_default="3h", lease_max="6h")
    give_volume(client, people["managed"])
    [other] = ok(boot(client, people["managed"], catalog, **{"server-flavor": short["id"]}), 201)
    # Within the first warning (24 h) from its start: expiring at once.
    assert (other["expires-at"], other["lease"]) == (at(T0 + 3 * HOUR), "expiring")
    # Its own max is the bound of its renewals, and the 400 names it.
    r = renew(client, people["managed"], other["id"], hours=7)
    assert r.status_code == 400 and "6 hours (server-flavor short's lease-max)" in r.json["msg"]
    assert ok(renew(client, people["managed"], other["id"], hours=6))[0]["expires-at"] == at(T0 + 6 * HOUR)


def test_the_lease_field_follows_the_clock(client, cctx, clock, people, made):
    def lease():
        return ok(client.simulate_get(f"/v1/server-instance/{made['id']}", headers=people["owner"].headers))[0]["lease"]

    def listed():
        return [(i["id"], i["lease"], i["expires-at"])
                for i in ok(client.simulate_get("/v1/server-instance", headers=people["owner"].headers))]

    # Each answer twice: the second from the read memo (nothing was written), which must
    # follow the clock as the first does.
    assert [lease(), lease()] == ["active", "active"]
    assert listed() == listed() == [(made["id"], "active", at(ENDS))]
    clock.at = ENDS - 24 * HOUR
    assert [lease(), lease()] == ["expiring", "expiring"]
    assert listed() == listed() == [(made["id"], "expiring", at(ENDS))]
    clock.at = ENDS
    assert [lease(), lease()] == ["expired", "expired"]
    assert listed() == listed() == [(made["id"], "expired", at(ENDS))]
    # One remembered answer per instance and viewer, each second's replacing the one before:
    # the memo does not fill with answers of seconds gone.
    assert cctx.store.write_mark.usable
    assert len(cctx.store._instance_memo._held) == 1
    assert len([k for k in cctx.store._list_memo._held if k[0] == "list"]) == 1


# -- renewals ----------------------------------------------------------------------------------------
def test_the_owner_renews_within_the_max_and_the_400_names_it(client, cctx, clock, people, made):
    owner, iid = people["owner"], made["id"]
    clock.at = T0 + 10 * HOUR
    [renewed] = ok(renew(client, owner, iid, hours=100))
    assert (renewed["expires-at"], renewed["lease"]) == (at(clock.at + 100 * HOUR), "active")
    assert cctx.store.find_instance(iid)["expires_at"] == at(clock.at + 100 * HOUR)
    r = renew(client, owner, iid, hours=120.5)
    assert r.status_code == 400
    assert r.json["msg"] == ("hours 120.5 is beyond the longest lease allowed: 120 hours ([leases] max)")
    assert cctx.store.find_instance(iid)["expires_at"] == at(clock.at + 100 * HOUR)  # unchanged
    # No hours: the default (2 days) from now.
    assert ok(renew(client, owner, iid))[0]["expires-at"] == at(clock.at + 48 * HOUR)
    assert actions(cctx, iid)[-3:] == [("renew", "success"), ("renew", "error"), ("renew", "success")]
    last = cctx.store.list_instance_actions(iid, visible_to=None)[-1]
    assert last["requester"] == owner.id and last["message"].startswith("lease renewed: the instance ends at")
    audit = [r for r in cctx.store.list_audit() if r["target"] == iid and "lease" in r["action"]]
    assert [r["result"] for r in audit] == ["200", "400", "200"]


@pytest.mark.parametrize("hours", [0, -1, "2", True, None, 87_601])
def test_bad_hours_are_400_and_change_nothing(client, cctx, clock, people, made, hours):
    r = renew(client, people["owner"], made["id"], hours=hours)
    assert r.status_code == 400, r.text
    assert cctx.store.find_instance(made["id"])["expires_at"] == at(ENDS)


def test_who_may_renew(client, cctx, clock, people, catalog):
    """The owner, a user who manages the owner, a superuser: yes. Anyone else does not see it (404)."""
    give_volume(client, people["managed"])
    [inst] = ok(boot(client, people["managed"], catalog), 201)
    for who, hours in (("managed", 1), ("owner", 2), ("admin", 3)):
        assert ok(renew(client, people[who], inst["id"], hours=hours))[0]["expires-at"] == at(T0 + hours * HOUR)
    err(renew(client, people["stranger"], inst["id"], hours=4), 404)
    err(renew(client, people["owner"], "00000000-0000-4000-8000-000000000000", hours=4), 404)
    assert cctx.store.find_instance(inst["id"])["expires_at"] == at(T0 + 3 * HOUR)
    requesters = [a["requester"] for a in cctx.store.list_instance_actions(inst["id"], visible_to=None)
                  if a["action"] == "renew"]
    assert requesters == [people["managed"].id, people["owner"].id, people["admin"].id]


def test_leases_off_the_instance_has_none_and_a_renewal_is_409(client, cctx, people, catalog):
    cctx.config = cctx.config.with_values({"leases": {"default": "", "max": "0"}})
    assert cctx.config.leases.default is None and cctx.config.leases.max is None
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    assert (inst["expires-at"], inst["lease"]) == (None, "none")
    r = renew(client, people["owner"], inst["id"], hours=1)
    assert r.status_code == 409 and "leases are off" in r.json["msg"]
    assert cctx.store.find_instance(inst["id"])["expires_at"] is None
    # The sweep has nothing to do and asks no host.
    before = cctx.adapters.hypervisor.host_calls
    assert leases.sweep(cctx) == [] and cctx.adapters.hypervisor.host_calls == before


# -- the admin's override ------------------------------------------------------------------------
def test_the_admin_sets_past_the_max_and_clears(cctx, clock, made):
    obj = leases.admin_lease(cctx, made["id"], hours=1000)
    assert obj["expires-at"] == at(T0 + 1000 * HOUR) and obj["lease"] == "active"
    hostname = cctx.store.find_instance(made["id"])["hostname"]
    assert leases.admin_lease(cctx, hostname, hours=None)["expires-at"] is None
    assert cctx.store.find_instance(made["id"])["expires_at"] is None
    messages = [a["message"] for a in cctx.store.list_instance_actions(made["id"], visible_to=None)
                if a["action"] == "renew"]
    assert messages == [f"lease set by an admin: the instance ends at {at(T0 + 1000 * HOUR)}",
                        "lease removed by an admin: the instance no longer ends"]
    # No lease: the sweep never acts on it, however late.
    clock.at = T0 + 10_000 * HOUR
    assert leases.sweep(cctx) == []


# -- the sweep: warnings, expiry, delete ---------------------------------------------------------
def test_warnings_go_out_once_each(cctx, clock, made):
    iid = made["id"]
    clock.at = ENDS - 25 * HOUR
    assert leases.sweep(cctx) == []
    clock.at = ENDS - 24 * HOUR
    assert [d["kind"] for d in leases.sweep(cctx)] == ["warning"]
    assert leases.sweep(cctx) == []
    clock.at = ENDS - 2 * HOUR
    assert leases.sweep(cctx) == []
    clock.at = ENDS - HOUR + 1
    assert [d["kind"] for d in leases.sweep(cctx)] == ["warning"]
    assert leases.sweep(cctx) == []
    assert [a for a, _ in actions(cctx, iid)].count("warning") == 2
    events = [(e["event"], e["step"]) for e in cctx.store.list_lease_events(iid)]
    assert events == [("warning", 24 * HOUR), ("warning", HOUR)]
    assert cctx.adapters.hypervisor.instances[iid].status == "running"


def test_a_missed_warning_is_recorded_with_the_nearest_one_sent_once(cctx, clock, made):
    """The controller was down through the 24 h mark: at 30 min before the end, one warning (1 h)."""
    clock.at = ENDS - 30 * 60
    assert [d["detail"] for d in leases.sweep(cctx)] == [f"1 hours before {at(ENDS)}"]
    assert [a for a, _ in actions(cctx, made["id"])].count("warning") == 1
    assert {e["step"] for e in cctx.store.list_lease_events(made["id"])} == {24 * HOUR, HOUR}
    assert leases.sweep(cctx) == []


def test_expiry_powers_off_once_and_a_power_on_is_409_until_renewed(client, cctx, clock, people, made):
    owner, iid = people["owner"], made["id"]
    hv = cctx.adapters.hypervisor
    clock.at = ENDS
    assert [d["kind"] for d in leases.sweep(cctx)] == ["expire"]
    assert hv.instances[iid].status == "shutoff" and cctx.store.find_instance(iid)["status"] == "shutoff"
    calls = hv.host_calls
    clock.at = ENDS + HOUR
    assert leases.sweep(cctx) == [] and hv.host_calls == calls  # done: the host is not even asked
    assert [a for a, _ in actions(cctx, iid)].count("expire") == 1
    expire = [a for a in cctx.store.list_instance_actions(iid, visible_to=None) if a["action"] == "expire"][0]
    assert expire["message"].startswith(f"the lease ended at {at(ENDS)}; powered off: obeyed")
    assert expire["requester"] is None
    audit = [r for r in cctx.store.list_audit() if r["action"] == "expire server-instance"]
    assert [(r["actor"], r["target"]) for r in audit] == [("lease sweep", iid)]
    for what in ("power-on", "reboot"):
        r = task(client, owner, iid, what)
        assert r.status_code == 409 and r.json["msg"] == f"lease expired at {at(ENDS)}; renew it first"
    assert hv.instances[iid].status == "shutoff"
    ok(renew(client, owner, iid, hours=2))
    assert ok(task(client, owner, iid, "power-on"))[0]["status"] == "running"
    # The new lease is a new lease: it expires again at its own end, once.
    clock.at = ENDS + 3 * HOUR
    assert [d["kind"] for d in leases.sweep(cctx) if d["kind"] == "expire"] == ["expire"]
    assert hv.instances[iid].status == "shutoff"


def test_a_renewal_before_the_end_cancels_the_expiry(client, cctx, clock, people, made):
    clock.at = ENDS - 10
    ok(renew(client, people["owner"], made["id"], hours=1))
    clock.at = ENDS + 60
    assert [d["kind"] for d in leases.sweep(cctx)] == ["warning"]  # the new lease's 1 h warning
    assert cctx.adapters.hypervisor.instances[made["id"]].status == "running"


def test_keep_after_the_end_the_instance_is_deleted_and_the_home_stays(client, cctx, clock, people, made):
    iid = made["id"]
    hv = cctx.adapters.hypervisor
    homes = cctx.adapters.homes.homes
    home = (homes["owner"].uid, homes["owner"].size_gb)
    clock.at = ENDS
    leases.sweep(cctx)
    clock.at = ENDS + 24 * HOUR - 1
    assert leases.sweep(cctx) == [] and iid in hv.list_instances()
    clock.at = ENDS + 24 * HOUR
    assert [d["kind"] for d in leases.sweep(cctx)] == ["delete"]
    assert hv.list_instances() == [] and hv.disks == {}
    assert cctx.store.find_instance(iid) is None
    assert leases.sweep(cctx) == []
    # The home is the owner's, not the instance's (its files on a real guest: tests/guests).
    assert (homes["owner"].uid, homes["owner"].size_gb) == home and cctx.adapters.homes.retired == {}
    err(client.simulate_get(f"/v1/server-instance/{iid}", headers=people["owner"].headers), 404)
    assert [e["event"] for e in cctx.store.list_lease_events(iid)][-2:] == ["expired", "deleted"]
    assert actions(cctx, iid)[-1] == ("delete", "success")
    audit = [r for r in cctx.store.list_audit() if r["action"] == "delete server-instance"]
    assert [(r["actor"], r["target"]) for r in audit] == [("lease sweep", iid)]


def test_a_host_that_fails_the_power_off_is_tried_again(cctx, clock, made):
    from common.errors import HostError

    hv = cctx.adapters.hypervisor
    hv.fail_on["shut_down"] = HostError("libvirt said no")
    hv.fail_on["power_off"] = HostError("libvirt said no")
    clock.at = ENDS
    assert [d for d in leases.sweep(cctx) if d["kind"] == "expire"] == []
    assert "expire" not in [a for a, _ in actions(cctx, made["id"])]
    hv.fail_on.clear()
    assert [d["kind"] for d in leases.sweep(cctx)] == ["expire"]
    assert hv.instances[made["id"]].status == "shutoff"


# -- notify_command ---------------------------------------------------------------------------------
def hook(tmp_path, body: str) -> str:
    path = tmp_path / "notify.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def notified(tmp_path, cctx):
    """A hook that appends each event's JSON to a file, one line each."""
    out = tmp_path / "events.jsonl"
    script = hook(tmp_path, f'cat >> {out}\necho >> {out}\n')
    cctx.config = cctx.config.with_values({"leases": {"notify_command": script}})

    def read():
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return read


@pytest.mark.real_commands
def test_each_event_is_handed_to_the_hook_once_with_what_it_needs(cctx, clock, people, made, notified):
    clock.at = ENDS - 24 * HOUR
    kinds = [d["kind"] for d in leases.sweep(cctx)]
    assert kinds == ["warning", "notify"]
    hostname = cctx.store.find_instance(made["id"])["hostname"]
    assert notified() == [{
        "event": "warning", "instance": {"id": made["id"], "hostname": hostname},
        "owner": {"email": people["owner"].email, "username": "owner"},
        "expires-at": at(ENDS), "renew": f"cloud server renew {hostname}"}]
    assert leases.sweep(cctx) == []
    clock.at = ENDS
    leases.sweep(cctx)
    clock.at = ENDS + 24 * HOUR
    leases.sweep(cctx)
    assert [e["event"] for e in notified()] == ["warning", "expired", "deleted"]
    assert all(e["notified_at"] for e in cctx.store.list_lease_events(made["id"]) if e["step"] != HOUR)


@pytest.mark.real_commands
def test_a_failing_hook_is_retried_at_the_next_sweep(tmp_path, cctx, clock, made):
    flag, out = tmp_path / "fail", tmp_path / "events"
    flag.write_text("")
    script = hook(tmp_path, f'[ -e {flag} ] && exit 3\ncat >> {out}\n')
    cctx.config = cctx.config.with_values({"leases": {"notify_command": script}})
    clock.at = ENDS - 24 * HOUR
    assert [d["kind"] for d in leases.sweep(cctx)] == ["warning", "notify-failed"]
    assert [d["kind"] for d in leases.sweep(cctx)] == ["notify-failed"]
    assert not out.exists()
    flag.unlink()
    assert [d["kind"] for d in leases.sweep(cctx)] == ["notify"]
    assert json.loads(out.read_text())["event"] == "warning"
    assert leases.sweep(cctx) == []
    # One warning in the history, however many tries the hook took.
    assert [a for a, _ in actions(cctx, made["id"])].count("warning") == 1


@pytest.mark.real_commands
def test_a_hanging_hook_is_ended_at_its_timeout_and_the_others_go_out(tmp_path, client, cctx, clock, people,
                                                                     catalog, made):
    give_volume(client, people["managed"])
    [other] = ok(boot(client, people["managed"], catalog), 201)
    out = tmp_path / "events"
    # Hangs (with a child of its own) for the owner's instance; quick for the other.
    script = hook(tmp_path, f'payload=$(cat)\ncase "$payload" in *{made["id"]}*) sleep 60 & wait;; esac\n'
                            f'echo "$payload" >> {out}\n')
    cctx.config = cctx.config.with_values({"leases": {"notify_command": script, "notify_timeout_seconds": "1"}})
    clock.at = ENDS - 24 * HOUR
    began = time.monotonic()
    done = leases.sweep(cctx)
    assert time.monotonic() - began < 10
    assert sorted((d["kind"], d["instance"]) for d in done) == sorted([
        ("warning", made["id"]), ("warning", other["id"]),
        ("notify-failed", made["id"]), ("notify", other["id"])])
    assert [json.loads(line)["instance"]["id"] for line in out.read_text().splitlines()] == [other["id"]]
    # Its `sleep` went with it: no process of the hook is left.
    assert "sleep 60" not in os.popen("ps -eo args").read()


# -- reconcile and metrics -------------------------------------------------------------------------
def test_reconcile_reports_what_the_sweep_has_not_done_and_fix_does_it(cctx, clock, made):
    clock.at = ENDS - 24 * HOUR
    assert [(d["kind"], d["target"]) for d in reconcile(cctx)] == [("lease-warning", made["id"])]
    clock.at = ENDS
    assert [(d["kind"], d["target"]) for d in reconcile(cctx)] == [("lease-expire", made["id"])]
    fixed = reconcile(cctx, fix=True)
    assert [(d["kind"], d["fixed"]) for d in fixed] == [("lease-expire", True)]
    assert cctx.adapters.hypervisor.instances[made["id"]].status == "shutoff"
    assert reconcile(cctx) == []
    clock.at = ENDS + 24 * HOUR
    assert [(d["kind"], d["target"]) for d in reconcile(cctx)] == [("lease-delete", made["id"])]
    assert [d["fixed"] for d in reconcile(cctx, fix=True)] == [True]
    assert cctx.store.find_instance(made["id"]) is None


def test_metrics_count_the_leases_near_and_past_their_end(client, cctx, clock, people, catalog, made):
    from controller.storage import images

    short = images.add_flavor(cctx, name="short", memory=512, disk=2, vcpu=1, lease_default="3h")
    give_volume(client, people["managed"])
    ok(boot(client, people["managed"], catalog, **{"server-flavor": short["id"]}), 201)

    def gauges():
        families = scrape(cctx)
        return {name: value(families, name) for name in ("instances_expiring", "instances_expired")}

    assert gauges() == {"instances_expiring": 1, "instances_expired": 0}
    clock.at = T0 + 3 * HOUR
    assert gauges() == {"instances_expiring": 0, "instances_expired": 1}
    clock.at = ENDS - HOUR
    assert gauges() == {"instances_expiring": 1, "instances_expired": 1}
    clock.at = ENDS
    assert gauges() == {"instances_expiring": 0, "instances_expired": 2}


# -- what a sweep with nothing due costs ------------------------------------------------------------
def test_the_due_leases_are_read_by_the_index(cctx):
    db = sqlite3.connect(cctx.config.database_path)
    plan = " ".join(str(r) for r in db.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? "
        "AND intent IS NULL", ("2030",)))
    db.close()
    assert "instances_expires" in plan, plan


def test_a_sweep_with_nothing_due_reads_no_instance_and_asks_no_host(cctx, clock, made, monkeypatch):
    hv = cctx.adapters.hypervisor
    before = hv.host_calls
    reads = []
    real = cctx.store.find_instance
    monkeypatch.setattr(cctx.store, "find_instance", lambda *a, **k: reads.append(a) or real(*a, **k))
    assert leases.sweep(cctx) == []
    assert hv.host_calls == before and reads == []
    assert cctx.store.leases_due(at(T0 + 24 * HOUR)) == []
