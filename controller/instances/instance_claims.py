"""One claim per instance on its host state, across processes.

Whatever changes where or how an instance runs takes its claim first and lets it go when
done: a move (`cloud-agent host drain`), an evacuation (`host evacuate`), a power task or a
change of its users (the API), a refresh of its guest after a user change, `cloud-agent
user apply`. The claim is one row per instance taken by compare-and-set (store.py
take_instance_claim: an INSERT that does nothing when a row is there), so two processes
(the service and `cloud-agent`) never work on one instance at once: the second is told
what is in progress (Conflict, HTTP 409) instead of, say, powering on a guest whose disk is
being copied, or rebuilding from its image an instance whose move left a checked copy.

The holder is named by its process: pid, the kernel's start time of that pid, and the
machine's boot id. A claim whose process is gone (a crash, a kill, a reboot) is stale: the
next taker replaces it by compare-and-set on its token, and `reconcile --fix` removes it.
What the dead holder left half way is in the moves and evacuations records, which the
claim does not replace (they say where the disk is; the claim says who is working on it).

A user change (deactivated, groups, home) arriving while the claim is held cannot wait for
a disk copy: the refresher marks the claim (`refresh_wanted`) and the holder rebuilds the
guest from the database before it lets go, so no change is lost (store.py
release_instance_claim clears the mark and keeps the claim in one transaction).
"""

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

from controller.context import Context
from controller.errors import Conflict, ControllerError, NotFound
from controller.store import utc_now

log = logging.getLogger(__name__)

# What each operation is called in a refusal ("... is busy: <this> is in progress").
OPERATIONS = {
    "move": "a move to another host by an admin (`cloud-agent host drain`)",
    "abandon": "an admin's abandon of its move (`cloud-agent host drain --abandon`)",
    "evacuation": "a rebuild on another host by an admin (`cloud-agent host evacuate`)",
    "power-on": "a power-on",
    "power-off": "a power-off",
    "reboot": "a reboot",
    "modify-users": "a change of its users",
    "guest-refresh": "an update of its guest after a change of its users",
    "user-apply": "an admin's `cloud-agent user apply`",
    "delete": "a delete",
    "expire": "the power-off at the end of its lease",
    "lease-delete": "the delete after its lease ended",
}
# How many times a holder rebuilds the guest for refreshes asked while it works before it lets
# go anyway (reconcile compares the seeds and shares with the database and repairs the rest).
MAX_REFRESHES = 3


@dataclass(frozen=True)
class Claim:
    instance_id: str
    operation: str
    token: str


def claim(ctx: Context, instance_id: str, operation: str) -> Claim:
    """Take the instance's claim for `operation` (a key of OPERATIONS). Conflict naming the
    operation in progress while a live process holds it; NotFound when there is no such
    instance. A dead process's claim is taken over (compare-and-set on its token)."""
    mine = dict(_me(), instance_id=instance_id, operation=operation, token=uuid.uuid4().hex,
                claimed_at_utc=utc_now())
    replacing = None
    for _attempt in range(3):  # a race with another taker of the same dead claim is retried
        taken, held = ctx.store.take_instance_claim(mine, replacing=replacing)
        if taken:
            if replacing is not None:
                log.warning("instance %s: took over the claim of a process that is gone (%s)", instance_id,
                            replacing)
            return Claim(instance_id, operation, mine["token"])
        if held is None:
            raise NotFound(f"server-instance {instance_id} does not exist")
        if holder_alive(held):
            raise Conflict(busy_message(held))
        replacing = held["token"]
    raise Conflict(f"server-instance {instance_id} is busy: its claim changed hands while it was taken; try again")


def release(ctx: Context, taken: Claim, *, refresh: Callable[[], None] | None) -> None:
    """Let the claim go. Refreshes of the guest asked meanwhile are done first with
    `refresh()` (None: this holder cannot; the claim goes and reconcile repairs the guest)."""
    for _round in range(MAX_REFRESHES):
        if ctx.store.release_instance_claim(taken.instance_id, taken.token):
            return
        if refresh is None:
            break
        try:
            refresh()
        except ControllerError as e:
            log.warning("instance %s: guest not updated after %s (reconcile will): %s", taken.instance_id,
                        taken.operation, e.message)
            break
    ctx.store.drop_instance_claim(taken.instance_id, taken.token)


@contextmanager
def held(ctx: Context, instance_id: str, operation: str, *,
         refresh: Callable[[], None] | None) -> Iterator[Claim]:
    """claim() for the block, release() after it however it ends."""
    taken = claim(ctx, instance_id, operation)
    try:
        yield taken
    finally:
        release(ctx, taken, refresh=refresh)


def defer_refresh(ctx: Context, instance_id: str) -> bool:
    """Ask the holder of the instance's claim to rebuild its guest before it lets go (True);
    False when nobody holds it (the caller claims it and refreshes itself)."""
    return ctx.store.want_guest_refresh(instance_id)


def refuse_while_moving(ctx: Context, instance_id: str) -> None:
    """Conflict while a move or an evacuation of the instance is recorded and not finished
    (its holder may have died: the record stays until it is finished or abandoned). A
    power-on then would run a guest on a disk being copied, or a copy the row does not name."""
    if ctx.store.list_moves(instance_id=instance_id):
        raise Conflict(f"server-instance {instance_id} is being moved to another host by an admin; "
                       "try again once it is there")
    if any(e["instance_id"] == instance_id for e in ctx.store.list_evacuations()):
        raise Conflict(f"server-instance {instance_id} is being rebuilt on another host by an admin; "
                       "try again once it is there")


def busy_message(held: dict) -> str:
    what = OPERATIONS.get(held["operation"], held["operation"])
    return (f"server-instance {held['instance_id']} is busy: {what} is in progress (since "
            f"{held['claimed_at_utc']}); try again once it has ended")


def stale_claims(ctx: Context) -> list[dict]:
    """The claims whose process is gone (for reconcile)."""
    return [c for c in ctx.store.list_instance_claims() if not holder_alive(c)]


def drop_stale(ctx: Context, held: dict) -> None:
    """Remove a dead process's claim, if it is still that one and still dead."""
    if holder_alive(held):
        raise Conflict(busy_message(held))
    ctx.store.drop_instance_claim(held["instance_id"], held["token"])


# -- who holds a claim ------------------------------------------------------------------------
def holder_alive(held: dict) -> bool:
    """Whether the process that took a claim still runs. Another boot of this machine: gone.
    Another machine (a database its processes do not share should not happen): assumed alive,
    never taken from it. Else the pid must run with the start time recorded (a reused pid
    is another process)."""
    me = _me()
    if held["machine"] != me["machine"]:
        return True
    if held["boot_id"] != me["boot_id"]:
        return False
    return _proc_start(held["pid"]) == held["proc_start"]


@cache
def _machine() -> tuple[str, str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = "unknown"
    return socket.gethostname(), boot_id


def _me() -> dict:
    machine, boot_id = _machine()
    pid = os.getpid()  # read each time: a forked worker is another holder
    return {"pid": pid, "proc_start": _proc_start(pid) or "unknown", "boot_id": boot_id, "machine": machine}


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of process `pid` (clock ticks since boot, field 22 of
    /proc/PID/stat), or None when no such process runs (a zombie has ended)."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow its last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]
