"""Issue 25 on fake host adapters: reboot and power-off are clean first, forced after
`[guest] shutdown_timeout_seconds`, and each history entry says which; a second power task
during one is 409; the host gate holds slow power tasks while reads go on; the config key.

The real guest is in tests/guests/test_guest_e2e.py; a blank disk on the real libvirtd
(no OS hears the power button) is tests/hypervisor/test_hypervisor_kvm.py."""

import re
import threading
import time

import pytest

from controller.config import config_from_dict
from controller.errors import InvalidInput
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401 (people: a fixture)
from tests.fixtures.api import config_values_for, give_volume

OBEYED = "obeyed: the guest shut down when asked (ACPI power button) within 0 s"


@pytest.fixture
def config_values(tmp_path):
    values = config_values_for(tmp_path)
    # Two host workers, no queue: a second host operation while two run is 503 at once.
    values["server"].update({"host_workers": 2, "host_queue": 0, "host_queue_seconds": 1})
    values["guest"]["shutdown_timeout_seconds"] = 7
    return values


@pytest.fixture
def running(client, people, catalog):
    give_volume(client, people["owner"])
    return ok(boot(client, people["owner"], catalog), 201)[0]


def task(client, caller, instance_id, what, **more):
    return client.simulate_put(f"/v1/server-instance/{instance_id}", headers=caller.headers,
                               json={"task": {"what": what, **more}})


def last_action(client, caller, instance_id) -> dict:
    return ok(client.simulate_get(f"/v1/server-instance/{instance_id}/actions", headers=caller.headers))[-1]


def test_a_guest_that_obeys_is_recorded_as_obeyed(client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    assert ok(task(client, owner, iid, "reboot"))[0]["status"] == "running"
    entry = last_action(client, owner, iid)
    assert (entry["action"], entry["result"], entry["message"]) == ("reboot", "success",
                                                                    OBEYED + ", then started again")
    assert ok(task(client, owner, iid, "power-off"))[0]["status"] == "shutoff"
    assert adapters.hypervisor.instances[iid].status == "shutoff"
    assert last_action(client, owner, iid)["message"] == OBEYED
    # Already shut off: nothing to ask, and it says so.
    ok(task(client, owner, iid, "power-off"))
    assert last_action(client, owner, iid)["message"] == "it was already shutoff; nothing to shut down"


def test_a_guest_that_ignores_the_power_button_is_forced_and_recorded_so(client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    hv = adapters.hypervisor
    hv.ignores_acpi.add(iid)
    waits = []
    real = type(hv).shut_down

    def watching(self, instance_id, *, wait_seconds):
        waits.append(wait_seconds)
        return real(self, instance_id, wait_seconds=wait_seconds)

    hv.shut_down = watching.__get__(hv)
    forced = ("forced: the guest did not shut down within 7 s of being asked "
              "([guest] shutdown_timeout_seconds); it was powered off hard")
    assert ok(task(client, owner, iid, "reboot"))[0]["status"] == "running"
    assert last_action(client, owner, iid)["message"] == forced + ", then started again"
    assert ok(task(client, owner, iid, "power-off"))[0]["status"] == "shutoff"
    assert waits == [7] and hv.instances[iid].status == "shutoff"
    entry = last_action(client, owner, iid)
    assert (entry["action"], entry["result"], entry["message"]) == ("power-off", "success", forced)


def test_a_paused_guest_is_forced_at_once_and_recorded_so(client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    adapters.hypervisor.instances[iid].status = "paused"
    assert ok(task(client, owner, iid, "power-off"))[0]["status"] == "shutoff"
    assert last_action(client, owner, iid)["message"] == (
        "forced: it was paused and could not hear the power button; it was powered off hard")


def test_a_timeout_of_0_is_a_hard_power_off_at_once(cctx, client, adapters, people, running):
    owner, iid = people["owner"], running["id"]
    cctx.config = cctx.config.with_values({"guest": {"shutdown_timeout_seconds": "0"}})
    ok(task(client, owner, iid, "power-off"))
    assert last_action(client, owner, iid)["message"] == (
        "forced: [guest] shutdown_timeout_seconds is 0, so it was not asked; it was powered off hard")


@pytest.fixture
def held_reboot(adapters):
    """The fake host holds every reboot until `go` is set (a guest taking its time to shut down)."""
    go = threading.Event()
    adapters.hypervisor.slow_on["reboot"] = go
    yield go
    go.set()


def _in_thread(results: dict, name: str, call) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.setdefault(name, call()))
    thread.start()
    return thread


def _wait_for_calls(hv, step: str, n: int) -> None:
    deadline = time.monotonic() + 10
    while hv.calls[step] < n:
        assert time.monotonic() < deadline, f"{step} never reached the host"
        time.sleep(0.01)


def test_a_second_power_task_during_one_is_409_at_once(client, adapters, people, running, held_reboot):
    owner, iid = people["owner"], running["id"]
    results = {}
    first = _in_thread(results, "first", lambda: task(client, owner, iid, "reboot"))
    try:
        _wait_for_calls(adapters.hypervisor, "reboot", 1)
        for what, more in (("reboot", {}), ("power-off", {}), ("power-on", {}),
                           ("modify-users", {"how": "add", "users": []})):
            started = time.monotonic()
            message = err(task(client, owner, iid, what, **more), 409)
            assert time.monotonic() - started < 2, what  # refused, never waiting the first out
            assert re.fullmatch(rf"server-instance {iid} is busy: a reboot is in progress \(since [0-9TZ:-]+\); "
                                "try again once it has ended", message), message
            entry = last_action(client, owner, iid)
            assert (entry["action"], entry["result"], entry["message"]) == (what, "error", message)
        assert adapters.hypervisor.calls["reboot"] == 1 and adapters.hypervisor.calls["shut_down"] == 0
    finally:
        held_reboot.set()
        first.join(10)
    assert ok(results["first"])[0]["status"] == "running"
    entry = last_action(client, owner, iid)
    assert (entry["action"], entry["result"]) == ("reboot", "success")
    # Once it has ended, the next one runs.
    ok(task(client, owner, iid, "power-off"))
    assert adapters.hypervisor.instances[iid].status == "shutoff"


def test_slow_power_tasks_are_held_by_the_host_gate_and_reads_go_on(client, cctx, adapters, people, catalog,
                                                                     held_reboot):
    """Two host workers and no queue: two reboots waiting on their guests hold both; a third
    host operation is 503 at once (nothing done), and reads answer meanwhile."""
    owner = people["owner"]
    give_volume(client, owner)
    ids = [ok(boot(client, owner, catalog), 201)[0]["id"] for _ in range(3)]
    results = {}
    threads = [_in_thread(results, i, lambda i=i: task(client, owner, i, "reboot")) for i in ids[:2]]
    try:
        _wait_for_calls(adapters.hypervisor, "reboot", 2)
        started = time.monotonic()
        r = task(client, owner, ids[2], "power-off")
        assert time.monotonic() - started < 1.0
        assert r.status_code == 503 and "too many host operations" in r.json["msg"], r.json
        assert adapters.hypervisor.instances[ids[2]].status == "running"
        assert client.simulate_get("/v1/server-flavor", headers=owner.headers).status_code == 200
        assert ok(client.simulate_get(f"/v1/server-instance/{ids[2]}", headers=owner.headers))[0]["status"] == \
            "running"
    finally:
        held_reboot.set()
        for t in threads:
            t.join(10)
    assert [ok(results[i])[0]["status"] for i in ids[:2]] == ["running", "running"]


@pytest.mark.parametrize("value, fine", [("0", True), ("60", True), ("600", True), ("601", False),
                                         ("-1", False), ("soon", False), ("1.5", False)])
def test_the_shutdown_timeout_key_is_checked(tmp_path, value, fine):
    values = config_values_for(tmp_path)
    values["guest"]["shutdown_timeout_seconds"] = value
    if fine:
        assert config_from_dict(values).guest.shutdown_timeout_seconds == int(value)
    else:
        with pytest.raises(InvalidInput, match=r"\[guest\] shutdown_timeout_seconds"):
            config_from_dict(values)


def test_the_shutdown_timeout_defaults_to_60(tmp_path):
    values = config_values_for(tmp_path)
    values["guest"].pop("shutdown_timeout_seconds", None)
    assert config_from_dict(values).guest.shutdown_timeout_seconds == 60


def test_user_apply_shuts_guests_down_cleanly_before_it_starts_them(cctx, adapters, people, running):
    """`cloud-agent user apply`'s power cycle is no pulled plug either: the same clean shutdown."""
    from controller.instances import guests

    hv = adapters.hypervisor
    rows = cctx.store.list_instances(visible_to=None, instance_id=running["id"])
    [result] = guests.apply_to_instances(cctx, rows, may_cycle={running["id"]})
    assert result["cycled"] is True and result["status"] == "running"
    assert (hv.calls["shut_down"], hv.calls["power_off"], hv.calls["power_on"]) == (1, 0, 1)
