"""`cloud-agent host drain NAME`: every instance of a host that answers moved to others.

The host is disabled first (nothing new lands on it), then
each instance is moved cold to the host placement picks, as for a create: its
guest is shut down (ACPI, at most [hosts] shutdown_wait_seconds, then powered off),
its disk is copied to the new host (the base image first, if that host lacks it)
and its domain defined there with the same id, hostname, MAC, addresses, users and
homes, then started if it ran before; the old host's domain, disk, seed and DHCP
reservations go last. Live migration is not offered: virtiofs shares cannot be
migrated (QEMU, Nova and Proxmox say so); the guest sees a clean shutdown and a boot.

Each move is recorded before anything changes (store.begin_move; the new host's
allocation counts it from then on). The row names the old host until the copy is
defined on the new one and checked (SHA-256 read back); then it names the new host
(store.commit_move). A crash in between leaves the record: running drain again, or
`reconcile --fix`, finishes the move from where it is (before the commit: the copy is
made again; after: the start and the old host's removal). The old host's disk is
removed only after the commit, so no crash loses it. A failure before the commit
undoes the move: nothing remains on the new host and the guest runs again where it
was (a target that died too: its leftovers are reconcile's). Each move holds the instance's
claim (controller/instances/instance_claims.py) while it works, and rebuilds the target's guest from
the database after the commit, before the start. `--abandon` (abandon()) gives up the moves
a drain left before their commit; evacuating a dead target returns its instances to their
source (return_to_source()). See docs/decisions.md and docs/scaling.md.
"""

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from controller.audit import history
from controller.instances import instance_claims
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable, HostUnreachable, NotFound
from controller.instances.guests import guest_spec, refresh_guest
from controller.hosts.host_records import check_distinct, check_host_name, get_host
from controller.hosts.host_routing import hypervisor_of_host, spec_of
from controller.hosts.image_copy import ensure_image_on_host
from controller.locks import host_changes
from controller.hosts.placement import placement, refuse_without_room
from host_adapters.images.disk_copy import disk_file_limit

log = logging.getLogger(__name__)

# Statuses in which a guest runs (a paused one too): it is started on the new host.
RUNS = ("running", "paused", "building")
# Free space kept on the head node's spool folder beyond the most a disk's copy may take: the
# database lives there too, and the undo of a failed move writes to it.
SPOOL_MARGIN_BYTES = 256 * 1024 * 1024


def drain(ctx: Context, name: str, *, progress: Callable[[str], None] | None = None) -> dict:
    """Move every instance of host `name` to other hosts; {"host", "moved", "failed"}."""
    say = progress or (lambda _m: None)
    check_host_name(name)
    get_host(ctx, name, probe=False)  # NotFound for an unknown host
    _refuse_if_silent(ctx, name)
    check_distinct(ctx, name)  # a second record of its libvirt: a move there would destroy the instance
    resumed = [m["instance_id"] for m in ctx.store.list_moves(from_host=name)]
    rows = [r for r in ctx.store.all_instances() if r["host"] == name and r["id"] not in resumed]
    live = [r for r in rows if not r.get("intent")]
    refuse_without_room(ctx, name, live, done="drained")
    # Nothing is placed on it again, whatever happens next.
    ctx.store.set_host_enabled(name, False)
    moved, failed = [], []
    todo = [(i, False) for i in resumed] + [(r["id"], True) for r in live]
    for n, (instance_id, fresh) in enumerate(todo, 1):
        say(f"instance {n}/{len(todo)} of host {name} ({instance_id})")
        outcome = _attempt(ctx, instance_id, name, fresh=fresh)
        if outcome is not None:
            (failed if "error" in outcome else moved).append(outcome)
    for r in rows:
        if r.get("intent"):
            doing = "created" if r["intent"] == "creating" else "deleted"
            failed.append({"id": r["id"], "error": f"it is being {doing}; drain again once that has ended"})
    return {"host": name, "moved": moved, "failed": failed}


def _refuse_if_silent(ctx: Context, name: str) -> None:
    """A host that does not answer cannot hand over its disks: nothing changes (a dead host
    is evacuated instead)."""
    pool = ctx.adapters.hosts
    pool.forget(name)
    try:
        pool.hypervisor(spec_of(ctx.store.get_host(name))).host_capacity()
    except HostUnreachable as e:
        raise HostUnavailable(f"host {name} does not answer ({e.message}); nothing was changed. A host that is "
                              "dead for good is fenced and evacuated (`cloud-agent host evacuate NAME "
                              "--host-is-down`)") from None


def _attempt(ctx: Context, instance_id: str, name: str, *, fresh: bool) -> dict | None:
    """{"id", "to"} once moved, {"id", "error"} when not; None when it was deleted meanwhile."""
    try:
        to = _move_one(ctx, instance_id, name, fresh=fresh)
    except ControllerError as e:
        log.warning("drain %s: instance %s not moved: %s", name, instance_id, e.message)
        row = ctx.store.find_instance(instance_id)
        if row is not None:  # its history says why it is still there (an admin command: no requester)
            history.record(ctx, row, "move", requester=None, result="error",
                           message=f"host {name} is drained; not moved: {e.message}")
        return {"id": instance_id, "error": e.message}
    return None if to is None else {"id": instance_id, "to": to}


def _move_one(ctx: Context, instance_id: str, name: str, *, fresh: bool) -> str | None:
    """Place (when fresh) and move one instance; the host it is on afterwards."""
    with host_changes(ctx):
        return resume(ctx, instance_id, begin=(lambda: _begin(ctx, instance_id, name)) if fresh else None)


def resume(ctx: Context, instance_id: str, *, begin: Callable[[], str | None] | None = None) -> str | None:
    """finish() under the instance's claim (`begin` first records a new move; None from it:
    nothing to move). Also reconcile --fix's repair of a move a crash cut short (it holds the
    host-change lock itself)."""
    # The claim alone (no in-process lock held for the whole copy): a user change arriving
    # meanwhile, from this process or the server, is deferred to this holder, never waits.
    try:
        taken = instance_claims.claim(ctx, instance_id, "move")
    except NotFound:
        return None  # deleted meanwhile
    try:
        if begin is not None and begin() is None:
            return None  # deleted, or moved, meanwhile
        return finish(ctx, instance_id)
    finally:
        instance_claims.release(ctx, taken, refresh=lambda: refresh_guest(ctx, instance_id))


def _begin(ctx: Context, instance_id: str, name: str) -> str | None:
    """Record the move of a live instance of host `name` to the host placement picks (None:
    it is no longer one), with its power state as the host has it now: it gets the same there."""
    row = ctx.store.find_instance(instance_id)
    if row is None:
        return None
    running = hypervisor_of_host(ctx, name).status(instance_id) in RUNS
    flavor = ctx.store.get_flavor(row["flavor_id"])
    return ctx.store.begin_move(instance_id, name, placement(ctx, flavor), was_running=running)


def finish(ctx: Context, instance_id: str) -> str | None:
    """Carry a recorded move on from where it is (also reconcile --fix's repair of a move a
    crash cut short); the host the instance is on afterwards."""
    moves = ctx.store.list_moves(instance_id=instance_id)
    row = ctx.store.find_instance(instance_id)
    if not moves or row is None:
        return None
    move = moves[0]
    if row["host"] not in (move["from_host"], move["to_host"]):
        # Nothing is started or removed on either end for a row that names neither.
        raise Conflict(f"instance {instance_id} is recorded on host {row['host']}, neither end of its move from "
                       f"host {move['from_host']} to host {move['to_host']}; left for the admin")
    source, target = hypervisor_of_host(ctx, move["from_host"]), hypervisor_of_host(ctx, move["to_host"])
    if row["host"] == move["from_host"]:
        _copy(ctx, row, move, source, target)
        ctx.store.commit_move(instance_id)
    # What changed while the disk was copied (a user deactivated, a group, a home) is in the
    # database, not in the guest defined before: rebuilt from it before the guest boots there.
    row = ctx.store.find_instance(instance_id) or row
    target.set_guest(instance_id, guest_spec(ctx, row))
    if move["was_running"]:
        target.power_on(instance_id)
    try:
        ctx.store.set_instance_status(instance_id, target.status(instance_id))
    except ControllerError:
        pass  # the next list reads it from the host
    _refuse_one_libvirt(move, source, target)  # the row names the target: the source's copy must be another
    source.destroy(instance_id)  # its domain, disk, seed, console log and DHCP reservations
    ctx.store.end_move(instance_id)
    history.record(ctx, row, "move", requester=None,
                   message=f"moved from host {move['from_host']} to host {move['to_host']}: a cold move (the "
                           "guest was shut down and booted there, with its disk)")
    return move["to_host"]


# -- giving a move up (`host drain NAME --abandon`, and evacuate of a dead target) -------------
def abandon(ctx: Context, name: str, *, progress: Callable[[str], None] | None = None) -> dict:
    """Give up every unfinished move off host `name`: each instance stays on (runs again on)
    that host with its own disk, and what its target holds goes (now, or by reconcile once
    that host answers again). A move already committed is refused: the target's copy is the
    instance then (drain again finishes it; a dead target is evacuated, which returns it).
    {"host", "abandoned": [{"id", "host"}], "failed": [{"id", "error"}]}."""
    say = progress or (lambda _m: None)
    check_host_name(name)
    get_host(ctx, name, probe=False)  # NotFound for an unknown host
    moves = ctx.store.list_moves(from_host=name)
    abandoned, failed = [], []
    for n, move in enumerate(moves, 1):
        instance_id = move["instance_id"]
        say(f"instance {n}/{len(moves)} of host {name} ({instance_id})")
        try:
            with host_changes(ctx):
                try:
                    taken = instance_claims.claim(ctx, instance_id, "abandon")
                except NotFound:
                    continue  # deleted meanwhile
                try:
                    done = _abandon_one(ctx, instance_id)
                finally:
                    instance_claims.release(ctx, taken, refresh=lambda: refresh_guest(ctx, instance_id))
        except ControllerError as e:
            log.warning("drain --abandon %s: instance %s: %s", name, instance_id, e.message)
            failed.append({"id": instance_id, "error": e.message})
            continue
        if done:
            abandoned.append({"id": instance_id, "host": name})
    return {"host": name, "abandoned": abandoned, "failed": failed}


def _abandon_one(ctx: Context, instance_id: str) -> bool:
    moves = ctx.store.list_moves(instance_id=instance_id)
    row = ctx.store.find_instance(instance_id)
    if not moves or row is None:
        return False  # finished, or deleted, meanwhile
    move = moves[0]
    source, to = move["from_host"], move["to_host"]
    if row["host"] == to:
        if _answers(ctx, to):
            raise Conflict(f"its move was committed: the copy on host {to} is the instance now; "
                           f"`cloud-agent host drain {source}` finishes the move")
        raise Conflict(f"its move was committed: the copy on host {to} is the instance now, and that host does "
                       f"not answer. If it is dead and fenced, `cloud-agent host evacuate {to} --host-is-down` "
                       f"returns the instance to its own disk on host {source}")
    try:
        hypervisor_of_host(ctx, to).destroy(instance_id)  # never started there
    except HostUnreachable:
        log.warning("drain --abandon: instance %s: host %s does not answer; its copy there is left for reconcile",
                    instance_id, to)
    return_to_source(ctx, move, why=f"the move to host {to} was abandoned by an admin")
    return True


def return_to_source(ctx: Context, move: dict, *, why: str) -> str:
    """The instance of an unfinished move back on its source host, whose copy of the disk is
    still there (it goes only after the target's copy is committed and started): the row
    names the source again, its guest is rebuilt from the database and started if it ran.
    HostError (nothing changed) when the source does not hold it any more."""
    instance_id, name = move["instance_id"], move["from_host"]
    source = hypervisor_of_host(ctx, name)
    try:
        info = source.describe(instance_id)
    except NotFound:
        info = None
    if info is None or not info.defined or info.disk_path is None:
        raise HostError(f"host {name} no longer holds the domain and disk of instance {instance_id}")
    ctx.store.abandon_move(instance_id)
    row = ctx.store.find_instance(instance_id)
    source.set_guest(instance_id, guest_spec(ctx, row))
    if move["was_running"]:
        source.power_on(instance_id)
    try:
        ctx.store.set_instance_status(instance_id, source.status(instance_id))
    except ControllerError:
        pass  # the next list reads it from the host
    history.record(ctx, row, "move", requester=None, result="error",
                   message=f"not moved: {why}; it is on host {name} with its own disk")
    return name


def _answers(ctx: Context, name: str) -> bool:
    pool, row = ctx.adapters.hosts, ctx.store.get_host(name)
    if row is None:
        return False
    pool.forget(name)
    try:
        pool.hypervisor(spec_of(row)).host_capacity()
    except HostUnreachable:
        return False
    return True


def _copy(ctx: Context, row: dict, move: dict, source, target) -> None:
    """The instance shut down on the source and its checked copy defined (not started) on the
    target. On failure nothing remains on the target, the guest runs again where it ran, and
    the move's record goes (a target that cannot be cleaned keeps it: the next run retries)."""
    instance_id, to = row["id"], move["to_host"]
    image, flavor = ctx.store.get_image(row["image_id"]), ctx.store.get_flavor(row["flavor_id"])
    _refuse_one_libvirt(move, source, target)  # before the target is "cleaned" below
    try:
        # Before the guest is stopped: a head node without room for the copy changes nothing.
        _check_spool_room(ctx, disk_file_limit(flavor["disk"]))
        source.shut_down(instance_id, wait_seconds=ctx.config.hosts.shutdown_wait_seconds)
        ctx.store.set_instance_status(instance_id, "shutoff")  # what the user sees meanwhile
        # The config's own host has its base images made by `image add` (as a create's spawn).
        if to != ctx.config.libvirt.host_name:
            ensure_image_on_host(ctx, image, to)
        target.destroy(instance_id)  # whatever an interrupted attempt left there
        with _spool(ctx) as (fd, path):
            kept = source.read_disk(instance_id, fd, max_bytes=disk_file_limit(flavor["disk"]))
            target.receive(instance_id, base_image=image["base_volume"], vcpu=flavor["vcpu"],
                           memory_mb=flavor["memory"], disk_gb=flavor["disk"],
                           guest=guest_spec(ctx, dict(row, host=to)), disk=path if kept else None, start=False)
    except ControllerError as e:
        try:
            target.destroy(instance_id)
        except HostUnreachable:
            # A target that died: what it holds was never started and the row names the source;
            # reconcile removes it (domain-stale) when that host answers again. The guest runs
            # again where its disk is, instead of staying off while the record waits.
            log.warning("drain: instance %s: host %s does not answer; its copy there is left for reconcile",
                        instance_id, to)
        except ControllerError:
            raise e from None
        if move["was_running"]:
            try:
                source.power_on(instance_id)
                ctx.store.set_instance_status(instance_id, source.status(instance_id))
            except ControllerError as again:
                log.warning("drain: instance %s not started again on host %s: %s", instance_id,
                            move["from_host"], again.message)
        ctx.store.end_move(instance_id)
        raise


def _spool_folder(ctx: Context) -> str:
    """Beside the database (where image copies spool too)."""
    if ctx.store.path == ":memory:":
        return tempfile.gettempdir()
    return os.path.dirname(os.path.abspath(ctx.store.path))


def _free_bytes(folder: str) -> int:
    return shutil.disk_usage(folder).free


def _check_spool_room(ctx: Context, most: int) -> None:
    """HostError, before anything changes, when the spool folder lacks room for the most a
    copy of this disk may take (the flavor's bound) and a margin for the database."""
    folder = _spool_folder(ctx)
    try:
        free = _free_bytes(folder)
    except OSError as e:
        raise HostError(f"the head node cannot read the free space of {folder}: {e.strerror}") from None
    if free < most + SPOOL_MARGIN_BYTES:
        raise HostError(f"the head node has {free // 2**20} MiB free in {folder}, where the disk is copied through; "
                        f"a disk of this flavor may take up to {most // 2**20} MiB (and "
                        f"{SPOOL_MARGIN_BYTES // 2**20} MiB are kept for the database): free space there first")


def _refuse_one_libvirt(move: dict, source, target) -> None:
    """Never destroy on one host what the row places on the other: when both records reach one
    libvirt, the "other" copy is the instance itself. Conflict, before anything is destroyed."""
    if source.identity().same_as(target.identity()):
        raise Conflict(f"hosts {move['from_host']} and {move['to_host']} reach the same libvirt: the instance "
                       "was not moved and nothing of it was destroyed; `cloud-agent host remove` the second "
                       "record of that libvirt")


@contextmanager
def _spool(ctx: Context) -> Iterator[tuple[int, str]]:
    """A private temporary file of the head node for one disk. An I/O error of the head node
    (its disk full) while it is made, written or read is a HostError: the move is undone as
    for any other failure, and says why."""
    folder = _spool_folder(ctx)
    try:
        fd, path = tempfile.mkstemp(prefix=".disk-", suffix=".qcow2", dir=folder)
    except OSError as e:
        raise _spool_error(folder, e) from None
    try:
        try:
            yield fd, path
        except OSError as e:
            raise _spool_error(folder, e) from None
    finally:
        os.close(fd)
        os.unlink(path)


def _spool_error(folder: str, e: OSError) -> HostError:
    why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
    return HostError(f"the head node could not copy the disk through {folder}: {why}; the move was undone")
