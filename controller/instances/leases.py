"""Instance leases: an instance ends unless its owner renews it (docs/leases.md).

A lease is one date, the instance's `expires_at`, set at the create from the flavor's
`lease-default` or `[leases] default`, moved by a renewal (at most the flavor's `lease-max`
or `[leases] max` from now; an admin's `cloud-agent server lease` is not bounded), or
cleared by the admin. Off (no date anywhere) unless a default or a max is configured.

The sweep (`cloud-agent serve` every `[leases] check_seconds`, at once at its start, and
`cloud-agent reconcile --fix`) acts on the leases near or past their end, read by the index
on expires_at (none near: no row read, no host asked):
- a warning at each `[leases] warn` before the end: a history entry `warning`;
- at the end the instance is powered off as `power-off` does (the guest asked first) and
  its history says `expire`;
- `[leases] keep` after the end it is deleted as a DELETE does (domain, disks, addresses;
  the homes and groups are not the instance's), with history `delete` and an audit row.
Each is done once per lease whatever the processes, crashes and restarts: it is recorded in
lease_events under a UNIQUE key, in the same transaction as its history entry, after the
host work (so a crash before the record does the work again, which is harmless: a power-off
of a stopped instance, a delete under the instance's intent), and the host work runs under
the instance's claim, so a second process never does it at the same time.

Each event is handed to the site's `[leases] notify_command` (one JSON object on stdin),
bounded by `notify_timeout_seconds`, retried at the next sweep after a failure, for at most
NOTIFY_GIVE_UP_SECONDS. Every instance's work and every hook runs on a small pool, each
bounded: one failing or slow one never holds up the others.
"""

import json
import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor

from common.errors import CommandError
from common.words import shown
from controller import permissions as perms
from controller.audit import history, request_ids
from controller.audit import trail as audit
from controller.config import LeasesConfig
from controller.context import Context
from controller.errors import Conflict, ControllerError, InvalidInput, NotFound
from controller.hosts.host_routing import hypervisor_of_instance
from controller.instances import instance_claims, power_tasks
from controller.instances.instances import delete_claimed, get_instance
from controller.instances.lease_terms import rfc3339, seconds_of, terms
from controller.locks import host_changes
from controller.lookups import account_of, instance_row, require_mutate
from controller.permissions import Requester
from controller.store import utc_now
from host_adapters import subp

log = logging.getLogger(__name__)

# The longest lease anyone may ask for (10 years): past it a date is no lease.
MAX_HOURS = 87_600
# A notification not taken by notify_command within this long after its event is given up
# (logged): the hook is broken, and the events keep coming.
NOTIFY_GIVE_UP_SECONDS = 86_400
# Instances and hooks acted on at once by one sweep.
SWEEP_WORKERS = 8
# Events handed to notify_command by one sweep (the rest at the next).
NOTIFY_PER_SWEEP = 100
# Who did what the sweep did, in the audit.
AUDIT_ACTOR = "lease sweep"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} hours"


def _limit_source(flavor: dict) -> str:
    if flavor.get("lease_max_seconds"):
        return f"server-flavor {flavor['name']}'s lease-max"
    return "[leases] max"


# -- renewals ------------------------------------------------------------------------------
def renew(ctx: Context, requester: Requester, instance_id: str, hours: float | None) -> dict:
    """Move the instance's end to now + hours (None: the flavor's or [leases] default). For its
    owner, a user who manages the owner, or a superuser (404 for anyone who does not see it,
    403 for one who sees it without the right); 400 beyond the max, naming it; 409 when
    leases are off for it. Recorded in its history (`renew`)."""

    row = instance_row(ctx, requester, instance_id)
    with history.recorded(ctx, row, "renew", requester=requester.id) as outcome:
        require_mutate(ctx, requester, row, "this server-instance")
        flavor = ctx.store.get_flavor(row["flavor_id"]) or {}
        default, longest = terms(ctx, flavor)
        if default is None and longest is None:
            raise Conflict("leases are off on this cluster: this server-instance has no lease to renew"
                           + (" (an admin set its end: ask one to change it)" if row.get("expires_at") else ""))
        if hours is None:
            seconds = default or longest
        else:
            seconds = _seconds_of_hours(hours)
            if longest is not None and seconds > longest:
                raise InvalidInput(f"hours {hours:g} is beyond the longest lease allowed: {_hours(longest)} "
                                   f"({_limit_source(flavor)})")
        outcome.message = _set(ctx, row, ctx.clock() + seconds)
    return get_instance(ctx, requester, row["id"])


def admin_lease(ctx: Context, instance: str, *, hours: float | None) -> dict:
    """The admin's `cloud-agent server lease ID (--hours H | --never)` (an instance id or
    hostname): the end set to now + hours whatever the max and whether leases are on, or
    cleared (hours None). Recorded in its history (`renew`, no requester)."""

    row = _live_instance(ctx, instance)
    with history.recorded(ctx, row, "renew", requester=None) as outcome:
        if hours is None:
            if not ctx.store.set_instance_lease(row["id"], None):
                raise Conflict(f"server-instance {row['id']} is being created or deleted")
            outcome.message = "lease removed by an admin: the instance no longer ends"
        else:
            outcome.message = _set(ctx, row, ctx.clock() + _seconds_of_hours(hours), by_admin=True)
    return get_instance(ctx, ADMIN, row["id"])


# An admin command reads as a superuser does.
ADMIN = Requester(id="", roles=frozenset({perms.SUPERUSER}))


def _live_instance(ctx: Context, given: str) -> dict:
    """A live instance by id or hostname, for an admin command; NotFound otherwise."""
    rows = ctx.store.list_instances(visible_to=None, instance_id=given)
    if not rows:
        rows = [r for r in ctx.store.list_instances(visible_to=None) if r["hostname"] == given]
    if len(rows) != 1:
        raise NotFound(f"server-instance {shown(given)} does not exist (give its id or hostname)")
    return rows[0]


def _seconds_of_hours(hours: float) -> int:
    if not (isinstance(hours, (int, float)) and not isinstance(hours, bool)) or not 0 < hours <= MAX_HOURS:
        raise InvalidInput(f"hours must be a number above 0 and at most {MAX_HOURS}")
    return max(1, math.ceil(hours * 3600))


def _set(ctx: Context, row: dict, ends: float, *, by_admin: bool = False) -> str:
    expires_at = rfc3339(ends)
    if not ctx.store.set_instance_lease(row["id"], expires_at):
        raise Conflict(f"server-instance {row['id']} is being created or deleted")
    return f"lease {'set by an admin' if by_admin else 'renewed'}: the instance ends at {expires_at}"


# -- the sweep -------------------------------------------------------------------------------
def sweep(ctx: Context) -> list[dict]:
    """One pass over the leases near or past their end, then the notifications due: what this
    process did, as {"kind", "instance", "detail"} (kinds: warning, expire, delete, notify,
    notify-failed). Never raises for one instance or hook: its failure is logged and it is tried
    again at the next pass."""
    now = ctx.clock()
    jobs = [_job_of(ctx, row, step) for row, step in _steps_due(ctx, now)]
    done: list[dict] = []
    if jobs:
        done += _run_all(jobs)
    pending = ctx.store.unnotified_lease_events(rfc3339(now), limit=NOTIFY_PER_SWEEP)
    if pending:
        done += _run_all([lambda e=e: _notify(ctx, e) for e in pending])
    return done


def _steps_due(ctx: Context, now: float) -> list[tuple[dict, tuple[str, list[int]]]]:
    """The leases near or past their end (read by the index) with what each asks of the
    sweep now; the one place that decides it, for the sweep and for reconcile's report."""
    config = ctx.config.leases
    horizon = now + (config.warn[0] if config.warn else 0)
    found = []
    for row in ctx.store.leases_due(rfc3339(horizon)):
        step = _step(config, row, now)
        if step is not None:
            found.append((row, step))
    return found


def _step(config: LeasesConfig, row: dict, now: float) -> tuple[str, list[int]] | None:
    """("delete", []), ("expire", []), ("warning", the warnings due) or None (nothing yet)."""
    ends = seconds_of(row["expires_at"])
    if "expired:0" in row["done"]:
        return ("delete", []) if now >= ends + config.keep else None
    if now >= ends:
        return ("expire", [])
    # Warnings due and not sent: the nearest one is sent; any earlier one missed (the
    # controller was down, or the lease began inside it) is recorded with it, unsent.
    due = [w for w in config.warn if now >= ends - w and f"warning:{w}" not in row["done"]]
    return ("warning", due) if due else None


def _job_of(ctx: Context, row: dict, step: tuple[str, list[int]]):
    kind, due = step
    if kind == "delete":
        return lambda: _delete(ctx, row)
    if kind == "expire":
        return lambda: _expire(ctx, row)
    return lambda: _warn(ctx, row, due)


def _run_all(jobs) -> list[dict]:
    done: list[dict] = []
    request_id = request_ids.current()

    def one(job):
        request_ids.bind(request_id or request_ids.new())
        try:
            return job()
        except Exception:  # noqa: BLE001 - one instance's failure must not stop the others
            log.exception("lease sweep: a job failed; it is tried again at the next sweep")
            return None

    if len(jobs) == 1:
        results = [one(jobs[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(SWEEP_WORKERS, len(jobs)),
                                thread_name_prefix="lease-sweep") as pool:
            results = list(pool.map(one, jobs))
    for result in results:
        if result:
            done.append(result)
    return done


def _payload(ctx: Context, row: dict, event: str) -> str:
    user = ctx.store.get_user(row["owner_id"]) or {}
    account = account_of(ctx, row["owner_id"]) or {}
    name = row.get("hostname") or row["id"]
    return json.dumps({
        "event": event,
        "instance": {"id": row["id"], "hostname": row.get("hostname")},
        "owner": {"email": user.get("email"), "username": account.get("username")},
        "expires-at": row["expires_at"],
        "renew": f"cloud server renew {name}",
    }, sort_keys=True)


def _event(ctx: Context, row: dict, event: str, step: int = 0) -> dict:
    now = rfc3339(ctx.clock())
    return {"instance_id": row["id"], "expires_at": row["expires_at"], "event": event, "step": step,
            "payload": _payload(ctx, row, event), "at_utc": now,
            # With no hook there is nothing to hand it to: done as it is recorded.
            "notified_at": None if ctx.config.leases.notify_command else now}


def _entry(row: dict, action: str, message: str) -> dict:
    return {"instance_id": row["id"], "owner_id": row["owner_id"], "action": action, "requester": None,
            "request_id": request_ids.current() or request_ids.new(), "result": "success",
            "message": message[:1000], "at_utc": utc_now()}


def _warn(ctx: Context, row: dict, due: list[int]) -> dict | None:
    nearest = min(due)
    message = f"the lease ends at {row['expires_at']}; renew it (`cloud server renew {row.get('hostname') or row['id']}`)"
    sent = ctx.store.record_lease_event(_event(ctx, row, "warning", nearest),
                                        history=_entry(row, "warning", message), keep=history.KEPT_PER_INSTANCE)
    for step in due:
        if step != nearest:
            ctx.store.record_lease_event(dict(_event(ctx, row, "warning", step), notified_at=rfc3339(ctx.clock())),
                                         history=None)
    if not sent:
        return None
    return {"kind": "warning", "instance": row["id"], "detail": f"{_hours(nearest)} before {row['expires_at']}"}


def _expire(ctx: Context, row: dict) -> dict | None:
    """Power the instance off once for its lease's end: under its claim (another process, or a
    power task, holding it: tried at the next sweep), read again, then power-off as the task
    does, then the record; a crash before the record powers off again (harmless) and records."""
    try:
        with instance_claims.held(ctx, row["id"], "expire", refresh=None), host_changes(ctx):
            fresh = ctx.store.find_instance(row["id"])
            if (fresh is None or fresh["intent"] is not None or fresh["expires_at"] != row["expires_at"]
                    or ctx.store.lease_event_done(row["id"], row["expires_at"], "expired")):
                return None  # renewed, deleted or expired meanwhile
            instance_claims.refuse_while_moving(ctx, row["id"])
            message = power_tasks.run(ctx, fresh, "power-off")
            _store_status(ctx, fresh)
            recorded = ctx.store.record_lease_event(
                _event(ctx, fresh, "expired"),
                history=_entry(fresh, "expire", f"the lease ended at {fresh['expires_at']}; powered off: {message}"),
                keep=history.KEPT_PER_INSTANCE)
    except Conflict as e:
        log.info("lease sweep: instance %s expired but is busy (%s); tried at the next sweep", row["id"], e.message)
        return None
    except ControllerError as e:
        log.warning("lease sweep: instance %s expired and could not be powered off (%s); tried at the next sweep",
                    row["id"], e.message)
        return None
    if not recorded:
        return None
    audit.record(ctx.store, actor=AUDIT_ACTOR, action="expire server-instance", target=row["id"], result="200",
                 detail=f"lease ended at {row['expires_at']}")
    return {"kind": "expire", "instance": row["id"], "detail": f"lease ended at {row['expires_at']}"}


def _store_status(ctx: Context, row: dict) -> None:
    try:
        ctx.store.set_instance_status(row["id"], hypervisor_of_instance(ctx, row).status(row["id"]))
    except ControllerError:
        pass  # the lists bring it to the host's view when it answers


def _delete(ctx: Context, row: dict) -> dict | None:
    """Delete an instance `keep` after its lease ended, once: as _expire, under its claim and
    read again; the delete itself is a DELETE's (its intent makes a second one impossible)."""

    keep = ctx.config.leases.keep
    try:
        with instance_claims.held(ctx, row["id"], "lease-delete", refresh=None), host_changes(ctx):
            fresh = ctx.store.find_instance(row["id"])
            if fresh is None or fresh["intent"] is not None or fresh["expires_at"] != row["expires_at"]:
                return None
            event = _event(ctx, fresh, "deleted")  # made while the owner's names can still be read
            unfinished = delete_claimed(ctx, fresh)
    except Conflict as e:
        log.info("lease sweep: instance %s is due for deletion but busy (%s); tried at the next sweep",
                 row["id"], e.message)
        return None
    except ControllerError as e:
        log.warning("lease sweep: instance %s is due for deletion and could not be deleted (%s); "
                    "tried at the next sweep", row["id"], e.message)
        return None
    message = (f"the lease ended at {row['expires_at']} and was not renewed within [leases] keep "
               f"({_hours(keep)}): deleted")
    if unfinished:
        message += f"; {unfinished}"
    ctx.store.record_lease_event(event, history=_entry(fresh, "delete", message), keep=history.KEPT_PER_INSTANCE)
    audit.record(ctx.store, actor=AUDIT_ACTOR, action="delete server-instance", target=row["id"], result="200",
                 detail=f"lease ended at {row['expires_at']}, kept {_hours(keep)}")
    return {"kind": "delete", "instance": row["id"], "detail": f"lease ended at {row['expires_at']}"}


def _notify(ctx: Context, event: dict) -> dict | None:
    """Hand one event to notify_command, once: taken by compare-and-set (another process
    running it for the event: skipped), run bounded, then marked done, or let go to be tried
    at the next sweep."""
    config = ctx.config.leases
    now = ctx.clock()
    if not config.notify_command or now - seconds_of(event["at_utc"]) > NOTIFY_GIVE_UP_SECONDS:
        if config.notify_command:
            log.error("lease notification %s of instance %s given up: notify_command did not take it within "
                      "%d s", event["event"], event["instance_id"], NOTIFY_GIVE_UP_SECONDS)
        ctx.store.end_lease_notification(event["id"], notified_at=rfc3339(now))
        return None
    held_until = rfc3339(now + config.notify_timeout_seconds + 5)
    if not ctx.store.take_lease_notification(event["id"], now=rfc3339(now), until=held_until):
        return None
    try:
        subp.run_hook(config.notify_command, input=event["payload"].encode(),
                      timeout=config.notify_timeout_seconds)
    except (CommandError, ControllerError) as e:
        log.warning("lease notification %s of instance %s: [leases] notify_command failed (%s); "
                    "tried again at the next sweep", event["event"], event["instance_id"],
                    getattr(e, "message", str(e)))
        ctx.store.end_lease_notification(event["id"], notified_at=None)
        return {"kind": "notify-failed", "instance": event["instance_id"], "detail": event["event"]}
    ctx.store.end_lease_notification(event["id"], notified_at=rfc3339(ctx.clock()))
    return {"kind": "notify", "instance": event["instance_id"], "detail": event["event"]}


# -- what reconcile reports ---------------------------------------------------------------------
def due(ctx: Context) -> list[dict]:
    """What the next sweep would do (reconcile without --fix): {"kind", "instance", "detail"}."""
    now = ctx.clock()
    found = [{"kind": kind, "instance": row["id"],
              "detail": f"lease {'ends' if kind == 'warning' else 'ended'} at {row['expires_at']}"}
             for row, (kind, _) in _steps_due(ctx, now)]
    found += [{"kind": "notify", "instance": e["instance_id"], "detail": e["event"]}
              for e in ctx.store.unnotified_lease_events(rfc3339(now), limit=NOTIFY_PER_SWEEP)]
    return found


# -- the server's thread ----------------------------------------------------------------------
class LeaseSweeper:
    """`cloud-agent serve`'s sweep: at once at start (an instance whose lease ended while the
    controller was down is acted on within check_seconds of its start), then every
    `[leases] check_seconds`, on a thread of its own."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lease-sweep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            request_ids.bind(request_ids.new())
            try:
                for item in sweep(self.ctx):
                    log.info("lease sweep: %s %s (%s)", item["kind"], item["instance"], item["detail"])
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("lease sweep failed; tried again in %d s", self.ctx.config.leases.check_seconds)
            finally:
                request_ids.bind(None)
            self._stop.wait(self.ctx.config.leases.check_seconds)

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
