"""Health checks shared by GET /healthz and `cloud-agent check`: each check bounded in
time, and for the service the last result kept fresh by one background thread.

A backend that stops answering (an LDAP server that accepts and never replies, a
hung libvirtd or cluster filesystem) must not hold request threads: GET /healthz
answers from HealthMonitor's last result and never runs or waits on a check, and
every check runs on a thread of its own for at most `[health] check_timeout_seconds`.
See docs/decisions.md, "/healthz from the last result".
"""

import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable

from controller.hosts import host_routing
from controller.context import Context
from controller.errors import ControllerError
from controller.security.crypto import SecretBox

log = logging.getLogger(__name__)

# `cloud-agent check`'s guest start: QEMU starts (and the probe is destroyed) in a
# second or two; a slow host under emulation gets more than the other checks.
GUEST_START_SECONDS = 60

Check = tuple[str, Callable[[], None]]


def run_checks(ctx: Context, *, thorough: bool = False, runner: "CheckRunner | None" = None) -> list[dict]:
    """Every check the service depends on, each {"name", "ok", "detail"}.

    thorough (the agent's `check`) adds what costs a real guest start: whether
    QEMU starts a guest with the configured virt_type and cpu_mode; and, on a local
    QEMU host, whether its virtiofsd can confine a home's share to the home's owner.
    """
    runner = runner or CheckRunner(ctx.config.health.check_timeout_seconds)
    checks: list[Check] = [
        ("database", ctx.store.ping),
        # Read the key file anew: a key deleted under a running service must show here,
        # not only at the next restart.
        ("secret_key", lambda: SecretBox(ctx.config.auth.secret_key_file)),
    ]
    if ctx.cloud_auth is not None:
        checks.append(("cloud_auth", ctx.cloud_auth.check))
    if ctx.adapters is not None:
        checks.extend(ctx.adapters.checks())
    results = runner.run(checks)
    if ctx.adapters is not None and thorough:
        results += runner.run([("guest_start", ctx.adapters.hypervisor.probe_guest)],
                              timeout=max(runner.timeout, GUEST_START_SECONDS))
        if ctx.adapters.shares is not None:
            # Passes whether or not shares can be confined: it says which holds here.
            results += runner.run([("virtiofs", ctx.adapters.shares.describe)])
        # Each host is asked in parallel and given [hosts] connect_timeout_seconds.
        results += _other_hosts(ctx)
    return results


def _result(name: str, fn: Callable[[], "str | None"]) -> dict:
    try:
        said = fn()  # a check that passes may say something worth knowing
        return {"name": name, "ok": True, "detail": said if isinstance(said, str) else ""}
    except (ControllerError, sqlite3.Error, OSError) as e:
        return failed(name, getattr(e, "message", None) or str(e))
    except Exception as e:  # noqa: BLE001 - an unexpected error is a failed check, not a lost one
        log.exception("health check %s raised", name)
        return failed(name, f"{type(e).__name__}: {e}")


def failed(name: str, detail: str) -> dict:
    return {"name": name, "ok": False, "detail": detail}


class CheckRunner:
    """Runs checks at once, each on a thread of its own, and waits at most `timeout`
    seconds for them.

    A check that overruns is reported failed ("timed out") and left to finish on its
    thread: Python cannot stop a thread blocked in a socket or a system call. Until it
    finishes that check is not started again (it is reported "still running"), so a
    hung backend holds one thread, not one more per round.
    """

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # check name -> when its run started

    def run(self, checks: list[Check], *, timeout: float | None = None) -> list[dict]:
        limit = self.timeout if timeout is None else timeout
        started = time.monotonic()
        results: dict[str, dict] = {}
        waiting = []
        for name, fn in checks:
            with self._lock:
                since = self._running.get(name)
                if since is None:
                    self._running[name] = started
            if since is not None:
                results[name] = failed(name, f"timed out: still running after {started - since:.0f} s")
                continue
            box: dict = {}
            done = threading.Event()
            threading.Thread(target=self._one, args=(name, fn, box, done), name=f"health check {name}",
                             daemon=True).start()
            waiting.append((name, box, done))
        for name, box, done in waiting:
            if done.wait(max(0.0, started + limit - time.monotonic())):
                results[name] = box["result"]
            else:
                results[name] = failed(name, f"timed out after {limit:g} s")
        return [results[name] for name, _ in checks]

    def _one(self, name: str, fn: Callable[[], None], box: dict, done: threading.Event) -> None:
        try:
            box["result"] = _result(name, fn)
        finally:
            with self._lock:
                self._running.pop(name, None)
            done.set()


class HealthMonitor:
    """The last result of a round of checks, refreshed every `refresh` seconds by one
    daemon thread.

    current() never runs a check: it copies a reference under a lock. A result older
    than `stale_after` (the refresher has stopped or is stuck) turns every check failed,
    so a hung refresher never shows as an old "ok". Only before the very first round has
    finished does current() wait, at most `first_wait` seconds; `cloud-agent serve`
    finishes that round before it accepts connections.
    """

    def __init__(self, round_: Callable[[], list[dict]], *, refresh: float, check_timeout: float,
                 clock: Callable[[], float] = time.monotonic):
        self._round = round_
        self.refresh = refresh
        # A round lasts at most check_timeout; allow a few to be late before calling it stale.
        self.stale_after = 3 * (refresh + check_timeout)
        self.first_wait = check_timeout + 1
        self._clock = clock
        self._lock = threading.Lock()
        self._round_lock = threading.Lock()
        self._last: tuple[float, list[dict]] | None = None
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, wait: bool = False) -> None:
        """Start the refresher (once); with wait, until its first round is in."""
        with self._lock:
            if self._thread is None:
                # The thread holds the monitor weakly: a monitor dropped unstopped (tests'
                # apps) lets its thread end after the round in progress.
                self._thread = threading.Thread(target=_refresh_loop, args=(weakref.ref(self), self._stop),
                                                name="health-refresher", daemon=True)
                self._thread.start()
        if wait:
            self._first.wait(self.first_wait)

    def stop(self) -> None:
        self._stop.set()

    def refresh_now(self) -> list[dict]:
        """Run one round and keep its result (the refresher's step)."""
        with self._round_lock:  # one round at a time, whoever asks
            checks = self._round()
        with self._lock:
            previous = self._last[1] if self._last else []
            self._last = (self._clock(), checks)
        _log_changes(previous, checks)
        self._first.set()
        return checks

    def current(self) -> list[dict] | None:
        """The last result (None: no round has finished yet)."""
        self.start()
        if not self._first.is_set():
            self._first.wait(self.first_wait)
        with self._lock:
            last = self._last
        if last is None:
            return None
        age = self._clock() - last[0]
        if age > self.stale_after:
            return [failed(c["name"], f"no fresh result for {age:.0f} s") for c in last[1]]
        return last[1]


def _refresh_loop(ref: "weakref.ref[HealthMonitor]", stop: threading.Event) -> None:
    while not stop.is_set():
        monitor = ref()
        if monitor is None:
            return
        try:
            monitor.refresh_now()
        except Exception:  # noqa: BLE001 - the refresher must outlive one bad round
            log.exception("a round of health checks failed")
        pause = monitor.refresh
        del monitor
        if stop.wait(pause):
            return


def _log_changes(before: list[dict], checks: list[dict]) -> None:
    """The details go to the service log, once per change, for the operator."""
    was = {c["name"]: c["detail"] for c in before if not c["ok"]}
    for c in checks:
        if not c["ok"] and was.get(c["name"]) != c["detail"]:
            log.warning("health check %s failed: %s", c["name"], c["detail"])


_MONITOR_LOCK = threading.Lock()


def monitor_of(ctx: Context) -> HealthMonitor:
    """The context's monitor, GET /healthz answers from (made on first use); its refresher
    starts at the first probe, or before serving (`cloud-agent serve`)."""
    if ctx.health_monitor is None:
        with _MONITOR_LOCK:
            if ctx.health_monitor is None:
                ctx.health_monitor = monitor_for(ctx)
    return ctx.health_monitor


def monitor_for(ctx: Context) -> HealthMonitor:
    """The service's monitor: the checks of run_checks under one CheckRunner, so a
    check that hangs is not started again while it runs."""
    timeout = ctx.config.health.check_timeout_seconds
    runner = CheckRunner(timeout)

    def round_() -> list[dict]:
        if ctx.adapters is not None and ctx.adapters.hosts is not None:
            # Hosts in their back-off are asked again here, off the request threads and bounded
            # like a check (its result is not reported: `host list` and `check` show hosts).
            pool = ctx.adapters.hosts

            def try_again(name: str) -> None:
                host_routing.hypervisor_of_host(ctx, name)  # built from its record if this process never used it
                pool.try_again(name)

            runner.run([(f"retry host {name}", lambda n=name: try_again(n)) for name in pool.in_back_off()])
        return run_checks(ctx, runner=runner)

    return HealthMonitor(round_, refresh=ctx.config.health.refresh_seconds, check_timeout=timeout)


def _other_hosts(ctx: Context) -> list[dict]:
    """One check per hypervisor host besides the config's own (checked as "libvirt"):
    reachable, its storage pool, its network. Whether the cluster filesystem holding
    [volumes] home_root is mounted there libvirt cannot tell: the detail says so."""
    try:
        own = host_routing.record_config_host(ctx).name
        rows = [r for r in ctx.store.list_hosts() if r["name"] != own]
    except (ControllerError, sqlite3.Error):
        return []  # no host records to read: the database check above says why
    home_root = ctx.config.volumes.home_root
    answers = host_routing.each_host((r["name"] for r in rows),
                                     lambda name: host_routing.hypervisor_of_host(ctx, name).check())
    out = []
    for row in rows:
        got = answers[row["name"]]
        note = (f"{home_root} not checked there (libvirt cannot see a node's filesystems): the cluster "
                "filesystem must be mounted at that path, with virtiofsd installed and the same uids")
        if isinstance(got, ControllerError):
            out.append({"name": f"host {row['name']}", "ok": False, "detail": f"{row['uri']}: {got.message}"})
        else:
            out.append({"name": f"host {row['name']}", "ok": True,
                        "detail": f"{row['uri']}: reachable, pool {row['storage_pool']} and network "
                                  f"{row['network']} usable{'' if row['enabled'] else ' (disabled)'}; {note}"})
    return out
