"""Storage volumes: each user's one home directory on the cluster filesystem, with a quota."""

import math

from controller import permissions as perms
from controller.background import run_later
from controller.context import Context
from controller.errors import Conflict, InvalidInput, NotFound
from controller.instances.guests import refresh_guests
from controller.locks import host_changes, one_at_a_time
from controller.lookups import account_of, find_user, require_mutate, requester_account, volume_row
from controller.permissions import Requester
from controller.rules import as_uuid, check_name, new_id
from controller.store import utc_now
from host_adapters.homes.homes import retired_uid
from host_adapters.homes.quota import GIB


def volume_object(row: dict) -> dict:
    return {
        "volume-id": row["id"],
        "cloudauth-id": row["owner_id"],
        "volume-size": row["size_gb"],
        "volume-type": {"visibility": row["visibility"], "mount-point": row["mount_point"]},
        "creation-date": row["creation_date"],
        "volume-name": row["name"],
    }


def check_size(ctx: Context, size_gb: object) -> int:
    """A volume size in GB: a whole number from 1 to `[volumes] max_size_gb`, which a
    refusal over the cap names."""
    maximum = ctx.config.volumes.max_size_gb
    if not isinstance(size_gb, int) or isinstance(size_gb, bool) or size_gb < 1:
        raise InvalidInput(f"volume-size must be a whole number of GB from 1 to {maximum}")
    if size_gb > maximum:
        raise InvalidInput(f"volume-size {size_gb} GB is too large: at most {maximum} GB ([volumes] max_size_gb)")
    return size_gb


def list_volumes(ctx: Context, requester: Requester, *, cloudauth_id: str | None = None) -> list[dict]:
    if cloudauth_id is not None:
        cloudauth_id = as_uuid(cloudauth_id)
        if cloudauth_id is None:
            raise InvalidInput("cloudauth-id must be a UUID")
    return [volume_object(r) for r in ctx.store.list_volumes(visible_to=perms.visible_to(requester), owner_id=cloudauth_id)]


def get_volume(ctx: Context, requester: Requester, volume_id: str) -> dict:
    return volume_object(volume_row(ctx, requester, volume_id))


def create_volume(ctx: Context, requester: Requester, body: dict) -> dict:
    size = check_size(ctx, body["volume-size"])
    account = requester_account(ctx, requester.id)
    if ctx.store.volume_of_user(requester.id) is not None:
        raise Conflict("you already have a home volume (one per user)")
    homes = ctx.adapters.homes
    row = {
        "id": new_id(),
        "owner_id": requester.id,
        "size_gb": size,
        "name": check_name("volume-name", body.get("volume-name")),
        "visibility": "cluster",
        "mount_point": homes.path(account["username"]),
        "creation_date": utc_now(),
        # The uid the quota is set under, so removal acts on it and on nothing the tree says.
        "uid": account["uid"],
    }
    with host_changes(ctx):
        # The row first, "creating": the UNIQUE owner_id settles a race between two
        # requests before either touches the host, and a crash half way leaves a record
        # reconcile undoes (the client saw no 201).
        ctx.store.insert_volume(row)
        try:
            homes.create(account["username"], uid=account["uid"], gid=account["gid"], size_gb=size)
            ctx.store.set_volume_state(row["id"], "ready", expect="creating")
        except BaseException:
            ctx.store.delete_volume(row["id"])
            raise
        refresh_guests(ctx, [account["uuid"]])
    return volume_object(row)


def _account_of_volume(ctx: Context, row: dict) -> dict:
    account = account_of(ctx, row["owner_id"])
    if account is None:  # the account was removed behind our back; reconcile reports it
        raise Conflict("the volume's owner has no system account; run `cloud-agent reconcile`")
    return account


def delete_volume(ctx: Context, requester: Requester, volume_id: str) -> None:
    row = volume_row(ctx, requester, volume_id)
    require_mutate(ctx, requester, row, "this volume")
    account = _account_of_volume(ctx, row)
    with host_changes(ctx):
        # The intent first: a retried delete of the same home is refused instead of
        # starting a second removal of the tree, and a crash before the row goes is
        # finished by reconcile, never turned back into a home.
        if not ctx.store.set_volume_state(row["id"], "deleting", expect="ready"):
            raise Conflict(f"storage-volume {row['id']} is already being deleted")
        try:
            # One rename: the home is gone from its path at once; removing the tree,
            # which may take minutes, happens in the background.
            retired = ctx.adapters.homes.retire(account["username"], token=row["id"], uid=row["uid"])
        except BaseException:
            ctx.store.set_volume_state(row["id"], "ready", expect="deleting")
            raise
        finish_delete(ctx, row, account)
    if retired is not None:
        run_later(ctx, f"removing deleted home {retired}", lambda: purge_retired(ctx, retired))


def purge_retired(ctx: Context, path: str) -> None:
    with host_changes(ctx):
        remove_retired(ctx, path)


def remove_retired(ctx: Context, path: str) -> None:
    """Remove a retired home and its quota (the caller holds host_changes).

    A per-uid quota (setquota; xfs, whose project follows the uid) is shared by every home
    of that uid, and the user may have made a new volume while the old tree was removed:
    that volume's limit is set again after the removal. Its row is written before its
    home is made, so whichever of the two comes last sets the new volume's limit.
    """
    ctx.adapters.homes.purge(path)
    uid = retired_uid(path)
    if uid is None:
        return
    for row in ctx.store.volumes_with_uid(uid):
        account = account_of(ctx, row["owner_id"])
        if account is None or account["uid"] != uid:
            continue
        try:
            ctx.adapters.homes.resize(account["username"], uid=uid, size_gb=row["size_gb"])
        except NotFound:
            pass  # its home is not made yet: its create sets the limit itself


def finish_delete(ctx: Context, row: dict, account: dict) -> None:
    """The home is gone: drop the row, and the share from instances the user can access."""
    ctx.store.delete_volume(row["id"])
    refresh_guests(ctx, [account["uuid"]])


def list_all_volumes(ctx: Context) -> list[dict]:
    """Admin only (cloud-agent volume list): every ready home volume, oldest first, as the API
    object plus its owner's email (`owner`), the account's `username` and, where the quota
    backend can tell (homes.reports_usage), `used-bytes` (None for a home it has no figure
    for). The usage of every home is read at once, never by walking a tree."""
    rows = ctx.store.list_volumes_with_owners(ctx.config.controller_id)
    found = [dict(volume_object(r), owner=r["owner_email"] or r["owner_id"], username=r["username"]) for r in rows]
    homes = ctx.adapters.homes
    if homes.reports_usage:
        wanted = [(r["username"], r["account_uid"]) for r in rows if r["username"] is not None]
        used = homes.usages(wanted) if wanted else {}
        for obj in found:
            obj["used-bytes"] = used.get(obj["username"])
    return found


def _admin_volume(ctx: Context, target: str) -> dict:
    """The ready volume an admin named: by its owner's EMAIL (a target with an @) or its id."""
    if isinstance(target, str) and "@" in target:
        user = find_user(ctx, target)
        row = ctx.store.volume_of_user(user["id"])
        if row is None or row["state"] != "ready":
            raise NotFound(f"{user['email']} has no storage volume")
        return row
    return volume_row(ctx, None, target)


# How long a resize waits for another resize of the same volume in this process.
RESIZE_WAIT_SECONDS = 30


def _gb(size_bytes: int) -> str:
    """Bytes as GB (GiB) for a message, rounded up to a tenth: never less than it is."""
    return f"{math.ceil(size_bytes * 10 / GIB) / 10:.1f}"


def resize_volume(ctx: Context, target: str, size_gb: int) -> dict:
    """Admin only (cloud-agent volume resize): set the quota of the home volume named by its
    id or its owner's email to size_gb, through the homes adapter, and record it. Refuses a
    size over `[volumes] max_size_gb` and, where the quota backend can tell, a size below
    what the home uses. All or nothing: a failed record puts the old limit back."""
    size = check_size(ctx, size_gb)
    volume_id = _admin_volume(ctx, target)["id"]
    homes = ctx.adapters.homes
    busy = Conflict(f"storage-volume {volume_id} is being resized by another command; try again")
    with host_changes(ctx), one_at_a_time("volume", volume_id, wait_seconds=RESIZE_WAIT_SECONDS, busy=busy):
        # Read again under the locks: a delete may have finished, or another resize.
        row = volume_row(ctx, None, volume_id)
        account = _account_of_volume(ctx, row)
        username, uid = account["username"], account["uid"]
        used = homes.usage(username, uid=uid)
        if used is not None and used > size * GIB:
            raise Conflict(f"the home volume of {username} uses {_gb(used)} GB, more than {size} GB: "
                           "it cannot shrink below what it holds (the user must free space first)")
        homes.resize(username, uid=uid, size_gb=size)
        try:
            if not ctx.store.set_volume_size(row["id"], size):
                raise Conflict(f"storage-volume {row['id']} is being deleted")
        except BaseException as e:
            try:
                homes.resize(username, uid=uid, size_gb=row["size_gb"])
            except NotFound:
                pass  # the home went with its volume
            except Exception as undo:  # noqa: BLE001 - said on the error raised
                e.add_note(f"putting back the limit of {row['size_gb']} GB failed too: {undo}")
            raise
    return volume_object(dict(row, size_gb=size))
