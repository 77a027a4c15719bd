"""The audit trail: who did what to which target, with what result, and when.

Rows carry ids, route names and status codes only; request bodies never reach
the audit, so no password or secret can. Anonymous failed requests are counted
in memory and written as one aggregate row per interval (AnonymousFailures), and
rows older than `[audit] retention_days` are pruned (prune_before, Housekeeper).
"""

import logging
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

from controller.audit import history, request_ids
from controller.store import Store, utc_now

log = logging.getLogger(__name__)


def record(store: Store, *, actor: str, action: str, target: str = "", result: str, detail: str = "",
           request_id: str | None = None) -> None:
    """One audit row; `request_id` defaults to the id of the request or command being served."""
    if request_id is None:
        request_id = request_ids.current() or ""
    try:
        store.insert_audit(
            {"at_utc": utc_now(), "actor": actor, "action": action, "target": target, "result": result,
             "detail": detail[:500], "request_id": request_id}
        )
    except sqlite3.Error as e:
        # The action itself already happened; losing its audit row must not turn it into an error.
        log.error("could not write the audit row for %s %s: %s", action, target, e)


def list_entries(store: Store, *, since: str | None = None, actor: str | None = None, limit: int = 1000) -> list[dict]:
    return store.list_audit(since=since, actor=actor, limit=limit)


# -- anonymous failures -----------------------------------------------------------
ANONYMOUS_ACTION = "anonymous failed requests"
# Distinct (action, result) pairs kept per window; routes and statuses are few, so this only
# bounds memory should that ever change.
_MAX_KINDS = 200


class AnonymousFailures:
    """Counts failed requests that carry no identity (bad logins, 401s) per window in memory.

    Anyone can send them, as fast as the network allows: one row each would let a
    stranger grow the database without bound and bury the rows that matter. Instead
    each window becomes one row (actor `anonymous`, action ANONYMOUS_ACTION, result
    the total, detail the count per route and status), written by the first count or
    flush_if_due() after the window ends, and by flush() at shutdown.
    """

    def __init__(self, store: Store, *, interval_seconds: int, clock=time.monotonic):
        self.store = store
        self.interval = interval_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._window_started = self._clock()
        self._window_started_utc = utc_now()

    def count(self, action: str, result: str) -> None:
        key = (action, result)
        with self._lock:
            if key not in self._counts and len(self._counts) >= _MAX_KINDS:
                key = ("(other)", result)
            self._counts[key] = self._counts.get(key, 0) + 1
        self.flush_if_due()

    def pending(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def flush_if_due(self) -> bool:
        if self._clock() - self._window_started < self.interval:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Write the window's counts as one row (none when nothing was counted); start a new window."""
        with self._lock:
            counts, self._counts = self._counts, {}
            started = self._window_started_utc
            self._window_started, self._window_started_utc = self._clock(), utc_now()
        if not counts:
            return False
        kinds = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        record(
            self.store,
            actor="anonymous",
            action=ANONYMOUS_ACTION,
            result=str(sum(counts.values())),
            # Most frequent first, so the 500-character bound drops the rarest.
            detail=f"since {started}: " + ", ".join(f"{action} {result} x{n}" for (action, result), n in kinds),
            request_id="",  # many requests in one row
        )
        return True


# -- retention ----------------------------------------------------------------------
def cutoff_for_days(days: int, *, now: datetime | None = None) -> str:
    """The RFC 3339 time `days` days ago."""
    at = (now or datetime.now(timezone.utc)) - timedelta(days=days)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def prune_before(store: Store, before: str) -> int:
    """Delete the rows older than `before` (RFC 3339 UTC), and the instance history's with
    them (it is kept for the audit retention), and the leases' events; how many audit rows went."""
    history.prune_before(store, before)
    store.delete_lease_events_before(before)
    return store.delete_audit_before(before)


class Housekeeper:
    """What a serving process does now and then, on a thread of its own (started by
    `cloud-agent serve`): write the anonymous-failure counts when their window ends, and
    apply `[audit] retention_days` at start and then once an hour."""

    PRUNE_EVERY_SECONDS = 3600

    def __init__(self, *, store: Store, anonymous: AnonymousFailures, retention_days: int,
                 tick_seconds: float = 60, clock=time.monotonic):
        self.store = store
        self.anonymous = anonymous
        self.retention_days = retention_days
        self.tick = tick_seconds
        self._clock = clock
        self._next_prune = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> int:
        """One round; the number of rows pruned."""
        self.anonymous.flush_if_due()
        pruned = 0
        if self.retention_days > 0 and self._clock() >= self._next_prune:
            self._next_prune = self._clock() + self.PRUNE_EVERY_SECONDS
            pruned = prune_before(self.store, cutoff_for_days(self.retention_days))
            if pruned:
                log.info("audit retention: pruned %d rows older than %d days", pruned, self.retention_days)
        return pruned

    def _run(self) -> None:
        # A first round at start: retention applies as soon as the server runs.
        while True:
            try:
                self.run_once()
            except sqlite3.Error as e:
                # A busy or broken database now is retried at the next tick; the service goes on.
                log.error("audit housekeeping failed: %s", e)
            if self._stop.wait(self.tick):
                break
        self.store.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="audit-housekeeping", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and write what is still counted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.anonymous.flush()
