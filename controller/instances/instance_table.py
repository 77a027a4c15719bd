"""Every server-instance as an admin reads it (`cloud-agent server list`): with the names a
person knows them by (owner's email, image and flavor names) and the host each runs on,
which the API's instance object does not carry; and, for a superuser over the API, which
host each one is on (`GET /v1/server-host`, what `cloud server list` shows an admin)."""

from controller import permissions as perms
from controller.context import Context
from controller.lookups import find_user
from controller.permissions import Requester


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
             "private-ip": r["private_ip"], "creation-date": r["creation_date"], "expires-at": r["expires_at"]}
            for r in rows]


def server_hosts(ctx: Context, requester: Requester) -> list[dict]:
    """`{"id", "host"}` of every live instance, oldest first: a superuser's only. Host names
    map the cluster, so a regular user is refused (403) rather than shown its own instances'
    hosts; the server-instance object itself carries no host, for anyone."""
    perms.require_superuser(requester, "listing the hosts of server-instances")
    return [{"id": r["id"], "host": r["host"]} for r in ctx.store.list_instances(visible_to=None)]
