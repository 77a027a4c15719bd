"""Server-images (read by users, managed by admins) and server-flavors."""

from controller.config import parse_duration
from controller.context import Context
from controller.errors import Conflict, InvalidInput
from controller.locks import host_changes
from controller.hosts.host_routing import each_host, hypervisor_of_host
from controller.lookups import find_user, flavor_named, flavor_row, image_named, usable_scope
from controller.permissions import Requester
from controller.rules import SHORT_TEXT_MAX, check_name, find_or_404, new_id
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
    _check_image_texts(name=name, os_name=os_name, os_major=os_major, os_minor=os_minor)
    _positive("min-disk", min_disk)
    _positive("min-ram", min_ram)
    if active and (other := ctx.store.active_image_named(name)) is not None:
        # Asked before the upload too (the insert checks again in its transaction).
        raise Conflict(f"an active image is already named {name!r} ({other['id']}): names of active images "
                       "are unique; deactivate that one or choose another name")
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


def _check_image_texts(*, name=None, os_name=None, os_major=None, os_minor=None) -> None:
    if name is not None and not name.strip():
        raise InvalidInput("image name must not be empty")
    check_name("image name", name)
    for field, value in (("os-name", os_name), ("os-major", os_major), ("os-minor", os_minor)):
        check_name(field, value, SHORT_TEXT_MAX)


def _check_flavor_name(name: str) -> None:
    if not name.strip():
        raise InvalidInput("flavor name must not be empty")
    check_name("flavor name", name)


def _image_row(ctx: Context, image_id: str) -> dict:
    """The image an admin named, by id or name (lookups.image_named: the rule every front end shares)."""
    return image_named(ctx, image_id)


def list_all_images(ctx: Context) -> list[dict]:
    """Every image, active or not, public or private (cloud-agent image list)."""
    return [image_object(r) for r in ctx.store.list_images()]


def update_image(ctx: Context, given: str, *, name: str | None = None, os_name: str | None = None,
                 os_major: str | None = None, os_minor: str | None = None, min_ram: int | None = None,
                 public: bool | None = None) -> dict:
    """Change an image's descriptive fields (its base disk, so min-disk, stays what it is)."""
    row = _image_row(ctx, given)
    _check_image_texts(name=name, os_name=os_name, os_major=os_major, os_minor=os_minor)
    changes = {k: v for k, v in (("name", name), ("os_name", os_name), ("os_major", os_major),
                                 ("os_minor", os_minor)) if v is not None}
    if min_ram is not None:
        changes["min_ram"] = _positive("min-ram", min_ram)
    if public is not None:
        changes["public"] = int(public)
    if not changes:
        raise InvalidInput("nothing to change: give --name, --os-name, --os-major, --os-minor, --min-ram "
                           "or --public/--private")
    ctx.store.update_image(row["id"], changes)
    return image_object(ctx.store.get_image(row["id"]))


def delete_image(ctx: Context, given: str) -> dict:
    """Forget an image and remove its base disk from every host (refused while an instance,
    deleted or not yet, names it: an evacuation rebuilds from it). A host that does not
    answer keeps its copy, named in `kept_on` (no instance is ever built on a base disk
    without its row: the copy is only space, removed with virsh vol-delete there)."""
    row = _image_row(ctx, given)
    with host_changes(ctx):
        ctx.store.delete_image(row["id"])
        hosts = [h["name"] for h in ctx.store.list_hosts()]
        results = each_host(hosts, lambda h: hypervisor_of_host(ctx, h).delete_base_image(row["id"]))
    kept = sorted(h for h, r in results.items() if isinstance(r, Exception))
    return {**image_object(row), "deleted": True, "kept_on": kept}


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


def add_flavor(ctx: Context, *, name: str, memory: int, disk: int, vcpu: int, public: bool = True,
               lease_default: str | None = None, lease_max: str | None = None) -> dict:
    """A new flavor; lease_default and lease_max (durations: 36h, 7d; empty or 0: none) are its
    own lease terms, which win over [leases] (docs/leases.md)."""
    _check_flavor_name(name)
    terms = _lease_terms({}, lease_default, lease_max)
    row = ctx.store.insert_flavor(
        {"name": name, "memory": _positive("memory", memory), "disk": _positive("disk", disk),
         "vcpu": _positive("vcpu", vcpu), "public": int(public), **terms}
    )
    return flavor_object(row)  # the API's object, as `flavor add` prints it


def _lease_terms(row: dict, lease_default: str | None, lease_max: str | None) -> dict:
    """The flavor's lease columns for what was given (None: unchanged), checked together."""
    changes = {}
    if lease_default is not None:
        changes["lease_default_seconds"] = parse_duration(lease_default, "--lease-default")
    if lease_max is not None:
        changes["lease_max_seconds"] = parse_duration(lease_max, "--lease-max")
    default = changes.get("lease_default_seconds", row.get("lease_default_seconds"))
    longest = changes.get("lease_max_seconds", row.get("lease_max_seconds"))
    if default is not None and longest is not None and default > longest:
        raise InvalidInput("a flavor's lease-default must not be longer than its lease-max")
    return changes


def _duration_text(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _admin_flavor(row: dict) -> dict:
    """A flavor as an admin reads it: with whether it is public and its own lease terms."""
    return {**flavor_object(row), "public": bool(row["public"]),
            "lease-default": _duration_text(row.get("lease_default_seconds")),
            "lease-max": _duration_text(row.get("lease_max_seconds"))}


def list_all_flavors(ctx: Context) -> list[dict]:
    """Every flavor, with whether it is public and its lease terms (cloud-agent flavor list)."""
    return [_admin_flavor(r) for r in ctx.store.list_flavors()]


def update_flavor(ctx: Context, given: str, *, name: str | None = None, public: bool | None = None,
                  lease_default: str | None = None, lease_max: str | None = None) -> dict:
    """Rename a flavor, change whether it is public, or its lease terms (for new instances and
    renewals; an instance's present end stays). Its sizes stay: the instances made with it
    count them against their owners' limits."""
    row = flavor_named(ctx, given)
    changes = {}
    if name is not None:
        _check_flavor_name(name)
        changes["name"] = name
    if public is not None:
        changes["public"] = int(public)
    changes.update(_lease_terms(row, lease_default, lease_max))
    if not changes:
        raise InvalidInput("nothing to change: give --name, --public/--private, --lease-default or --lease-max")
    ctx.store.update_flavor(row["id"], changes)
    changed = ctx.store.get_flavor(row["id"])
    terms = {k: v for k, v in _admin_flavor(changed).items() if k.startswith("lease-")}
    return {**flavor_object(changed), "public": bool(changed["public"]), **(terms if any(terms.values()) else {})}


def delete_flavor(ctx: Context, given: str) -> dict:
    """Forget a flavor (refused while an instance names it)."""
    row = flavor_named(ctx, given)
    ctx.store.delete_flavor(row["id"])
    return {**flavor_object(row), "deleted": True}


def grant_flavor(ctx: Context, flavor_id: str, who: str) -> dict:
    """Let the user `who` (email or id) create instances with a private flavor (see it in lists, too)."""
    row = flavor_named(ctx, flavor_id)
    _grant_private(ctx, "server-flavor", row, who, ctx.store.grant_flavor)
    return flavor_object(row)
