"""UNIX groups (secondary groups only) that users share files through."""

import re

from controller import limits
from controller import permissions as perms
from controller.context import Context
from controller.errors import Conflict, Forbidden, InvalidInput
from controller.instances.guests import refresh_guests_of_usernames
from controller.locks import host_changes, one_at_a_time
from controller.lookups import check_members, group_row, require_mutate
from controller.permissions import Requester
from controller.rules import as_uuid, new_id
from controller.store import utc_now
from host_adapters.names import check_group_name, check_username, privileged_group_name


def group_object(row: dict) -> dict:
    return {
        "group-id": row["id"],
        "cloudauth-id": row["owner_id"],
        "group-name": row["name"],
        "group-members": list(row["members"]),
    }


def list_groups(
    ctx: Context, requester: Requester, *, group_name: str | None = None, cloudauth_id: str | None = None
) -> list[dict]:
    if group_name is not None and cloudauth_id is not None:
        raise InvalidInput("group-name and cloudauth-id cannot be used together")
    if cloudauth_id is not None:
        cloudauth_id = as_uuid(cloudauth_id)
        if cloudauth_id is None:
            raise InvalidInput("cloudauth-id must be a UUID")
    rows = ctx.store.list_groups(visible_to=perms.visible_to(requester), owner_id=cloudauth_id, name=group_name)
    return [group_object(r) for r in rows]


def get_group(ctx: Context, requester: Requester, group_id: str) -> dict:
    return group_object(group_row(ctx, requester, group_id))


# -- the names a group made through the API may take (issue 8, finding 1) ------------------
def _refused_names(ctx: Context) -> frozenset[str]:
    return frozenset(ctx.config.groups.refused_names)


def check_new_group_name(ctx: Context, name: object) -> str:
    """A name for a new API group: the POSIX rule (400), never a privileged name (403), and
    the site's `[groups] name_prefix` and `name_pattern` when set (400). Reads nothing
    on the host."""
    name = check_group_name(name)
    if privileged_group_name(name, _refused_names(ctx)):
        raise Forbidden(f"group name {name} is reserved: membership in a group of that name "
                        "grants privileges on hosts")
    prefix = ctx.config.groups.name_prefix
    if prefix and (not name.startswith(prefix) or name == prefix):
        raise InvalidInput(f"group name {name} must start with {prefix!r} ([groups] name_prefix)")
    pattern = ctx.config.groups.name_pattern
    if pattern and not re.fullmatch(pattern, name):
        # The site's pattern in the admin's words ([groups] name_rule), never the pattern.
        rule = ctx.config.groups.name_rule
        raise InvalidInput(f"group name {name} does not follow this cluster's rule for group names: {rule}"
                           if rule else
                           f"group name {name} does not follow this cluster's rule for group names "
                           "([groups] name_pattern): ask the admin which names are allowed")
    return name


def check_account_username(ctx: Context, username: str) -> None:
    """An account's username never meets an API group's name: with `[groups] name_prefix`
    set, usernames may not start with it (400); and no username may equal an existing
    API group's name (409), whose private group could not be made."""
    prefix = ctx.config.groups.name_prefix
    if prefix and username.startswith(prefix):
        raise InvalidInput(f"username {username} starts with {prefix!r}, the prefix of group names "
                           "([groups] name_prefix)")
    if ctx.store.list_groups(visible_to=None, name=username, with_intents=True):
        raise Conflict(f"a group named {username} was made through the API: the account's private "
                       "group would clash with it; choose another username")


def create_group(ctx: Context, requester: Requester, body: dict) -> dict:
    name = check_group_name(body["group-name"])
    members = check_members(ctx, requester, body.get("group-members", []))
    groups = ctx.adapters.groups
    if groups.get(name) is not None:
        raise Conflict(f"group {name} exists on the host")
    # After the existence check: a reserved name that exists (root) is named as existing.
    check_new_group_name(ctx, name)
    row = {"id": new_id(), "owner_id": requester.id, "name": name, "creation_date": utc_now()}
    with host_changes(ctx):
        # "creating" until groupadd has run: a crash half way is undone by reconcile. The
        # owner's limit is checked in the insert's transaction.
        ctx.store.insert_group(
            row, members,
            admit=lambda *, overrides, owned: limits.admit_count(ctx.config, "groups", overrides=overrides,
                                                                 owned=owned))
        try:
            groups.create(name, members=members)
            ctx.store.set_group_state(row["id"], "ready", expect="creating")
        except BaseException:
            ctx.store.delete_group(row["id"])
            raise
        refresh_guests_of_usernames(ctx, members)
    return group_object(dict(row, members=members))


def update_group(ctx: Context, requester: Requester, group_id: str, body: dict) -> dict:
    row = group_row(ctx, requester, group_id)
    require_mutate(ctx, requester, row, "this group")
    with host_changes(ctx), one_at_a_time("group", row["id"]):
        # Read the members again under the lock: a concurrent change may have just set them.
        return _update_members(ctx, requester, group_row(ctx, requester, group_id), body)


def _update_members(ctx: Context, requester: Requester, row: dict, body: dict) -> dict:
    action, given = body["action"], body["group-members"]
    current = list(row["members"])
    if action == "delete":
        drop = {check_username(u) for u in given}
        new = [m for m in current if m not in drop]
    else:
        checked = check_members(ctx, requester, given)
        new = list(dict.fromkeys([*(current if action == "add" else []), *checked]))
    if new != current:
        # add and delete touch only the named members, so members an admin added
        # by hand survive (reconcile reports them); replace sets the whole list.
        groups, name = ctx.adapters.groups, row["name"]
        if action == "add":
            added = [m for m in new if m not in current]
            groups.add_members(name, added)
            undo = lambda: groups.remove_members(name, added)  # noqa: E731
        elif action == "delete":
            removed = [m for m in current if m not in new]
            groups.remove_members(name, removed)
            undo = lambda: groups.add_members(name, removed)  # noqa: E731
        else:
            groups.set_members(name, new)
            undo = lambda: groups.set_members(name, current)  # noqa: E731
        try:
            ctx.store.set_group_members(row["id"], new)
        except BaseException:
            undo()
            raise
        refresh_guests_of_usernames(ctx, set(new) ^ set(current))
    return group_object(dict(row, members=new))


def delete_group(ctx: Context, requester: Requester, group_id: str) -> None:
    row = group_row(ctx, requester, group_id)
    require_mutate(ctx, requester, row, "this group")
    with host_changes(ctx), one_at_a_time("group", row["id"]):
        # The intent first: a second delete is refused, and a crash before the row goes is
        # finished by reconcile (groupdel again), never turned back into a group.
        if not ctx.store.set_group_state(row["id"], "deleting", expect="ready"):
            raise Conflict(f"group {row['name']} is already being deleted")
        try:
            ctx.adapters.groups.delete(row["name"])
        except BaseException:
            ctx.store.set_group_state(row["id"], "ready", expect="deleting")
            raise
        finish_delete(ctx, row)


def finish_delete(ctx: Context, row: dict) -> None:
    """The group is gone from the host: drop its row, and tell its members' guests."""
    ctx.store.delete_group(row["id"])
    refresh_guests_of_usernames(ctx, row["members"])


def drop_member_everywhere(ctx: Context, username: str) -> None:
    """Take a username out of every group before its account is disabled."""
    for row in ctx.store.groups_with_member(username):
        members = [m for m in ctx.store.list_groups(visible_to=None, group_id=row["id"])[0]["members"] if m != username]
        ctx.adapters.groups.remove_members(row["name"], [username])
        ctx.store.set_group_members(row["id"], members)
