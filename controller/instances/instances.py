"""Server-instances: VMs built from an image and a flavor, with the homes of their users mounted."""

import json
import logging
from collections.abc import Iterator

from common.words import shown
from controller.audit import history
from controller.instances import instance_claims, lease_terms, power_tasks
from controller import limits
from controller import permissions as perms
from controller.addresses import allocate, network_plan
from controller.context import Context
from controller.errors import (CleanupFailed, Conflict, ControllerError, HostError, HostUnavailable, HostUnreachable,
                               InvalidInput, NotFound)
from controller.instances.guests import guest_spec, refresh_guest
from controller.hosts.host_routing import hypervisor_of_instance
from controller.hosts.image_copy import ensure_image_on_host
from controller.locks import host_changes, one_at_a_time
from controller.lookups import (account_of, account_uuids, flavor_row, instance_row, require_mutate,
                                refuse_user_ids, requester_account, resolve_grantable)
from controller.permissions import Requester
from controller.hosts.placement import placement
from controller.rules import as_uuid, find_or_404, new_id
from controller.hosts.status_sync import sync_statuses
from controller.store import utc_now

log = logging.getLogger(__name__)


def _host_status(ctx: Context, row: dict) -> str:
    """The host's view of the power state, which wins; written when it differs from the stored
    one. A host that cannot answer shows "error" without writing it: the stored state is the
    last one known, kept for when it answers."""
    try:
        status = hypervisor_of_instance(ctx, row).status(row["id"])
    except HostError:
        return "error"
    if status != row["status"]:
        ctx.store.set_instance_status(row["id"], status)
    return status


def iter_instance_json(ctx: Context, requester: Requester, *, cloudauth_id: str | None = None) -> Iterator[str]:
    """The instances the requester sees, as server-instance objects encoded by SQLite: chunks of
    JSON objects joined by commas (store.iter_instance_json), so a superuser's list of
    10,000 is never held whole, in rows or in objects.

    The stored statuses are first brought to the view of the hosts holding rows of this
    list (status_sync: at most one call to each, none for an empty list); a host that
    cannot answer shows "error" on its rows, unwritten."""
    if cloudauth_id is not None:
        cloudauth_id = as_uuid(cloudauth_id)
        if cloudauth_id is None:
            raise InvalidInput("cloudauth-id must be a UUID")
    scope = perms.visible_to(requester)
    held = ctx.store.instance_hosts(visible_to=scope, owner_id=cloudauth_id)
    unreachable = sync_statuses(ctx, held)
    return ctx.store.iter_instance_json(visible_to=scope, owner_id=cloudauth_id, error_hosts=sorted(unreachable),
                                        lease_times=lease_terms.lease_times(ctx))


def instance_json(ctx: Context, requester: Requester, instance_id: str) -> str:
    """The server-instance object of one instance the requester sees, encoded by SQLite as
    the lists are, with the host's status. The stored object is answered as it is read unless
    the host sees another status (status sync keeps them equal): the most frequent request
    neither decodes nor encodes JSON in Python."""
    scope = perms.visible_to(requester)
    times = lease_terms.lease_times(ctx)
    row = find_or_404("server-instance", instance_id,
                      lambda i: ctx.store.get_instance_json(i, visible_to=scope, lease_times=times))
    status = _host_status(ctx, row)
    if status == row["status"]:
        return row["json"]
    # Found again (deleted meanwhile: 404), encoded with the host's status.
    return find_or_404("server-instance", instance_id,
                       lambda i: ctx.store.get_instance_json(i, visible_to=None, status=status,
                                                             lease_times=times))["json"]


def get_instance(ctx: Context, requester: Requester, instance_id: str) -> dict:
    """instance_json() decoded, for the answers of a create or a task."""
    return json.loads(instance_json(ctx, requester, instance_id))


# -- create and delete ---------------------------------------------------------------
def create_instance(ctx: Context, requester: Requester, body: dict) -> dict:
    image_id = as_uuid(body["server-image"])
    image = ctx.store.get_image(image_id) if image_id else None
    if image is None or not (
        requester.is_superuser
        or image["public"]
        or ctx.store.list_images(usable_by=requester.id, image_id=image["id"])
    ):
        raise InvalidInput(f"server-image {shown(body['server-image'])} does not exist or is not available to you")
    if not image["active"]:
        raise InvalidInput(f"server-image {image['id']} is not active; new instances cannot boot from it")
    flavor = flavor_row(ctx, requester, body["server-flavor"])
    if flavor is None:
        raise InvalidInput(f"server-flavor {shown(body['server-flavor'])} does not exist or is not available to you")
    if flavor["memory"] < image["min_ram"] or flavor["disk"] < image["min_disk"]:
        raise InvalidInput(
            f"server-flavor {flavor['id']} is too small for the image "
            f"(needs {image['min_ram']} MB RAM and {image['min_disk']} GB disk)"
        )
    owner_account = requester_account(ctx, requester.id)
    if ctx.store.volume_of_user(requester.id) is None:
        raise Conflict("you have no home volume yet: create one first")
    granted = resolve_grantable(ctx, requester, body.get("users", []))
    uuids = list(dict.fromkeys([owner_account["uuid"], *(a["uuid"] for a in granted)]))

    row = {
        "id": new_id(),
        "owner_id": requester.id,
        "image_id": image["id"],
        "flavor_id": flavor["id"],
        "status": "building",
        "hostname": None,
        "public_ip": None,
        "private_ip": None,
        "creation_date": utc_now(),
        # The flavor's or [leases]'s default lease, from now (None: no lease).
        "expires_at": lease_terms.initial_expiry(ctx, flavor),
    }
    plan = network_plan(ctx.config)

    def admit(*, overrides, owned, allocated):
        limits.admit_owner(ctx.config, flavor=flavor, overrides=overrides, owned=owned)

    # A host that answered when it was placed on may have died since: the create is placed
    # again on the next host with room (Nova's reschedule), at most [hosts]
    # max_create_attempts times. Only a host that did not answer before anything was made
    # there is left this way (HostUnreachable out of the image copy or the spawn: a spawn
    # that began and lost its host raises a HostError naming what may remain instead).
    failed: dict[str, str] = {}
    for _attempt in range(ctx.config.hosts.max_create_attempts):
        # Host capacities are read here if stale, before the transaction: a libvirt call must
        # not hold the database's write lock.
        place = placement(ctx, flavor, failed=failed)
        with host_changes(ctx):
            # The row comes first, with the intent "creating": a crash mid-way leaves a record
            # reconcile undoes (the client saw no 201); any failure here removes whatever was
            # made. The owner's limits are checked, a host with room picked and the addresses
            # allocated in the same transaction.
            placed = ctx.store.insert_instance(row, uuids, admit=admit, place=place,
                                               allocate=lambda used: allocate(plan, row["id"], used))
            try:
                _ensure_image(ctx, image, placed["host"])
                _spawn(ctx, dict(placed, users=uuids), image=image, flavor=flavor)
            except CleanupFailed as e:
                # The host stopped answering mid-way and part of the instance may remain there:
                # the row keeps its intent, for reconcile to remove both once the host answers
                # (deleted now, it would leave a domain, disk or seed without a record).
                _record_failed_create(ctx, placed, requester, e)
                raise
            except HostUnreachable as e:
                ctx.store.delete_instance(placed["id"])
                failed[placed["host"]] = e.message
                log.warning("create of instance %s: host %s does not answer (%s); placing it again",
                            placed["id"], placed["host"], e.message)
                continue
            except BaseException:
                ctx.store.delete_instance(placed["id"])
                raise
            try:
                ctx.store.set_instance_status(placed["id"], hypervisor_of_instance(ctx, placed).status(placed["id"]))
                ctx.store.set_instance_intent(placed["id"], None, expect="creating")
            except BaseException as e:
                if not _undo_spawn(ctx, placed):
                    _record_failed_create(ctx, placed, requester, e)
                raise
        history.record(ctx, placed, "create", requester=requester.id)
        return get_instance(ctx, requester, placed["id"])
    why = "; ".join(f"{n}: {m}" for n, m in sorted(failed.items()))
    raise HostUnavailable(f"server-instance not created: {len(failed)} hypervisor host(s) it was placed on "
                          f"did not answer ({why})")


def _ensure_image(ctx: Context, image: dict, host_name: str) -> None:
    """A host other than the config's gets the image on first use there. The config's own
    host keeps today's behaviour: its base disk is made by `image add` (a missing one is
    reconcile's business, or the sandbox's blank stand-in)."""
    if host_name != ctx.config.libvirt.host_name:
        ensure_image_on_host(ctx, image, host_name)


def _spawn(ctx: Context, row: dict, *, image: dict, flavor: dict) -> None:
    hypervisor_of_instance(ctx, row).spawn(
        row["id"],
        base_image=image["base_volume"],
        vcpu=flavor["vcpu"],
        memory_mb=flavor["memory"],
        disk_gb=flavor["disk"],
        guest=guest_spec(ctx, row),
    )


def respawn(ctx: Context, row: dict) -> None:
    """Build the domain of a recorded instance again (reconcile, after the host lost it)."""
    image = ctx.store.get_image(row["image_id"])
    flavor = ctx.store.get_flavor(row["flavor_id"])
    _ensure_image(ctx, image, row["host"])
    _spawn(ctx, row, image=image, flavor=flavor)
    if row["status"] == "shutoff":
        hypervisor_of_instance(ctx, row).power_off(row["id"])


def _undo_spawn(ctx: Context, row: dict) -> bool:
    """Remove a spawned instance whose create failed after all, then its row. A host that
    cannot be asked to (it stopped answering) keeps the row with its intent "creating", for
    reconcile to remove both once the host answers (as for a crash mid-create): False."""
    try:
        hypervisor_of_instance(ctx, row).destroy(row["id"])
    except ControllerError as e:
        log.warning("instance %s: create failed and its domain could not be removed (%s); "
                    "left for reconcile", row["id"], e.message)
        return False
    ctx.store.delete_instance(row["id"])
    return True


def _record_failed_create(ctx: Context, row: dict, requester: Requester, error: BaseException) -> None:
    """A failed create is in the history only when it leaves its row behind (for reconcile);
    any other failure leaves nothing, as if never asked (docs/decisions.md)."""
    message = error.message if isinstance(error, ControllerError) else history.INTERNAL_ERROR
    history.record(ctx, row, "create", requester=requester.id, result="error", message=message)


def delete_instance(ctx: Context, requester: Requester, instance_id: str) -> str:
    """"" when the instance is gone: its domain, disk, seed, console files, reservations and
    row. Otherwise a message: the delete is accepted, the instance is gone for its users (the
    row keeps its intent "deleting": not listed, 404 to every request), and what remains on
    the host is removed by `cloud-agent reconcile --fix` (docs/decisions.md)."""
    row = instance_row(ctx, requester, instance_id)
    with history.recorded(ctx, row, "delete", requester=requester.id):
        return _delete_visible(ctx, requester, row)


def _delete_visible(ctx: Context, requester: Requester, row: dict) -> str:
    require_mutate(ctx, requester, row, "this server-instance")
    with host_changes(ctx), instance_claims.held(ctx, row["id"], "delete", refresh=None):
        return delete_claimed(ctx, row)


def delete_claimed(ctx: Context, row: dict) -> str:
    """The delete of an instance whose claim the caller holds (under host_changes): as
    delete_instance answers. Also the end of an expired lease (controller/instances/leases.py)."""
    _refuse_while_moving(ctx, row)
    # The intent first: a second delete of the same instance is refused here, and a
    # crash before the row goes is finished by reconcile, never undone.
    if not ctx.store.set_instance_intent(row["id"], "deleting", expect=None):
        raise Conflict(f"server-instance {row['id']} is already being created or deleted")
    hypervisor = hypervisor_of_instance(ctx, row)
    try:
        # The adapter waits (bounded) while the host's storage pool is busy with another
        # volume: a transient refusal is no failure.
        hypervisor.destroy(row["id"])
    except ControllerError as e:
        if _domain_remains(hypervisor, row["id"]):
            # Nothing is gone (the domain goes first): 503 and the instance stays as it
            # was. So on a host that does not answer: its domain, disk and guest may still
            # run there, and a record deleted now could never be cleaned up on that host.
            ctx.store.set_instance_intent(row["id"], None, expect="deleting")
            raise
        # The domain is gone, something else is not: never undone (that would show the
        # owner an instance without a domain); the intent stays for reconcile to finish.
        log.warning("delete of instance %s: the domain is gone but not all of it (%s); "
                    "the delete stays recorded for `cloud-agent reconcile --fix`", row["id"], e.message)
        return (f"server-instance {row['id']} is deleted; host {row['host']} is still removing what "
                f"remains of it ({e.message}): `cloud-agent reconcile --fix` finishes it")
    except BaseException:
        ctx.store.set_instance_intent(row["id"], None, expect="deleting")
        raise
    ctx.store.delete_instance(row["id"])
    return ""


def _domain_remains(hypervisor, instance_id: str) -> bool:
    """After a failed destroy: whether the instance's domain is still defined, so that nothing
    of it was removed yet (destroy removes the domain first). A host that cannot tell counts
    as yes: its domain may still be there."""
    try:
        return hypervisor.describe(instance_id).defined
    except NotFound:
        return False
    except ControllerError:
        return True


def _refuse_while_moving(ctx: Context, row: dict) -> None:
    """An instance being moved to another host (`cloud-agent host drain`) is left alone until
    it is there: a power-on mid-copy would run the guest on a disk being copied (an evacuation
    too)."""
    instance_claims.refuse_while_moving(ctx, row["id"])


def finish_interrupted(ctx: Context, row: dict) -> None:
    """Finish what a crash interrupted (reconcile): a delete is completed, and a create the
    client never saw succeed is undone. Either way the domain, disk and row go, and the
    reservations of the row's MACs (a delete cut short after the domain went no longer has
    the domain to read them from)."""
    hypervisor = hypervisor_of_instance(ctx, row)
    hypervisor.destroy(row["id"])
    macs = [m for m in (row.get("mac"), row.get("public_mac")) if m]
    if macs:
        hypervisor.drop_reservations(macs)
    ctx.store.delete_instance(row["id"])


# -- tasks -------------------------------------------------------------------------------
def run_task(ctx: Context, requester: Requester, instance_id: str, task: dict) -> dict:
    row = instance_row(ctx, requester, instance_id)
    with history.recorded(ctx, row, task["what"], requester=requester.id) as outcome:
        message = _run_task(ctx, requester, row, task)
        if message is None:
            outcome.changed = False
        else:
            outcome.message = message
    return get_instance(ctx, requester, row["id"])


def _run_task(ctx: Context, requester: Requester, row: dict, task: dict) -> str | None:
    """Carry out the task; its history message, None when it changed nothing (not recorded)."""
    require_mutate(ctx, requester, row, "this server-instance")
    what = task["what"]
    instance_id = row["id"]

    def refresh() -> None:  # user changes that came while the claim was held
        refresh_guest(ctx, instance_id)

    if what == "modify-users":
        # Quick: changes of one instance's users in this process wait their turn (one_at_a_time)
        # and then take the instance's claim, which is refused (409) during a power task or a
        # move, in this process or another, rather than waiting a guest's shutdown out.
        with host_changes(ctx), one_at_a_time("instance", row["id"]), \
                instance_claims.held(ctx, row["id"], what, refresh=refresh):
            _refuse_while_moving(ctx, row)
            # Read again under the lock: another modify-users may just have changed the list.
            row = instance_row(ctx, requester, row["id"])
            return "" if _modify_users(ctx, requester, row, how=task["how"], uuids=task["users"]) else None
    if what in ("power-on", "reboot"):
        lease_terms.refuse_expired(ctx, row)
    # A power task may wait minutes for the guest's clean shutdown: the claim, taken first and
    # alone (no in-process lock held meanwhile), makes a second task or a change of users 409
    # at once (instance_claims.py).
    with instance_claims.held(ctx, row["id"], what, refresh=refresh), host_changes(ctx):
        _refuse_while_moving(ctx, row)
        return power_tasks.run(ctx, row, what)

def _modify_users(ctx: Context, requester: Requester, row: dict, *, how: str, uuids: list[str]) -> bool:
    """Change the instance's users; False when the list stays as it was."""
    current = list(row["users"])
    owner_account = account_of(ctx, row["owner_id"])
    owner_uuid = owner_account["uuid"] if owner_account else None
    if how == "delete":
        drop = set(account_uuids(uuids))
        # A user's id where its account id belongs would delete nothing, silently.
        refuse_user_ids(ctx, requester, sorted(drop - set(current)))
        new = [u for u in current if u not in drop]
    else:
        granted = [a["uuid"] for a in resolve_grantable(ctx, requester, uuids)]
        base = current if how == "add" else []
        new = list(dict.fromkeys([*base, *granted]))
    if owner_uuid is not None and owner_uuid not in new:
        new.insert(0, owner_uuid)
    if new == current:
        return False
    hypervisor_of_instance(ctx, row).set_guest(row["id"], guest_spec(ctx, row, new))
    try:
        ctx.store.set_instance_users(row["id"], new)
    except BaseException:
        hypervisor_of_instance(ctx, row).set_guest(row["id"], guest_spec(ctx, row, current))
        raise
    return True
