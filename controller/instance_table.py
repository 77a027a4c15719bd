"""Every server-instance as an admin reads it (`cloud-agent server list`): with the names a
person knows them by (owner's email, image and flavor names) and the host each runs on,
which the API's instance object does not carry."""

from controller.context import Context
from controller.lookups import find_user


def admin_list(ctx: Context, *, owner: str | None = None, host: str | None = None) -> list[dict]:
    """Live instances (not being created or deleted), oldest first; only `owner`'s (an email
    or id) or `host`'s when given."""
    owner_id = find_user(ctx, owner)["id"] if owner is not None else None
    emails = {u["id"]: u["email"] for u in ctx.store.list_users(include_inactive=True)}
    image_names = {i["id"]: i["name"] for i in ctx.store.list_images()}
    flavor_names = {f["id"]: f["name"] for f in ctx.store.list_flavors()}
    rows = ctx.store.list_instances(visible_to=None, owner_id=owner_id, host=host)
    return [{"id": r["id"], "hostname": r["hostname"], "status": r["status"], "host": r["host"],
             "owner": emails.get(r["owner_id"], r["owner_id"]), "cloudauth-id": r["owner_id"],
             "image": image_names.get(r["image_id"], r["image_id"]), "server-image": r["image_id"],
             "flavor": flavor_names.get(r["flavor_id"], str(r["flavor_id"])), "server-flavor": str(r["flavor_id"]),
             "private-ip": r["private_ip"], "creation-date": r["creation_date"]}
            for r in rows]
