"""`cloud-agent host drain NAME`: every instance of a host that answers moved to others.

CONTRACT.md section 9. The host is disabled first (nothing new lands on it), then
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
was. See docs/decisions.md and docs/scaling.md.
"""

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from controller import history
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostUnavailable, HostUnreachable
from controller.guests import guest_spec
from controller.host_records import check_distinct, check_host_name, get_host
from controller.host_routing import hypervisor_of_host, spec_of
from controller.image_copy import ensure_image_on_host
from controller.locks import host_changes, one_at_a_time
from controller.placement import placement, refuse_without_room
from host_adapters.disk_copy import disk_file_limit

log = logging.getLogger(__name__)

# Statuses in which a guest runs (a paused one too): it is started on the new host.
RUNS = ("running", "paused", "building")


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
    with host_changes(ctx), one_at_a_time("instance", instance_id):
        if fresh and _begin(ctx, instance_id, name) is None:
            return None  # deleted, or moved, meanwhile
        return finish(ctx, instance_id)


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
    source, target = hypervisor_of_host(ctx, move["from_host"]), hypervisor_of_host(ctx, move["to_host"])
    if row["host"] == move["from_host"]:
        _copy(ctx, row, move, source, target)
        ctx.store.commit_move(instance_id)
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


def _copy(ctx: Context, row: dict, move: dict, source, target) -> None:
    """The instance shut down on the source and its checked copy defined (not started) on the
    target. On failure nothing remains on the target, the guest runs again where it ran, and
    the move's record goes (a target that cannot be cleaned keeps it: the next run retries)."""
    instance_id, to = row["id"], move["to_host"]
    image, flavor = ctx.store.get_image(row["image_id"]), ctx.store.get_flavor(row["flavor_id"])
    _refuse_one_libvirt(move, source, target)  # before the target is "cleaned" below
    try:
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


def _refuse_one_libvirt(move: dict, source, target) -> None:
    """Never destroy on one host what the row places on the other: when both records reach one
    libvirt, the "other" copy is the instance itself. Conflict, before anything is destroyed."""
    if source.identity().same_as(target.identity()):
        raise Conflict(f"hosts {move['from_host']} and {move['to_host']} reach the same libvirt: the instance "
                       "was not moved and nothing of it was destroyed; `cloud-agent host remove` the second "
                       "record of that libvirt")


@contextmanager
def _spool(ctx: Context) -> Iterator[tuple[int, str]]:
    """A private temporary file beside the database (where image copies spool too) for one disk."""
    folder = os.path.dirname(os.path.abspath(ctx.store.path)) if ctx.store.path != ":memory:" else None
    fd, path = tempfile.mkstemp(prefix=".disk-", suffix=".qcow2", dir=folder)
    try:
        yield fd, path
    finally:
        os.close(fd)
        os.unlink(path)
