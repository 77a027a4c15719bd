"""Stored instance statuses brought to their hosts' view before a list is read.

Instance lists are encoded by SQLite from the stored rows (store.iter_instance_json),
so the stored status must be what the host says. Each host's Hypervisor tells what
changed since the cursor of the last sync (controller/status_cursors.py;
status_changes: at most one call to the host, none once libvirt's lifecycle events
keep its statuses) and only those rows are written. The whole view is compared again at least every WHOLE_CHECK_SECONDS,
so a status written by another process with an older view (a restored backup, say)
does not stay wrong.
"""

import time

from controller.context import Context
from controller.hosts.host_routing import each_host, hypervisor_of_host

WHOLE_CHECK_SECONDS = 60.0
# How long a list waits for a host whose statuses another list is reading (a slow host):
# past it, that host's rows answer the status last stored, which that read is about to
# bring up to date.
BUSY_WAIT_SECONDS = 1.0


def sync_statuses(ctx: Context, host_names: list[str]) -> set[str]:
    """Write the current status of the live instances of these hosts where it changed;
    return the hosts that did not answer (their rows show "error", unwritten: the stored
    state is the last one known, kept for when they answer).

    The hosts no other thread is reading are read at once, together. A host another
    thread is reading is waited for at most BUSY_WAIT_SECONDS in all, then read again
    (cheap: its cursor is fresh); past that its rows keep the status last stored."""
    state = ctx.status_cursors
    names = list(dict.fromkeys(host_names))
    free = [n for n in names if state.lock_of(n).acquire(blocking=False)]
    try:
        unreachable = _sync(ctx, free)
    finally:
        for name in free:
            state.lock_of(name).release()
    deadline = time.monotonic() + BUSY_WAIT_SECONDS
    for name in names:
        if name in free:
            continue
        lock = state.lock_of(name)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            continue  # still being read: the rows answer the stored status
        try:
            unreachable |= _sync(ctx, [name])
        finally:
            lock.release()
    return unreachable


def _sync(ctx: Context, host_names: list[str]) -> set[str]:
    """sync_statuses of hosts whose locks the caller holds."""
    state = ctx.status_cursors
    unreachable: set[str] = set()
    if not host_names:
        return unreachable
    now = time.monotonic()

    def changes(name: str):
        cursor, whole_at = state.cursors.get(name, (None, now))
        return hypervisor_of_host(ctx, name).status_changes(
            cursor if now - whole_at <= WHOLE_CHECK_SECONDS else None)

    for name, answer in each_host(host_names, changes).items():
        if isinstance(answer, Exception):  # the ControllerError each_host caught
            unreachable.add(name)
            continue
        cursor, statuses, whole = answer
        if whole:
            ctx.store.sync_host_statuses(name, statuses)
        elif statuses:
            ctx.store.set_live_instance_statuses(
                {i: status or "error" for i, status in statuses.items()}, host=name)
        # Only changes come back for a cursor this process holds: the host has one.
        state.cursors[name] = (cursor, now if whole else state.cursors[name][1])
    return unreachable
