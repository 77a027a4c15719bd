"""The statuses of a host's instances: read in one call, kept current by libvirt's lifecycle
events, or served from a short-lived snapshot where a driver has no events.

Lists of instances ask for every status at once (Hypervisor.statuses); with
10,000 domains a full read costs the server 80-250 ms of CPU, so it is read once
per connection and then follows the host's lifecycle events (_LiveStatuses).
"""

import functools
import logging
import threading
import time

from common.errors import HostUnreachable
from host_adapters.libvirt.connection import _code, _connection_lost, _libvirt, _msg
from host_adapters.names import Names, check_id

log = logging.getLogger(__name__)


def status_of(state: int, reason: int) -> str:
    """Map a libvirt (state, reason) pair to one of STATUSES."""
    lv = _libvirt()
    if state == lv.VIR_DOMAIN_NOSTATE:
        return "building"
    if state in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED):
        return "running"
    if state == lv.VIR_DOMAIN_PAUSED:
        # QEMU domains are paused while they start, before the vCPUs run.
        return "building" if reason == lv.VIR_DOMAIN_PAUSED_STARTING_UP else "paused"
    if state == lv.VIR_DOMAIN_PMSUSPENDED:
        return "paused"
    if state == lv.VIR_DOMAIN_SHUTDOWN:
        return "shutoff"
    if state == lv.VIR_DOMAIN_SHUTOFF:
        if reason == lv.VIR_DOMAIN_SHUTOFF_CRASHED:
            return "crashed"
        if reason == lv.VIR_DOMAIN_SHUTOFF_FAILED:
            return "error"
        return "shutoff"
    if state == lv.VIR_DOMAIN_CRASHED:
        return "crashed"
    return "error"


def status_of_event(event: int, detail: int, current: str | None) -> str | None:
    """A domain's status after a lifecycle event (None: it has no domain any more)."""
    lv = _libvirt()
    if event == lv.VIR_DOMAIN_EVENT_UNDEFINED:
        return None
    if event == lv.VIR_DOMAIN_EVENT_DEFINED:
        return current or "shutoff"  # a new definition of a running domain keeps it running
    if event in (lv.VIR_DOMAIN_EVENT_STARTED, lv.VIR_DOMAIN_EVENT_RESUMED):
        return "running"
    if event in (lv.VIR_DOMAIN_EVENT_SUSPENDED, lv.VIR_DOMAIN_EVENT_PMSUSPENDED):
        return "paused"
    if event == lv.VIR_DOMAIN_EVENT_CRASHED:
        return "crashed"
    if event == lv.VIR_DOMAIN_EVENT_STOPPED:
        if detail == lv.VIR_DOMAIN_EVENT_STOPPED_CRASHED:
            return "crashed"
        if detail == lv.VIR_DOMAIN_EVENT_STOPPED_FAILED:
            return "error"
        return "shutoff"
    return current  # SHUTDOWN (a guest shutting down stops next) and the rest change nothing


class _LiveStatuses:
    """The statuses of one connection's instances, kept current by its lifecycle events.

    Events that come before the first full read are held and applied after it, in
    order: each is at least as new as what the read saw, so the end state is right.

    The adapter's own changes are set at once (set()), read from the domain, and pinned:
    events arrive late on a loaded host, and one from before the change (the STARTED of
    an earlier power-on, the DEFINED of a create) would otherwise show an old status, or
    bring a destroyed instance back, until the later events caught up. While pinned, an
    event that disagrees with the pin is held rather than shown; the first event that
    agrees (the change's own, events coming in order) ends the pin, and a pin that meets
    no such event within PIN_SECONDS yields to what the events said meanwhile.
    """

    # Changes remembered for status_changes(); a caller further behind takes the whole map.
    JOURNAL_MAX = 4096
    PIN_SECONDS = 10.0

    def __init__(self, conn, names: Names):
        self.conn, self._names = conn, names
        self._statuses: dict[str, str] | None = None
        self._pending: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()
        # The ids changed, in order: change number n is _journal[n - _base].
        self._journal: list[str] = []
        self._base = 0
        # Whether the connection's close callback is ours, and whether it was called.
        self.watched = self.closed = False
        # Our own changes (id -> (status, until)) and what disagreeing events said meanwhile.
        self._pins: dict[str, tuple[str | None, float]] = {}
        self._held: dict[str, str | None] = {}
        self.clock = time.monotonic

    def start(self, statuses: dict[str, str]) -> None:
        with self._lock:
            self._statuses = statuses
            for instance_id, event, detail in self._pending:
                self._apply(instance_id, status_of_event(event, detail, statuses.get(instance_id)))
            self._pending = []

    def event(self, domain_name: str, event: int, detail: int) -> None:
        instance_id = self._names.instance_of_domain(domain_name)
        if not instance_id:
            return
        with self._lock:
            if self._statuses is None:
                self._pending.append((instance_id, event, detail))
                return
            new = status_of_event(event, detail, self._statuses.get(instance_id))
            pin = self._pins.get(instance_id)
            if pin is not None and pin[1] >= self.clock():
                if event not in _telling_events():
                    return  # it says nothing of its own (DEFINED, SHUTDOWN...): the pin stands
                if new != pin[0]:
                    self._held[instance_id] = new  # older than our change, or overtaken by it
                    return
                self._unpin(instance_id)  # our change's own event: events are current again
            elif pin is not None:
                self._expire_pin(instance_id)
            self._apply(instance_id, new)

    def set(self, instance_id: str, status: str | None) -> None:
        with self._lock:
            if self._statuses is not None:
                self._apply(instance_id, status)
                self._pins[instance_id] = (status, self.clock() + self.PIN_SECONDS)
                self._held.pop(instance_id, None)

    def _unpin(self, instance_id: str) -> None:
        self._pins.pop(instance_id, None)
        self._held.pop(instance_id, None)

    def _expire_pin(self, instance_id: str) -> None:
        """A pin no event agreed with in time: what the events said meanwhile is shown."""
        self._pins.pop(instance_id, None)
        if instance_id in self._held:
            self._apply(instance_id, self._held.pop(instance_id))

    def _expire_pins(self) -> None:
        # Called with the lock held, by every read while pins exist (rarely more than a few).
        now = self.clock()
        for instance_id in [i for i, (_, until) in self._pins.items() if until < now]:
            self._expire_pin(instance_id)

    def _apply(self, instance_id: str, status: str | None) -> None:
        if status is None:
            self._statuses.pop(instance_id, None)
        else:
            self._statuses[instance_id] = status
        self._journal.append(instance_id)
        if len(self._journal) > self.JOURNAL_MAX:
            drop = len(self._journal) // 2
            del self._journal[:drop]
            self._base += drop

    def changes(self, since: object | None) -> tuple[object, dict[str, str | None], bool]:
        """status_changes() of these statuses: a mark is (this object, change number)."""
        with self._lock:
            if self._pins:
                self._expire_pins()
            mark = (self, self._base + len(self._journal))
            if not (isinstance(since, tuple) and since[0] is self and since[1] >= self._base):
                return mark, dict(self._statuses), True
            changed = set(self._journal[since[1] - self._base:])
            return mark, {i: self._statuses.get(i) for i in changed}, False

    def get(self, instance_id: str) -> str:
        if self._pins:  # the common case (no change of ours in the last seconds) takes no lock
            with self._lock:
                self._expire_pins()
        return self._statuses.get(instance_id, "error")

    def copy(self) -> dict[str, str]:
        with self._lock:
            if self._pins:
                self._expire_pins()
            return dict(self._statuses)


@functools.cache
def _telling_events() -> tuple[int, ...]:
    """The lifecycle events that say what a domain's status is now (the others keep it)."""
    lv = _libvirt()
    return (lv.VIR_DOMAIN_EVENT_UNDEFINED, lv.VIR_DOMAIN_EVENT_STARTED, lv.VIR_DOMAIN_EVENT_RESUMED,
            lv.VIR_DOMAIN_EVENT_SUSPENDED, lv.VIR_DOMAIN_EVENT_PMSUSPENDED, lv.VIR_DOMAIN_EVENT_CRASHED,
            lv.VIR_DOMAIN_EVENT_STOPPED)


def _on_lifecycle(_conn, dom, event, detail, live: _LiveStatuses) -> None:
    # Runs in the event loop thread: no libvirt call here (the name is held by the object).
    live.event(dom.name(), event, detail)


def _on_close(_conn, _reason, live: _LiveStatuses) -> None:
    # The connection is gone (keepalive failed, the daemon went away): its statuses no
    # longer follow the host; the next call opens a new connection and reads them again.
    live.closed = True


class StatusesPart:
    """The statuses of LibvirtHypervisor (driver.py): status(), statuses(), status_changes()."""

    def _init_statuses(self, status_max_age: float) -> None:
        # statuses() answers from a snapshot at most status_max_age seconds old (0: none).
        self._status_max_age = status_max_age
        self._snapshot: tuple[float, dict[str, str]] | None = None  # shared: read only
        # Statuses kept current by libvirt's lifecycle events, for the connection that
        # registered them; None until the first statuses() (or on a driver without events).
        self._live: _LiveStatuses | None = None
        self._no_events = False
        self._snapshot_lock = threading.Lock()
        self._generation = 0

    def status(self, instance_id: str) -> str:
        check_id(instance_id, "instance id")
        # Kept by events, or set up now if not yet (no list was read on this connection
        # yet, as on a host that only serves GETs and creates): one full read, rather than
        # ask for this domain. Asking makes two calls to the host, and during a burst of
        # creates each waited seconds behind them in libvirtd (docs/performance.md).
        if not self._no_events:
            live = self._live_statuses()
            if live is not None:
                return live.get(instance_id)
        # A fresh snapshot of statuses() answers too (same age rule, dropped by our own
        # changes): it saves the domain look-up, and each libvirt call hands the GIL over.
        snap = self._snapshot
        if snap is not None and time.monotonic() - snap[0] <= self._status_max_age:
            return snap[1].get(instance_id, "error")

        def op(conn):
            dom = self._domain(conn, instance_id)
            return "error" if dom is None else status_of(*dom.state())

        return self._call(f"status of instance {instance_id}", op)

    def statuses(self) -> dict[str, str]:
        # getAllDomainStats is one call, but it makes a Python object per domain: with
        # 10,000 domains each read costs 80-250 ms of the server's CPU, whatever the
        # list's length. So it is read once per connection and kept current by lifecycle
        # events (_live_statuses). Without events, a snapshot serves the lists of the next
        # status_max_age seconds; this adapter's own changes drop it (_changed), so only
        # changes made outside the controller show up that much later.
        live = self._live_statuses()
        if live is not None:
            return live.copy()
        if self._status_max_age <= 0:
            return self._read_statuses()
        snap = self._snapshot
        if snap is not None and time.monotonic() - snap[0] <= self._status_max_age:
            return snap[1]
        # One refresh at a time. While one runs, the others answer from the snapshot it
        # replaces (a moment older) rather than wait; with none (dropped by a change of
        # ours, or the first list) they wait for the new one.
        if not self._snapshot_lock.acquire(blocking=snap is None):
            return snap[1]
        try:
            snap = self._snapshot
            if snap is None or time.monotonic() - snap[0] > self._status_max_age:
                generation = self._generation
                snap = (time.monotonic(), self._read_statuses())
                # Kept only if no change of ours happened while it was read (it may predate it).
                if generation == self._generation:
                    self._snapshot = snap
            return snap[1]
        finally:
            self._snapshot_lock.release()

    def status_changes(self, since: object | None) -> tuple[object, dict[str, str | None], bool]:
        live = self._live_statuses()
        if live is not None:
            return live.changes(since)
        # Without events: each snapshot is whole; the same one again has no change.
        statuses = self.statuses()
        if isinstance(since, tuple) and since[0] == "snapshot" and since[1] is statuses:
            return since, {}, False
        return ("snapshot", statuses), statuses, True

    def _changed(self, instance_id: str) -> None:
        """Our own change of an instance's domain: the next statuses() asks the host, and
        the event-kept statuses learn it now rather than when its event arrives (a list
        right after a power-off shows it)."""
        self._generation += 1
        self._snapshot = None
        live = self._live
        if live is None:
            return
        lv = _libvirt()
        try:
            dom = live.conn.lookupByName(self._names.domain(instance_id))
            live.set(instance_id, status_of(*dom.state()))
        except lv.libvirtError as e:
            if _code(e) == lv.VIR_ERR_NO_DOMAIN:
                live.set(instance_id, None)
            else:
                self._live = None  # unsure: the next statuses() reads them all again

    def _live_statuses(self) -> "_LiveStatuses | None":
        """The event-kept statuses of the current connection, set up on first use: the
        callback first, then one full read, then the events that came meanwhile, in order.
        None on a driver without lifecycle events (statuses() then reads snapshots).

        Statuses whose connection's close callback watches it are used without a call to
        the host, not even isAlive(): each libvirt call hands the GIL over, the dearest part
        of a GET or a list under load, and a list made it while holding its host's sync
        lock, so the host's other lists queued behind the hand-over. A connection that
        closes says so through that callback (_on_close); one without it is checked."""
        live = self._live
        if live is not None and live.watched and not live.closed and live.conn is self._conn:
            return live
        conn = self._connection()
        if live is not None and live.conn is conn:
            return live
        if self._no_events:
            return None
        lv = _libvirt()
        with self._snapshot_lock:
            live = self._live
            if live is not None and live.conn is conn:
                return live
            live = _LiveStatuses(conn, self._names)
            try:
                conn.domainEventRegisterAny(None, lv.VIR_DOMAIN_EVENT_ID_LIFECYCLE, _on_lifecycle, live)
            except lv.libvirtError as e:
                if _connection_lost(e):
                    self._forget(conn)
                    raise HostUnreachable(f"statuses of instances: lost the connection to libvirt at "
                                          f"{self.uri}: {_msg(e)}") from e
                log.info("libvirt at %s gives no lifecycle events (%s): statuses are read per list",
                         self.uri, _msg(e))
                self._no_events = True
                return None
            try:
                conn.registerCloseCallback(_on_close, live)
                live.watched = True
            except lv.libvirtError as e:
                log.info("libvirt at %s has no close callback (%s): status() checks the connection",
                         self.uri, _msg(e))
            live.start(self._read_statuses())
            self._live = live
            return live

    def _read_statuses(self) -> dict[str, str]:
        def op(conn):
            lv = _libvirt()
            # One RPC for every domain's state; the name travels with each domain object.
            found = {}
            for dom, stats in conn.getAllDomainStats(lv.VIR_DOMAIN_STATS_STATE):
                instance_id = self._names.instance_of_domain(dom.name())
                if instance_id:
                    found[instance_id] = status_of(stats.get("state.state", lv.VIR_DOMAIN_NOSTATE),
                                                   stats.get("state.reason", 0))
            return found

        return self._call("statuses of instances", op)
