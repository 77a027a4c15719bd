"""Leases through crashes and races (issue 42): real `cloud-agent serve` processes on one
database, a real libvirtd of this session's own (tests/fixtures/remote_libvirtd.py) running
blank-disk instances (QEMU starts, no guest boots: the power-off is forced at once, as
`[guest] shutdown_timeout_seconds = 0` says), leases of a few seconds set by the admin's
`cloud-agent server lease ID --hours H`.

- The controller SIGKILLed just before an instance's lease ends and started after it: the
  instance is powered off within `[leases] check_seconds` of the start (the sweep runs at
  once), and once: later sweeps leave it alone.
- Two `serve` processes on one database, both sweeping every second: each instance is
  expired once and deleted once (`keep` later): one history entry, one lease event and one
  audit row of each; the domains are gone.

The sweep's rules on fake hosts are in tests/instances/test_leases.py; the real guest's
clean power-off in tests/guests/test_guest_e2e.py.
"""

import os
import signal
import sqlite3
import time

import pytest

from controller.hosts.host_routing import hypervisor_of_host
from tests.fixtures.api import enable, make_caller
from tests.fixtures.server import start_server, stop_server
from tests.server.test_faults import Deployment, base_values

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

CHECK_SECONDS = 2


def lease_values(tmp_path, guest_virt, sysroot, remote, network, **leases) -> dict:
    values = base_values(tmp_path, guest_virt, sysroot, remote, network)
    # Leases on (a day by default), warnings long before the short leases the admin sets.
    values["leases"] = {"default": "1d", "warn": "24h", "keep": "1h", "check_seconds": str(CHECK_SECONDS),
                        **leases}
    return values


def owner_with_home(d: Deployment, name: str) -> dict:
    caller = make_caller(d.ctx, f"{name}@example.org")
    enable(d.ctx, caller, username=name)
    status, _, body = d.http.call("POST", "/v1/storage-volume", {"volume-size": 1, "volume-type": {
        "visibility": "cluster"}}, headers=caller.headers, timeout=60)
    assert status == 201, body
    return caller.headers


def create(d: Deployment, headers: dict) -> str:
    status, _, body = d.http.call("POST", "/v1/server-instance", {"server-image": d.image, "server-flavor": d.flavor},
                                  headers=headers, timeout=120)
    assert status == 201, body
    return body["data"][0]["id"]


def lease_for(d: Deployment, instance_id: str, seconds: float) -> str:
    _, obj = d.agent("server", "lease", instance_id, "--hours", f"{seconds / 3600:.6f}")
    return obj["expires-at"]


def rows(d: Deployment, sql: str, *params) -> list[tuple]:
    with sqlite3.connect(f"file:{d.db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(sql, params).fetchall()


def history(d: Deployment, instance_id: str, action: str) -> int:
    return rows(d, "SELECT count(*) FROM instance_actions WHERE instance_id = ? AND action = ?",
                instance_id, action)[0][0]


def domain_status(d: Deployment, instance_id: str) -> str:
    return hypervisor_of_host(d.ctx, "default").status(instance_id)


def wait_for(what, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(step)
    return what()


def test_a_lease_that_ended_while_the_controller_was_down_is_expired_once_at_its_start(
        tmp_path, remote_libvirtd, libvirt_private_network, guest_virt, sysroot):
    d = Deployment(tmp_path, lease_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network))
    try:
        d.catalog()
        d.start()
        headers = owner_with_home(d, "lk")
        iid = create(d, headers)
        assert domain_status(d, iid) == "running"
        lease_for(d, iid, 4)
        # Killed before the end: no sweep of its saw the lease end.
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(timeout=10)
        time.sleep(6)
        assert domain_status(d, iid) == "running" and history(d, iid, "expire") == 0
        d.start()
        started = time.monotonic()
        assert wait_for(lambda: history(d, iid, "expire") == 1, CHECK_SECONDS + 3), d.log.read_text()
        assert time.monotonic() - started <= CHECK_SECONDS + 3
        assert domain_status(d, iid) == "shutoff"
        # Three more sweeps: still once.
        time.sleep(3 * CHECK_SECONDS)
        assert history(d, iid, "expire") == 1
        assert rows(d, "SELECT event FROM lease_events WHERE instance_id = ? AND event != 'warning'", iid) == [
            ("expired",)]
        # The owner's power-on is refused with the end it passed.
        [(ends,)] = rows(d, "SELECT expires_at FROM instances WHERE id = ?", iid)
        status, _, body = d.http.call("PUT", f"/v1/server-instance/{iid}", {"task": {"what": "power-on"}},
                                      headers=headers, timeout=60)
        assert (status, body["msg"]) == (409, f"lease expired at {ends}; renew it first")
        assert domain_status(d, iid) == "shutoff"
    finally:
        d.close(("default",))


def test_two_servers_on_one_database_expire_and_delete_each_instance_once(
        tmp_path, remote_libvirtd, libvirt_private_network, guest_virt, sysroot):
    d = Deployment(tmp_path, lease_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network,
                                          keep="4s", check_seconds="1"))
    second = None
    try:
        d.catalog()
        d.start()
        headers = owner_with_home(d, "lt")
        made = [create(d, headers) for _ in range(2)]
        second, _ = start_server(d.config_path, tmp_path / "second.log")
        for iid in made:
            lease_for(d, iid, 3)
        gone = wait_for(lambda: rows(d, "SELECT count(*) FROM instances")[0][0] == 0, 40, step=0.5)
        assert gone, d.log.read_text() + (tmp_path / "second.log").read_text()
        time.sleep(3)  # more sweeps of both
        for iid in made:
            assert (history(d, iid, "expire"), history(d, iid, "delete")) == (1, 1)
            events = rows(d, "SELECT event FROM lease_events WHERE instance_id = ? AND event != 'warning' "
                             "ORDER BY id", iid)
            assert events == [("expired",), ("deleted",)]
            audit = rows(d, "SELECT action FROM audit WHERE target = ? AND actor = 'lease sweep' ORDER BY rowid", iid)
            assert audit == [("expire server-instance",), ("delete server-instance",)]
        listed = hypervisor_of_host(d.ctx, "default").list_instances()
        assert not set(made) & set(listed)
    finally:
        if second is not None:
            stop_server(second)
        d.close(("default",))
