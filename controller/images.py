"""Server-images (read by users, managed by admins) and server-flavors."""

from controller.context import Context
from controller.errors import Conflict, InvalidInput
from controller.locks import host_changes
from controller.lookups import find_user, flavor_row, parse_flavor_id, usable_scope
from controller.permissions import Requester
from controller.rules import NAME_MAX, SHORT_TEXT_MAX, check_length, find_or_404, new_id
from controller.store import utc_now


def image_object(row: dict) -> dict:
    return {
        "id": row["id"],
        "name": row["name"],
        "public": bool(row["public"]),
        "operating-system": {
            "name": row["os_name"],
            "major_version": row["os_major"],
            "minor_version": row["os_minor"],
        },
        "min-disk": row["min_disk"],
        "min-ram": row["min_ram"],
        "creation-date": row["creation_date"],
        "active": bool(row["active"]),
    }


def flavor_object(row: dict) -> dict:
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "memory": row["memory"],
        "disk": row["disk"],
        "vcpu": row["vcpu"],
    }


def list_images(ctx: Context, requester: Requester) -> list[dict]:
    return [image_object(r) for r in ctx.store.list_images(usable_by=usable_scope(requester))]


def get_image(ctx: Context, requester: Requester, image_id: str) -> dict:
    usable_by = usable_scope(requester)
    return image_object(find_or_404(
        "server-image", image_id,
        lambda i: next(iter(ctx.store.list_images(usable_by=usable_by, image_id=i)), None)))


def list_flavors(ctx: Context, requester: Requester) -> list[dict]:
    """Public flavors and the private ones granted to the requester (a superuser: all)."""
    return [flavor_object(r) for r in ctx.store.list_flavors(usable_by=usable_scope(requester))]


def get_flavor(ctx: Context, requester: Requester, flavor_id: str) -> dict:
    return flavor_object(find_or_404("server-flavor", flavor_id, lambda fid: flavor_row(ctx, requester, fid),
                                     parse=lambda v: v if isinstance(v, str) else None))


# -- admin operations (cloud-agent) -------------------------------------------
def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer")
    return value


def add_image(
    ctx: Context,
    *,
    name: str,
    os_name: str,
    os_major: str,
    os_minor: str,
    min_disk: int,
    min_ram: int,
    public: bool = True,
    active: bool = True,
    source: str | None = None,
    progress=None,
) -> dict:
    """Register an image: a base volume in the storage pool (blank of min_disk GB, or uploaded from source)."""
    if not name.strip():
        raise InvalidInput("image name must not be empty")
    check_length("image name", name, NAME_MAX)
    for field, value in (("os-name", os_name), ("os-major", os_major), ("os-minor", os_minor)):
        check_length(field, value, SHORT_TEXT_MAX)
    _positive("min-disk", min_disk)
    _positive("min-ram", min_ram)
    image_id = new_id()
    # Under the host-change lock (shared): `reconcile --fix` never removes the temporary
    # volume of this upload as one a crash left.
    with host_changes(ctx):
        base = ctx.adapters.hypervisor.create_base_image(image_id, size_gb=min_disk, source=source,
                                                         progress=progress)
    row = {
        "id": image_id,
        "name": name,
        "public": int(public),
        "os_name": os_name,
        "os_major": os_major,
        "os_minor": os_minor,
        "min_disk": min_disk,
        "min_ram": min_ram,
        "active": int(active),
        "base_volume": base,
        "creation_date": utc_now(),
    }
    try:
        ctx.store.insert_image(row)
    except BaseException:
        ctx.adapters.hypervisor.delete_base_image(image_id)
        raise
    return image_object(row)


def _image_row(ctx: Context, image_id: str) -> dict:
    return find_or_404("server-image", image_id, ctx.store.get_image)


def set_image_active(ctx: Context, image_id: str, active: bool) -> dict:
    # The stored (canonical) id from here on: the admin may have typed it in upper case.
    canonical = _image_row(ctx, image_id)["id"]
    ctx.store.update_image(canonical, {"active": int(active)})
    return image_object(ctx.store.get_image(canonical))


def _grant_private(ctx: Context, kind: str, row: dict, who: str, grant) -> None:
    """grant(row id, user id) for the user `who` (email or id); a public row needs none (409)."""
    if row["public"]:
        raise Conflict(f"{kind} {row['id']} is public: every user may use it already")
    grant(row["id"], find_user(ctx, who)["id"])


def grant_image(ctx: Context, image_id: str, who: str) -> dict:
    """Let the user `who` (email or id) boot from a private image."""
    row = _image_row(ctx, image_id)
    _grant_private(ctx, "server-image", row, who, ctx.store.grant_image)
    return image_object(row)


def add_flavor(ctx: Context, *, name: str, memory: int, disk: int, vcpu: int, public: bool = True) -> dict:
    if not name.strip():
        raise InvalidInput("flavor name must not be empty")
    check_length("flavor name", name, NAME_MAX)
    row = ctx.store.insert_flavor(
        {"name": name, "memory": _positive("memory", memory), "disk": _positive("disk", disk),
         "vcpu": _positive("vcpu", vcpu), "public": int(public)}
    )
    return flavor_object(row)


def _flavor_row(ctx: Context, flavor_id: str) -> dict:
    return find_or_404("server-flavor", flavor_id, ctx.store.get_flavor, parse=parse_flavor_id)


def grant_flavor(ctx: Context, flavor_id: str, who: str) -> dict:
    """Let the user `who` (email or id) create instances with a private flavor (see it in lists, too)."""
    row = _flavor_row(ctx, flavor_id)
    _grant_private(ctx, "server-flavor", row, who, ctx.store.grant_flavor)
    return flavor_object(row)
