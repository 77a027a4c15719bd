"""The lookups every resource module shares: a row by id or 404, the owner's system
account, and whether a requester may name accounts (grants and group members).

Below the resource modules (users, accounts, groups, images, instances, volumes): each
of them finds what it acts on here, so none imports another to find a row.
"""

from controller import permissions as perms
from controller.context import Context
from controller.errors import Conflict, InvalidInput, NotFound
from controller.permissions import Requester
from controller.rules import as_decimal, as_uuid, find_or_404
from common.client.image_names import ImageNameError, pick
from common.words import quoted, shown
from host_adapters.names import check_username


# -- users -----------------------------------------------------------------------------
def user_or_404(ctx: Context, userid: str) -> dict:
    return find_or_404("user", userid, ctx.store.get_user)


def user_by_email_or_404(ctx: Context, email: str) -> dict:
    user = ctx.store.get_user_by_email(email)
    if user is None:
        raise NotFound(f"no user with email {shown(email)}")
    return user


def find_user(ctx: Context, who: str) -> dict:
    """The user named by a user id or an email (no address is a UUID), or NotFound."""
    return user_or_404(ctx, who) if as_uuid(who) else user_by_email_or_404(ctx, who)


# -- the owner's system account on this controller --------------------------------------
def account_of(ctx: Context, user_id: str) -> dict | None:
    """The user's system account on this controller, if it has one."""
    return ctx.store.account_of_user(user_id, ctx.config.controller_id)


def requester_account(ctx: Context, user_id: str) -> dict:
    """The requester's system account; a requester without one cannot own what needs it (409)."""
    account = account_of(ctx, user_id)
    if account is None:
        raise Conflict("you have no system account on this cluster yet: ask the cluster's administrators")
    return account


def user_account(ctx: Context, user: dict) -> dict:
    """The system account of a user an admin named (404 without one)."""
    account = account_of(ctx, user["id"])
    if account is None:
        raise NotFound(f"{user['email']} has no system account on this controller")
    return account


# -- rows the requester sees, or 404 ------------------------------------------------------
def instance_row(ctx: Context, requester: Requester, instance_id: str) -> dict:
    scope = perms.visible_to(requester)
    return find_or_404("server-instance", instance_id, lambda i: ctx.store.get_instance(i, visible_to=scope))


def group_row(ctx: Context, requester: Requester, group_id: str) -> dict:
    scope = perms.visible_to(requester)
    return find_or_404("group", group_id,
                       lambda i: next(iter(ctx.store.list_groups(visible_to=scope, group_id=i)), None))


def volume_row(ctx: Context, requester: Requester | None, volume_id: str) -> dict:
    """The volume the requester sees (None: an admin command, every volume)."""
    scope = None if requester is None else perms.visible_to(requester)
    return find_or_404("storage-volume", volume_id,
                       lambda i: next(iter(ctx.store.list_volumes(visible_to=scope, volume_id=i)), None))


def require_mutate(ctx: Context, requester: Requester, row: dict, what: str) -> None:
    """403 unless the requester may change `row` (its owner, the owner's owner, a superuser)."""
    perms.require_mutate(requester, owner_id=row["owner_id"], owner_owner_id=ctx.store.owner_owner(row["owner_id"]),
                         what=what)


def usable_scope(requester: Requester) -> str | None:
    """Whose grants of images and flavors count (None: a superuser may use every one)."""
    return None if requester.is_superuser else requester.id


def parse_flavor_id(value: str) -> int | None:
    # ASCII digits only: str.isdigit() passed "\u00b9" (then int() failed: a 500) and "\u0661" (flavor 1).
    number = as_decimal(value)
    return number if number is not None and number >= 0 else None


def flavor_row(ctx: Context, requester: Requester, given: str) -> dict | None:
    """The flavor, if it exists and the requester may use it; else None."""
    fid = parse_flavor_id(given)
    rows = ctx.store.list_flavors(usable_by=usable_scope(requester), flavor_id=fid) if fid is not None else []
    return rows[0] if rows else None


# -- images by id or name --------------------------------------------------------------------
def image_named(ctx: Context, given: str, requester: Requester | None = None) -> dict:
    """The image row an id or name picks among the images the requester may use (None: an
    admin command, every image), by the one rule of common.client.image_names that `cloud`
    applies too: an id; else the one active image of that name; else the one inactive one.
    Every front end of the controller (cloud-agent, the portal) resolves a typed image name
    here. NotFound when none matches, InvalidInput listing the candidates when several do."""
    rows = ctx.store.list_images(usable_by=None if requester is None else usable_scope(requester))
    by_id = {r["id"]: r for r in rows}
    listed = [{"id": r["id"], "name": r["name"], "active": bool(r["active"]),
               "operating-system": {"name": r["os_name"], "major_version": r["os_major"],
                                    "minor_version": r["os_minor"]}} for r in rows]
    try:
        return by_id[pick(listed, given)["id"]]
    except ImageNameError as e:
        if e.ambiguous:
            raise InvalidInput(e.message) from None
        raise NotFound(f"server-image {shown(given)} not found (no image has that id or name)") from None


def flavor_named(ctx: Context, given: str) -> dict:
    """The flavor row an id or a name picks (flavor names are unique), for admin commands."""
    fid = parse_flavor_id(given)
    row = ctx.store.get_flavor(fid) if fid is not None else None
    row = row or next((r for r in ctx.store.list_flavors() if r["name"] == given), None)
    if row is None:
        raise NotFound(f"no server-flavor with id or name {quoted(given)}")
    return row


# -- accounts a requester may name ----------------------------------------------------------
def account_uuids(given: list) -> list[str]:
    """Account ids (the `uuid` of a system account) as sent, canonical; any that is not a
    UUID is 400."""
    bad = [u for u in given if as_uuid(u) is None]
    if bad:
        raise InvalidInput(f"unknown account ids: {', '.join(shown(u) for u in bad[:5])}")
    return [as_uuid(u) for u in given]


def refuse_user_ids(ctx: Context, requester: Requester, uuids: list[str]) -> None:
    """400 for the first of `uuids` that is a user's id where an account id is taken (an
    instance's `users`), naming the account id to send instead: that user's account on this
    cluster, when the requester may name that user (else the rule that says whom it may)."""
    for given in uuids:
        user = ctx.store.get_user(given)
        if user is None:
            continue
        head = f"{given} is a user id; `users` takes account ids"
        if not (requester.is_superuser or perms.manages(requester, user)):
            raise InvalidInput(f"{head} (the `uuid` of a user's system account), and {OWNERSHIP_RULE}")
        account = account_of(ctx, user["id"])
        if account is None:
            raise InvalidInput(f"{head}: that user has no account on this cluster")
        raise InvalidInput(f"{head}: that user's account on this cluster is {account['uuid']} "
                           f"(username {account['username']})")


def _with_authority(ctx: Context, requester: Requester, key: str, wanted: list[str], *, unknown: str,
                    refused) -> dict[str, dict]:
    """The accounts whose `key` (uuid or username) is in `wanted`: 400 (`unknown`) for one that
    does not exist, 403 (`refused(account)`) for one the requester has no authority over."""
    found = {a[key]: a for a in ctx.store.accounts_with_owners(**{f"{key}s": wanted})}
    missing = [w for w in wanted if w not in found]
    if missing:
        if key == "uuid":
            refuse_user_ids(ctx, requester, missing)
        raise InvalidInput(f"{unknown}: {', '.join(missing[:5])}")
    for account in found.values():
        perms.require_account_authority(requester, account, refused(account))
    return found


# Said whenever a name is refused for it: the refusal tells what would be accepted.
OWNERSHIP_RULE = ("you may name only yourself and the users you own (that hold no role you lack); "
                  "a superuser may name anyone")


def resolve_grantable(ctx: Context, requester: Requester, uuids: list[str]) -> list[dict]:
    """The accounts named by account ids, checked for the requester's authority to grant them."""
    wanted = list(dict.fromkeys(account_uuids(uuids)))
    found = _with_authority(ctx, requester, "uuid", wanted, unknown="unknown account ids",
                            refused=lambda a: f"you may not grant access to {a['username']} (account id "
                                              f"{a['uuid']}): {OWNERSHIP_RULE}")
    return [found[u] for u in wanted]


def check_members(ctx: Context, requester: Requester, usernames: list[str]) -> list[str]:
    """System usernames the requester is, owns, or (as superuser) any; else 400 (unknown) or 403."""
    wanted = list(dict.fromkeys(check_username(u) for u in usernames))
    _with_authority(ctx, requester, "username", wanted, unknown="no system account named",
                    refused=lambda a: f"you may not add {a['username']}: {OWNERSHIP_RULE}")
    return wanted
