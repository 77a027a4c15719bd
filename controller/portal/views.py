"""What each page of the cloud portal shows, read as the signed-in user (api/portal/).

One call per page. Each reads through the service functions the JSON resources call
(users, volumes, groups, images, limits, history, console) or the store under the
same visibility rule (permissions.visible_to), so a page shows exactly what the API
would answer that user. None of them decides access on its own. No host is asked,
except for the console tail of one instance's page: lists show the statuses the
controller recorded last (each power task and create records the host's answer).
"""

from controller.instances import console, lease_terms
from controller.users import groups, users
from controller.audit import history
from controller.storage import images, volumes
from controller import limits
from controller import permissions as perms
from controller.context import Context
from controller.errors import ControllerError, HostError
from controller.lookups import account_of, instance_row
from controller.permissions import Requester

# The servers whose lease is ending or has ended an overview lists (soonest first); the rest
# are counted.
ENDING_SHOWN = 10
_LIMIT_LABELS = {"instances": "Servers", "vcpus": "vCPUs", "memory_mb": "Memory (MB)", "groups": "Groups",
                 "managed_users": "Managed users"}
# The console tail shown on an instance's page.
CONSOLE_BYTES = 16 * 1024


def _account(ctx: Context, user_id: str) -> dict | None:
    account = account_of(ctx, user_id)
    if account is None:
        return None
    return {"username": account["username"], "uid": account["uid"], "home": account["home"],
            "uuid": account["uuid"]}


def _usernames(ctx: Context, uuids) -> dict[str, str]:
    return {a["uuid"]: a["username"] for a in ctx.store.accounts_with_owners(uuids=sorted(set(uuids)))}


def _own_volume(ctx: Context, requester: Requester) -> dict | None:
    found = [v for v in volumes.list_volumes(ctx, requester, cloudauth_id=requester.id)
             if v["cloudauth-id"] == requester.id]
    return found[0] if found else None


def overview(ctx: Context, requester: Requester) -> dict:
    scope = perms.visible_to(requester)
    counts = ctx.store.instance_status_counts(visible_to=scope, owner_id=requester.id)
    usage = limits.usage_object(ctx, requester)
    # The requester's own servers whose lease ends within the first warning or has ended: read
    # by the index on expires_at (no lease near its end, no row read).
    times = lease_terms.lease_times(ctx)
    ending = [{"id": r["id"], "hostname": r["hostname"] or "", "expires_at": r["expires_at"],
               "lease": lease_of(r["expires_at"], times)}
              for r in ctx.store.leases_due(times[1]) if r["owner_id"] == requester.id]
    return {
        "cluster": ctx.config.controller_id,
        "cluster_name": ctx.config.controller.name or f"cluster-{ctx.config.controller_id}",
        "is_admin": requester.is_superuser,
        "account": _account(ctx, requester.id),
        "volume": _own_volume(ctx, requester),
        "by_status": sorted(counts.items()),
        "total": sum(counts.values()),
        "limits": limit_rows(usage),
        **ending_leases(ending),
    }


def lease_of(expires_at: str | None, times: tuple[str, str]) -> str:
    """An instance's `lease` (none, active, expiring, expired) as lease_terms.state_of says it, against
    lease_times read once for the whole page."""
    if expires_at is None:
        return "none"
    now, until = times
    return "expired" if expires_at <= now else "expiring" if expires_at <= until else "active"


def ending_leases(servers: list[dict]) -> dict:
    """The overview's servers whose lease is ending or has ended (each with id, hostname,
    expires_at, lease), soonest first: the first ENDING_SHOWN, and how many more."""
    ending = sorted((s for s in servers if s["lease"] in ("expiring", "expired")),
                    key=lambda s: (s["expires_at"], s["id"]))
    return {"ending": ending[:ENDING_SHOWN], "ending_more": max(0, len(ending) - ENDING_SHOWN)}


def limit_rows(usage: dict) -> list[dict]:
    """The limits object of the API (GET /v1/limits) as the overview's rows."""
    return [{"kind": k, "label": _LIMIT_LABELS.get(k, k), **v} for k, v in usage.items() if isinstance(v, dict)]


def servers(ctx: Context, requester: Requester) -> dict:
    rows = ctx.store.list_instances(visible_to=perms.visible_to(requester))
    names = _usernames(ctx, [u for r in rows for u in r["users"]])
    image_names = {i["id"]: i["name"] for i in images.list_images(ctx, requester)}
    flavor_names = {str(f["id"]): f["name"] for f in images.list_flavors(ctx, requester)}
    times = lease_terms.lease_times(ctx)
    shown = [_server(r, names, image_names, flavor_names, times) for r in rows]
    return {"servers": shown, **with_owners(ctx, requester, shown, key="owner_id")}


def with_owners(ctx: Context, requester: Requester, items: list[dict], *, key: str) -> dict:
    """Each item's owner's email (as "owner"), and whether the list shows anyone else's (then
    the page has an Owner column: an admin's or an owner's view)."""
    emails = ctx.store.emails_of(i[key] for i in items)
    for i in items:
        i["owner"] = emails.get(i[key], i[key])
    return {"show_owner": any(i[key] != requester.id for i in items)}


def with_requesters(ctx: Context, history: list[dict]) -> list[dict]:
    """Each history entry's requester as an email where it is a user here."""
    emails = ctx.store.emails_of(h["requester"] for h in history)
    return [{**h, "requester_email": emails.get(h["requester"], h["requester"])} for h in history]


def _server(row: dict, names: dict, image_names: dict, flavor_names: dict, times: tuple[str, str]) -> dict:
    return {
        "id": row["id"], "status": row["status"], "hostname": row["hostname"] or "",
        "private_ip": row["private_ip"] or "", "public_ip": row["public_ip"] or "",
        "image": image_names.get(row["image_id"], row["image_id"]),
        "flavor": flavor_names.get(str(row["flavor_id"]), str(row["flavor_id"])),
        "owner_id": row["owner_id"], "created": row["creation_date"],
        "users": [{"uuid": u, "username": names.get(u, u)} for u in row["users"]],
        "expires_at": row.get("expires_at"), "lease": lease_of(row.get("expires_at"), times),
    }


def grantable(ctx: Context, requester: Requester, *, controller_id: int | None = None) -> list[dict]:
    """The system accounts the requester may grant access to (its managed users') on this
    cluster or, at cloud auth, on the cluster `controller_id`: the API's own check
    (lookups.resolve_grantable) decides again on the create or the change."""
    if requester.is_superuser:
        found = users.list_users(ctx, requester, owner_userid=requester.id)
    else:
        found = [u for u in users.list_users(ctx, requester) if u["id"] != requester.id]
    controller = ctx.config.controller_id if controller_id is None else controller_id
    return [{"uuid": a["uuid"], "username": a["username"], "email": u["email"]}
            for u in found for a in u["system_accounts"] if a["cloud_controller_id"] == controller]


def create_form(ctx: Context, requester: Requester) -> dict:
    return {
        "images": [i for i in images.list_images(ctx, requester) if i.get("active", True)],
        "flavors": images.list_flavors(ctx, requester),
        "grantable": grantable(ctx, requester),
    }


def server_detail(ctx: Context, requester: Requester, instance_id: str) -> dict:
    """One instance (404 unless visible), its console tail and readiness (the one host call
    of the portal), its history, and the `ssh` line for the requester's own account."""
    row = instance_row(ctx, requester, instance_id)
    try:
        tail = console.get_console(ctx, requester, row["id"], max_bytes=CONSOLE_BYTES)
        console_error = ""
    except HostError as e:
        tail, console_error = {"console": "", "ready": False}, e.message
    names = _usernames(ctx, row["users"])
    image_names = {i["id"]: i["name"] for i in images.list_images(ctx, requester)}
    flavor_names = {str(f["id"]): f["name"] for f in images.list_flavors(ctx, requester)}
    mine = _account(ctx, requester.id)
    ssh = f"ssh {mine['username']}@{row['private_ip']}" if mine and row["private_ip"] else ""
    granted = set(row["users"])
    return {
        "server": _server(row, names, image_names, flavor_names, lease_terms.lease_times(ctx)),
        "console": tail["console"],
        "ready": tail["ready"],
        "console_error": console_error,
        "ssh": ssh,
        "history": with_requesters(ctx, list(reversed(history.list_actions(ctx, requester, row["id"])))),
        "grantable": [a for a in grantable(ctx, requester) if a["uuid"] not in granted],
    }


def volume_page(ctx: Context, requester: Requester) -> dict:
    """The requester's account and home volume, with what the home uses where the quota
    backend keeps the figure (`used_bytes`, None otherwise: one cheap read, no tree walked)."""
    account, volume = _account(ctx, requester.id), _own_volume(ctx, requester)
    used = None
    homes = ctx.adapters.homes
    if account is not None and volume is not None and homes.reports_usage:
        try:
            used = homes.usage(account["username"], uid=account["uid"])
        except ControllerError:
            used = None  # the page works without it
    return {"account": account, "volume": volume, "max_size_gb": ctx.config.volumes.max_size_gb,
            "used_bytes": used}


def groups_page(ctx: Context, requester: Requester) -> dict:
    """The groups the requester sees, each with its owner and GID (read from the groups'
    directory; None where it cannot say)."""
    found = groups.list_groups(ctx, requester)
    for g in found:
        try:
            g["gid"] = ctx.adapters.groups.gid(g["group-name"])
        except ControllerError:
            g["gid"] = None
    return {"groups": found, "account": _account(ctx, requester.id),
            **with_owners(ctx, requester, found, key="cloudauth-id")}


def managed_users(ctx: Context, requester: Requester) -> dict:
    """The users the requester owns (a superuser: those it owns too, not everyone)."""
    if requester.is_superuser:
        found = users.list_users(ctx, requester, owner_userid=requester.id)
    else:
        found = [u for u in users.list_users(ctx, requester) if u["id"] != requester.id]
    return {"users": found, "may_create": requester.has("create_user")}



def server_summary(ctx: Context, requester: Requester, instance_id: str) -> dict:
    """One instance as the list shows it (404 unless visible); no host is asked."""
    row = instance_row(ctx, requester, instance_id)
    image_names = {i["id"]: i["name"] for i in images.list_images(ctx, requester)}
    flavor_names = {str(f["id"]): f["name"] for f in images.list_flavors(ctx, requester)}
    return {"server": _server(row, _usernames(ctx, row["users"]), image_names, flavor_names,
                              lease_terms.lease_times(ctx))}
