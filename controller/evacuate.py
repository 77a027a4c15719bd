"""`cloud-agent host evacuate NAME --host-is-down`: a dead host's instances rebuilt elsewhere.

CONTRACT.md section 9. Each instance is made again on another host from its image,
with the same id, hostname, MAC, addresses and users; its root disk is lost with
the host (homes live on the cluster filesystem). Only for a host that does not
answer and that the admin has fenced: a host that answers still runs the guests,
and two copies of one guest (same MAC and addresses) must never run at once.

Each instance, in order: the row is pointed at the host placement picks and an
evacuation record written, in one transaction (the new host's allocation counts
it at once, as a create's does); what an earlier attempt left there is removed;
the instance is spawned there as a create spawns it; the record is cleared. A
crash in between leaves the record: running the command again, or `reconcile
--fix`, finishes it, and reconcile never mistakes it for a create to undo. When
the old host answers again, reconcile removes its stale copies (domain-stale).
See docs/decisions.md and docs/scaling.md.
"""

import logging
from collections.abc import Callable

from controller import history, instances
from controller.context import Context
from controller.host_records import check_host_name, get_host
from controller.host_routing import hypervisor_of_instance, spec_of
from controller.errors import Conflict, ControllerError, HostUnreachable, InvalidInput
from controller.locks import host_changes, one_at_a_time
from controller.placement import placement, refuse_without_room

log = logging.getLogger(__name__)

DOWN_ONLY = ("evacuate is only for a dead host that is fenced (powered off, or cut from the "
             "network and storage for good): add --host-is-down to say so. A live host is drained instead "
             "(`cloud-agent host drain`)")


def evacuate(ctx: Context, name: str, *, host_is_down: bool,
             progress: Callable[[str], None] | None = None) -> dict:
    """Rebuild every instance of dead host `name` elsewhere; {"host", "rebuilt", "failed"}."""
    say = progress or (lambda _m: None)
    check_host_name(name)
    if not host_is_down:
        raise InvalidInput(DOWN_ONLY)
    get_host(ctx, name, probe=False)  # NotFound for an unknown host
    row = ctx.store.get_host(name)
    _refuse_if_answering(ctx, row)
    resumed = ctx.store.list_evacuations(from_host=name)
    pending = [r for r in ctx.store.all_instances() if r["host"] == name]
    live = [r for r in pending if not r.get("intent")]
    refuse_without_room(ctx, name, live, done="evacuated")
    # Nothing is placed on it again, whatever happens next.
    ctx.store.set_host_enabled(name, False)
    rebuilt, failed = [], []
    for r in pending:
        if r.get("intent"):
            _drop_interrupted(ctx, r, name)
    todo = [(e["instance_id"], None) for e in resumed] + [(r["id"], r) for r in live]
    for i, (instance_id, live_row) in enumerate(todo, 1):
        say(f"instance {i}/{len(todo)} of host {name} ({instance_id})")
        row = live_row or ctx.store.find_instance(instance_id)
        try:
            to = _evacuate_one(ctx, instance_id, name, fresh=live_row is not None)
        except ControllerError as e:
            log.warning("evacuate %s: instance %s not rebuilt: %s", name, instance_id, e.message)
            failed.append({"id": instance_id, "error": e.message})
            if row is not None:
                history.record(ctx, row, "evacuate", requester=None, result="error",
                               message=f"host {name} is down; not rebuilt: {e.message}")
            continue
        if to is not None:
            rebuilt.append({"id": instance_id, "to": to})
            history.record(ctx, row, "evacuate", requester=None,
                           message=f"host {name} is down: rebuilt on host {to} from its image (the root disk "
                                   "was lost, the homes were not)")
    return {"host": name, "rebuilt": rebuilt, "failed": failed}


def _refuse_if_answering(ctx: Context, row: dict) -> None:
    """One bounded connect ([hosts] connect_timeout_seconds), past any back-off: a host that
    answers in any way (even with an error of its own) is not dead."""
    pool = ctx.adapters.hosts
    pool.forget(row["name"])
    try:
        pool.hypervisor(spec_of(row)).host_capacity()
    except HostUnreachable:
        return
    except ControllerError as e:
        raise Conflict(f"host {row['name']} answers ({e.message}): its guests may still run. {DOWN_ONLY}") from None
    raise Conflict(f"host {row['name']} answers: its guests may still run, and two copies of a guest must never "
                   f"run at once. {DOWN_ONLY}")


def _drop_interrupted(ctx: Context, row: dict, name: str) -> None:
    """A create or delete cut short on the dead host: the client saw no create succeed, or
    asked for the delete. Its row goes (what remains on the host, if it ever answers again,
    is reported by reconcile as an orphan)."""
    log.warning("evacuate %s: instance %s was being %s there; its record is removed", name, row["id"],
                "created" if row["intent"] == "creating" else "deleted")
    ctx.store.delete_instance(row["id"])


def _evacuate_one(ctx: Context, instance_id: str, name: str, *, fresh: bool) -> str | None:
    """Place (when fresh) and rebuild one instance; the host it is on afterwards."""
    with host_changes(ctx), one_at_a_time("instance", instance_id):
        if fresh:
            row = ctx.store.find_instance(instance_id)
            if row is None:
                return None  # deleted meanwhile
            flavor = ctx.store.get_flavor(row["flavor_id"])
            to = ctx.store.begin_evacuation(instance_id, name, placement(ctx, flavor))
            if to is None:
                return None  # deleted, or moved, meanwhile
        return finish(ctx, instance_id)


def finish(ctx: Context, instance_id: str) -> str | None:
    """Rebuild an instance with an evacuation record on the host its row names (also
    reconcile --fix's repair of an evacuation a crash cut short); that host's name."""
    row = ctx.store.find_instance(instance_id)
    if row is None:
        return None
    target = hypervisor_of_instance(ctx, row)
    try:
        target.destroy(row["id"])  # whatever an interrupted attempt left there
        instances.respawn(ctx, row)
    except ControllerError as e:
        # Nothing made remains: the row names its old host again, and a later run places it
        # anew. A target that cannot be cleaned keeps the record (the next run retries there).
        try:
            target.destroy(row["id"])
        except ControllerError:
            raise e from None
        ctx.store.undo_evacuation(row["id"])
        raise
    try:
        ctx.store.set_instance_status(row["id"], target.status(row["id"]))
    except ControllerError:
        pass  # the next list reads it from the host
    ctx.store.finish_evacuation(row["id"])
    return row["host"]
