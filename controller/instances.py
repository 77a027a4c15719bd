"""Server-instances: VMs built from an image and a flavor, with the homes of their users mounted."""

import logging

from controller import permissions as perms
from controller.context import Context
from controller.errors import Conflict, HostError, InvalidInput, NotFound
from controller.images import get_flavor_row
from controller.permissions import Requester
from controller.rules import as_uuid, new_id
from controller.store import utc_now

log = logging.getLogger(__name__)


def instance_object(row: dict) -> dict:
    obj = {
        "id": row["id"],
        "cloudauth-id": row["owner_id"],
        "users": list(row["users"]),
        "server-image": row["image_id"],
        "server-flavor": str(row["flavor_id"]),
        "creation-date": row["creation_date"],
        "status": row["status"],
    }
    for field, column in (("hostname", "hostname"), ("public-ip", "public_ip"), ("private-ip", "private_ip")):
        if row.get(column):
            obj[field] = row[column]
    return obj


def _refresh_status(ctx: Context, row: dict) -> dict:
    """The host's view of the power state wins; a host that cannot answer leaves the stored one."""
    try:
        status = ctx.adapters.hypervisor.status(row["id"])
    except HostError:
        return row
    if status != row["status"]:
        ctx.store.set_instance_status(row["id"], status)
        row["status"] = status
    return row


def _get_row(ctx: Context, requester: Requester, instance_id: str) -> dict:
    canonical = as_uuid(instance_id)
    rows = ctx.store.list_instances(visible_to=perms.visible_to(requester), instance_id=canonical) if canonical else []
    if not rows:
        raise NotFound(f"server-instance {instance_id} not found")
    return rows[0]


def _require_mutate(ctx: Context, requester: Requester, row: dict) -> None:
    perms.require_mutate(requester, owner_id=row["owner_id"], owner_owner_id=ctx.store.owner_owner(row["owner_id"]),
                         what="this server-instance")


def list_instances(ctx: Context, requester: Requester, *, cloudauth_id: str | None = None) -> list[dict]:
    if cloudauth_id is not None:
        cloudauth_id = as_uuid(cloudauth_id)
        if cloudauth_id is None:
            raise InvalidInput("cloudauth-id must be a UUID")
    rows = ctx.store.list_instances(visible_to=perms.visible_to(requester), owner_id=cloudauth_id)
    return [instance_object(_refresh_status(ctx, r)) for r in rows]


def get_instance(ctx: Context, requester: Requester, instance_id: str) -> dict:
    return instance_object(_refresh_status(ctx, _get_row(ctx, requester, instance_id)))


# -- users with access ----------------------------------------------------------
def resolve_grantable(ctx: Context, requester: Requester, uuids: list[str]) -> list[dict]:
    """The accounts named by controller user ids, checked for the requester's authority to grant them."""
    bad = [u for u in uuids if as_uuid(u) is None]
    if bad:
        raise InvalidInput(f"unknown user ids: {', '.join(map(str, bad[:5]))}")
    wanted = list(dict.fromkeys(as_uuid(u) for u in uuids))
    found = {a["uuid"]: a for a in ctx.store.accounts_with_owners(uuids=wanted)}
    unknown = [u for u in wanted if u not in found]
    if unknown:
        raise InvalidInput(f"unknown user ids: {', '.join(unknown[:5])}")
    for account in found.values():
        perms.require_account_authority(requester, account, f"you may not grant access to user id {account['uuid']}")
    return [found[u] for u in wanted]


def expected_shares(ctx: Context, account_uuids: list[str]) -> list[tuple[str, str]]:
    """One (tag, home) share per user with access whose home volume exists."""
    accounts = ctx.store.accounts_with_owners(uuids=account_uuids)
    with_volume = ctx.store.volume_owners([a["user_id"] for a in accounts])
    homes = ctx.adapters.homes
    order = {u: i for i, u in enumerate(account_uuids)}
    return [
        (a["username"], homes.path(a["username"]))
        for a in sorted(accounts, key=lambda a: order[a["uuid"]])
        if a["user_id"] in with_volume
    ]


def _owner_account(ctx: Context, user_id: str) -> dict:
    account = ctx.store.account_of_user(user_id, ctx.config.controller_id)
    if account is None:
        raise Conflict("the requester has no system account on this cluster")
    return account


# -- create and delete ---------------------------------------------------------------
def create_instance(ctx: Context, requester: Requester, body: dict) -> dict:
    image_id = as_uuid(body["server-image"])
    image = ctx.store.get_image(image_id) if image_id else None
    if image is None or not (
        requester.is_superuser
        or image["public"]
        or ctx.store.list_images(usable_by=requester.id, image_id=image["id"])
    ):
        raise InvalidInput(f"server-image {body['server-image']} does not exist or is not available to you")
    if not image["active"]:
        raise InvalidInput(f"server-image {image['id']} is not active; new instances cannot boot from it")
    flavor = get_flavor_row(ctx, body["server-flavor"])
    if flavor is None:
        raise InvalidInput(f"server-flavor {body['server-flavor']} does not exist")
    if flavor["memory"] < image["min_ram"] or flavor["disk"] < image["min_disk"]:
        raise InvalidInput(
            f"server-flavor {flavor['id']} is too small for the image "
            f"(needs {image['min_ram']} MB RAM and {image['min_disk']} GB disk)"
        )
    owner_account = _owner_account(ctx, requester.id)
    if ctx.store.volume_of_user(requester.id) is None:
        raise Conflict("the requester has no storage volume: create one first")
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
    }
    _ensure_base_image(ctx, image)
    # The row comes first so a crash mid-way leaves a "building" record reconcile can see;
    # any failure below removes whatever was made.
    ctx.store.insert_instance(row, uuids)
    try:
        _spawn(ctx, row["id"], image=image, flavor=flavor, account_uuids=uuids)
    except BaseException:
        ctx.store.delete_instance(row["id"])
        raise
    try:
        ctx.store.set_instance_status(row["id"], ctx.adapters.hypervisor.status(row["id"]))
    except BaseException:
        _undo_spawn(ctx, row["id"])
        raise
    return get_instance(ctx, requester, row["id"])


def _spawn(ctx: Context, instance_id: str, *, image: dict, flavor: dict, account_uuids: list[str]) -> None:
    ctx.adapters.hypervisor.spawn(
        instance_id,
        base_image=image["base_volume"],
        vcpu=flavor["vcpu"],
        memory_mb=flavor["memory"],
        disk_gb=flavor["disk"],
        shares=expected_shares(ctx, account_uuids),
    )


def _ensure_base_image(ctx: Context, image: dict) -> None:
    hypervisor = ctx.adapters.hypervisor
    if image["id"] in hypervisor.list_base_images():
        return
    if not ctx.config.is_sandbox:
        raise HostError(
            f"the base disk of server-image {image['id']} is missing on the host; "
            "see `cloud-agent reconcile`"
        )
    # The sandbox's libvirt test driver keeps its volumes per process, so an image
    # the agent added in another process has no disk here yet: a blank one stands in.
    hypervisor.create_base_image(image["id"], size_gb=image["min_disk"])


def respawn(ctx: Context, row: dict) -> None:
    """Build the domain of a recorded instance again (reconcile, after the host lost it)."""
    image = ctx.store.get_image(row["image_id"])
    flavor = ctx.store.get_flavor(row["flavor_id"])
    _spawn(ctx, row["id"], image=image, flavor=flavor, account_uuids=row["users"])
    if row["status"] == "shutoff":
        ctx.adapters.hypervisor.power_off(row["id"])


def _undo_spawn(ctx: Context, instance_id: str) -> None:
    try:
        ctx.adapters.hypervisor.destroy(instance_id)
    finally:
        ctx.store.delete_instance(instance_id)


def delete_instance(ctx: Context, requester: Requester, instance_id: str) -> None:
    row = _get_row(ctx, requester, instance_id)
    _require_mutate(ctx, requester, row)
    ctx.adapters.hypervisor.destroy(row["id"])
    ctx.store.delete_instance(row["id"])


# -- tasks -------------------------------------------------------------------------------
def run_task(ctx: Context, requester: Requester, instance_id: str, task: dict) -> dict:
    row = _get_row(ctx, requester, instance_id)
    _require_mutate(ctx, requester, row)
    what = task["what"]
    hypervisor = ctx.adapters.hypervisor
    if what == "modify-users":
        _modify_users(ctx, requester, row, how=task["how"], uuids=task["users"])
    elif what == "power-on":
        hypervisor.power_on(row["id"])
    elif what == "power-off":
        hypervisor.power_off(row["id"])
    elif what == "reboot":
        if hypervisor.status(row["id"]) != "running":
            raise Conflict("reboot needs a running server-instance")
        hypervisor.reboot(row["id"])
    return get_instance(ctx, requester, row["id"])


def _modify_users(ctx: Context, requester: Requester, row: dict, *, how: str, uuids: list[str]) -> None:
    current = list(row["users"])
    owner_account = ctx.store.account_of_user(row["owner_id"], ctx.config.controller_id)
    owner_uuid = owner_account["uuid"] if owner_account else None
    if how == "delete":
        bad = [u for u in uuids if as_uuid(u) is None]
        if bad:
            raise InvalidInput(f"unknown user ids: {', '.join(map(str, bad[:5]))}")
        drop = {as_uuid(u) for u in uuids}
        new = [u for u in current if u not in drop]
    else:
        granted = [a["uuid"] for a in resolve_grantable(ctx, requester, uuids)]
        base = current if how == "add" else []
        new = list(dict.fromkeys([*base, *granted]))
    if owner_uuid is not None and owner_uuid not in new:
        new.insert(0, owner_uuid)
    if new == current:
        return
    ctx.adapters.hypervisor.set_shares(row["id"], expected_shares(ctx, new))
    try:
        ctx.store.set_instance_users(row["id"], new)
    except BaseException:
        ctx.adapters.hypervisor.set_shares(row["id"], expected_shares(ctx, current))
        raise


def refresh_shares_of_account(ctx: Context, account_uuid: str) -> None:
    """Re-apply the shares of every instance the account can access (its volume came or went).

    The volume change this follows has happened and stays; a share that cannot be
    updated now is logged, and `cloud-agent reconcile` reports and repairs it.
    """
    for instance_id in ctx.store.instances_with_account(account_uuid):
        users = ctx.store.instance_users([instance_id]).get(instance_id, [])
        try:
            ctx.adapters.hypervisor.set_shares(instance_id, expected_shares(ctx, users))
        except (NotFound, HostError) as e:
            log.warning("shares of instance %s not updated (reconcile will): %s", instance_id, e.message)


def drop_account_everywhere(ctx: Context, account: dict) -> None:
    """Remove an account from the user lists (and shares) of every instance before it is disabled."""
    for instance_id in ctx.store.instances_with_account(account["uuid"]):
        users = [u for u in ctx.store.instance_users([instance_id]).get(instance_id, []) if u != account["uuid"]]
        try:
            ctx.adapters.hypervisor.set_shares(instance_id, expected_shares(ctx, users))
        except NotFound:
            pass
        ctx.store.set_instance_users(instance_id, users)

