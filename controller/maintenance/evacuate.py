"""`cloud-agent host evacuate NAME --host-is-down`: a dead host's instances rebuilt elsewhere.

Each instance is made again on another host from its image,
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

An instance a drain was moving to the dead host goes back to its source's copy instead
(never rebuilt from its image while a copy exists); one moving off it whose copy was
committed is finished on its target. Each holds the instance's claim while it works.
See docs/decisions.md and docs/scaling.md.
"""

import logging
from collections.abc import Callable

from controller.maintenance import drain
from controller.audit import history
from controller.instances import instance_claims, instances
from controller.context import Context
from controller.instances.guests import guest_spec, refresh_guest
from controller.hosts.host_records import check_host_name, get_host
from controller.hosts.host_routing import hypervisor_of_host, hypervisor_of_instance, spec_of
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable, HostUnreachable, InvalidInput, \
    NotFound
from controller.locks import host_changes
from controller.hosts.placement import placement, refuse_without_room

log = logging.getLogger(__name__)

DOWN_ONLY = ("evacuate is only for a dead host that is fenced (powered off, or cut from the "
             "network and storage for good): add --host-is-down to say so. A live host is drained instead "
             "(`cloud-agent host drain`)")


def evacuate(ctx: Context, name: str, *, host_is_down: bool,
             progress: Callable[[str], None] | None = None) -> dict:
    """Rebuild every instance of dead host `name` elsewhere; {"host", "rebuilt", "failed"}, and
    "kept" ([{"id", "to"}]: instances of a move to or from it, each on a host with its own disk)
    when there were any."""
    say = progress or (lambda _m: None)
    check_host_name(name)
    if not host_is_down:
        raise InvalidInput(DOWN_ONLY)
    get_host(ctx, name, probe=False)  # NotFound for an unknown host
    row = ctx.store.get_host(name)
    _refuse_if_answering(ctx, row)
    resumed = ctx.store.list_evacuations(from_host=name)
    pending = [r for r in ctx.store.all_instances() if r["host"] == name]
    # Moves to the dead host go back to their source, whose copy of the disk was never
    # removed: such an instance is never rebuilt from its image (nor needs room elsewhere).
    moves_in = [m for m in ctx.store.list_moves() if m["to_host"] == name]
    # Moves off it that were committed are finished on their target (its copy is checked).
    moves_out = [m for m in ctx.store.list_moves(from_host=name)]
    returning = {m["instance_id"] for m in moves_in}
    live = [r for r in pending if not r.get("intent") and r["id"] not in returning]
    refuse_without_room(ctx, name, live, done="evacuated")
    # Nothing is placed on it again, whatever happens next.
    ctx.store.set_host_enabled(name, False)
    rebuilt, failed, kept = [], [], []
    for r in pending:
        if r.get("intent"):
            _drop_interrupted(ctx, r, name)
    for i, move in enumerate(moves_in + moves_out, 1):
        say(f"move {i}/{len(moves_in) + len(moves_out)} to or from host {name} ({move['instance_id']})")
        try:
            outcome = _keep_own_disk(ctx, move, name)
        except ControllerError as e:
            log.warning("evacuate %s: instance %s not kept: %s", name, move["instance_id"], e.message)
            failed.append({"id": move["instance_id"], "error": e.message})
            row = ctx.store.find_instance(move["instance_id"])
            if row is not None:
                history.record(ctx, row, "evacuate", requester=None, result="error",
                               message=f"host {name} is down: {e.message}")
            continue
        if outcome == "rebuild":  # no copy is left but the dead host's: rebuilt as the others
            row = ctx.store.find_instance(move["instance_id"])
            if row is not None and row["host"] == name:
                live.append(row)
        elif outcome is not None:
            kept.append({"id": move["instance_id"], "to": outcome})
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
    result = {"host": name, "rebuilt": rebuilt, "failed": failed}
    if kept:  # only after a move to or from the dead host was cut short
        result["kept"] = kept
    return result


def _keep_own_disk(ctx: Context, move: dict, name: str) -> str | None:
    """An unfinished move to or from dead host `name`, under the instance's claim: the host
    the instance is on afterwards with its own disk; "rebuild" when no copy is left but the
    dead host's; None when there is nothing to do (finished, or deleted, meanwhile)."""
    instance_id = move["instance_id"]
    with host_changes(ctx):
        try:
            taken = instance_claims.claim(ctx, instance_id, "evacuation")
        except NotFound:
            return None
        try:
            moves = ctx.store.list_moves(instance_id=instance_id)
            row = ctx.store.find_instance(instance_id)
            if not moves or row is None:
                return None
            move = moves[0]
            if move["to_host"] == name:
                return _back_to_source(ctx, move, row, name)
            if row["host"] == move["to_host"]:
                return _finish_off_dead_source(ctx, move, row, name)
            return None  # not committed: its copy is unchecked; rebuilt as the others (begin_evacuation ends it)
        finally:
            instance_claims.release(ctx, taken, refresh=lambda: refresh_guest(ctx, instance_id))


def _back_to_source(ctx: Context, move: dict, row: dict, name: str) -> str:
    source = move["from_host"]
    try:
        return drain.return_to_source(ctx, move, why=f"host {name}, where it was moving, is down")
    except HostUnreachable as e:
        raise HostUnavailable(f"its own disk is on host {source}, which does not answer ({e.message}); it is not "
                              "rebuilt from its image while that copy may exist. Evacuate that host too if it is "
                              "dead") from None
    except HostError:
        if row["host"] != name:
            raise
    # Committed, and the source's copy is gone (removed after the start there): the dead
    # host held the only one.
    ctx.store.end_move(row["id"])
    return "rebuild"


def _finish_off_dead_source(ctx: Context, move: dict, row: dict, name: str) -> str:
    """A committed move off the dead host: the target's copy is checked and the row names it;
    the guest is rebuilt from the database and started there if it ran. The dead host's copy
    is reconcile's (domain-stale) when it answers again."""
    target = hypervisor_of_host(ctx, move["to_host"])
    target.set_guest(row["id"], guest_spec(ctx, row))
    if move["was_running"]:
        target.power_on(row["id"])
    try:
        ctx.store.set_instance_status(row["id"], target.status(row["id"]))
    except ControllerError:
        pass
    ctx.store.end_move(row["id"])
    history.record(ctx, row, "move", requester=None,
                   message=f"moved from host {name} to host {move['to_host']} (its copy there was checked; host "
                           f"{name} is down)")
    return move["to_host"]


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

    def begin() -> str | None:
        row = ctx.store.find_instance(instance_id)
        if row is None:
            return None  # deleted meanwhile
        if any(m["to_host"] == name for m in ctx.store.list_moves(instance_id=instance_id)):
            # Its own disk is on the move's source: never rebuilt from its image.
            raise Conflict(f"its own disk is on host {row['host']}, which it was moving from; not rebuilt from "
                           "its image")
        flavor = ctx.store.get_flavor(row["flavor_id"])
        return ctx.store.begin_evacuation(instance_id, name, placement(ctx, flavor))

    with host_changes(ctx):
        return resume(ctx, instance_id, begin=begin if fresh else None)


def resume(ctx: Context, instance_id: str, *, begin=None) -> str | None:
    """finish() under the instance's claim (`begin` first records a new evacuation; None from
    it: nothing to do). Also reconcile --fix's repair of an evacuation a crash cut short (it
    holds the host-change lock itself)."""
    try:
        taken = instance_claims.claim(ctx, instance_id, "evacuation")
    except NotFound:
        return None  # deleted meanwhile
    try:
        if begin is not None and begin() is None:
            return None  # deleted, or moved, meanwhile
        return finish(ctx, instance_id)
    finally:
        instance_claims.release(ctx, taken, refresh=lambda: refresh_guest(ctx, instance_id))


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
