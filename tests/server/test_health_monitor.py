"""The health cache (issue 16, finding 2): checks bounded in time, and a probe that answers
from the last result without running or waiting on a check.

Fake checks block on events the test controls; nothing here measures speed.
"""

import threading
import time

from controller.errors import HostUnavailable
from controller.monitoring.health import CheckRunner, HealthMonitor, run_checks


class SlowCheck:
    """A check that blocks until released, failing or passing as told; counts its runs."""

    def __init__(self):
        self.release = threading.Event()
        self.inside = threading.Semaphore(0)
        self.runs = 0
        self.error: Exception | None = None

    def __call__(self):
        self.runs += 1
        self.inside.release()
        assert self.release.wait(30), "the test never released the check"
        if self.error is not None:
            raise self.error


def quick():
    pass


def test_an_overrunning_check_is_reported_timed_out_and_not_started_again_while_it_runs():
    slow = SlowCheck()
    runner = CheckRunner(timeout=0.05)
    first = runner.run([("database", quick), ("directory", slow)])
    assert first[0] == {"name": "database", "ok": True, "detail": ""}
    assert first[1] == {"name": "directory", "ok": False, "detail": "timed out after 0.05 s"}
    # Still blocked: the next round names it failed again, without a second run piling up.
    [again] = runner.run([("directory", slow)])
    assert not again["ok"] and again["detail"].startswith("timed out: still running after")
    assert slow.runs == 1
    slow.release.set()
    deadline = time.monotonic() + 10
    while runner.run([("directory", slow)], timeout=10)[0]["detail"].startswith("timed out: still"):
        assert time.monotonic() < deadline, "the finished run was never forgotten"
    assert slow.runs == 2
    assert runner.run([("directory", slow)], timeout=10) == [{"name": "directory", "ok": True, "detail": ""}]


def test_an_unexpected_error_is_a_failed_check_not_a_lost_round():
    def broken():
        raise KeyError("boom")

    [result] = CheckRunner(timeout=5).run([("quota_backend", broken)])
    assert result == {"name": "quota_backend", "ok": False, "detail": "KeyError: 'boom'"}


def test_a_probe_gets_the_last_result_while_a_round_is_stuck():
    slow = SlowCheck()
    slow.release.set()
    runner = CheckRunner(timeout=30)
    monitor = HealthMonitor(lambda: runner.run([("directory", slow)]), refresh=1, check_timeout=30)
    assert monitor.refresh_now() == [{"name": "directory", "ok": True, "detail": ""}]
    assert slow.inside.acquire(timeout=0)  # that round's run

    slow.release.clear()
    slow.error = HostUnavailable("LDAP server does not answer")
    stuck = threading.Thread(target=monitor.refresh_now, daemon=True)
    stuck.start()
    assert slow.inside.acquire(timeout=10)
    # The round is inside the check; the probe answers from the last result meanwhile.
    assert monitor.current() == [{"name": "directory", "ok": True, "detail": ""}]
    assert stuck.is_alive() and not slow.release.is_set()
    slow.release.set()
    stuck.join(10)
    assert monitor.current() == [{"name": "directory", "ok": False, "detail": "LDAP server does not answer"}]


def test_a_stale_result_turns_every_check_failed():
    now = [100.0]
    monitor = HealthMonitor(lambda: [{"name": "database", "ok": True, "detail": ""},
                                     {"name": "libvirt", "ok": True, "detail": ""}],
                            refresh=2, check_timeout=5, clock=lambda: now[0])
    # No refresher thread: on a loaded machine its round could land between the
    # clock moves below; this test makes each round itself.
    monitor.stop()
    monitor.refresh_now()
    now[0] += monitor.stale_after
    assert all(c["ok"] for c in monitor.current())
    now[0] += 1
    assert [(c["name"], c["ok"]) for c in monitor.current()] == [("database", False), ("libvirt", False)]
    assert monitor.current()[0]["detail"] == f"no fresh result for {monitor.stale_after + 1:.0f} s"
    monitor.refresh_now()
    assert all(c["ok"] for c in monitor.current())


def test_before_the_first_round_a_probe_waits_a_bounded_time_and_gets_no_result():
    slow = SlowCheck()
    monitor = HealthMonitor(lambda: CheckRunner(timeout=30).run([("libvirt", slow)]), refresh=1, check_timeout=30)
    monitor.first_wait = 0.05
    try:
        assert monitor.current() is None  # the refresher's first round is stuck in the check
        assert slow.runs == 1
    finally:
        slow.release.set()
        monitor.stop()


def test_the_refresher_picks_up_a_recovery_without_a_restart():
    state = {"ok": False}

    def directory():
        if not state["ok"]:
            raise HostUnavailable("LDAP server unavailable")

    runner = CheckRunner(timeout=5)
    monitor = HealthMonitor(lambda: runner.run([("directory", directory)]), refresh=0.01, check_timeout=5)
    monitor.start(wait=True)
    try:
        assert monitor.current()[0]["ok"] is False
        state["ok"] = True
        deadline = time.monotonic() + 10
        while not monitor.current()[0]["ok"]:
            assert time.monotonic() < deadline, "the refresher never ran again"
            time.sleep(0.01)
    finally:
        monitor.stop()


def test_the_service_checks_run_under_the_configured_bound(cctx, adapters):
    """run_checks gives a hung adapter check [health] check_timeout_seconds, then names it."""
    slow = SlowCheck()
    adapters.directory.check = slow
    runner = CheckRunner(timeout=0.05)
    try:
        results = {c["name"]: c for c in run_checks(cctx, runner=runner)}
        assert results["directory"] == {"name": "directory", "ok": False, "detail": "timed out after 0.05 s"}
        assert results["database"]["ok"] and results["libvirt"]["ok"]
    finally:
        slow.release.set()
