"""System accounts: enabling a cloud auth user on this cluster (the agent's `account` commands)."""

import os

from controller.context import Context
from controller.errors import Conflict, NotFound
from controller.groups import check_account_username
from controller.rules import new_id
from controller.store import utc_now
from controller.users import get_user_by_email_or_404
from host_adapters.names import check_username


def enable_account(ctx: Context, email: str, *, username: str, uid: int | None = None) -> dict:
    """Create the directory account and record it; all or nothing."""
    check_username(username)
    check_account_username(ctx, username)
    user = get_user_by_email_or_404(ctx, email)
    controller_id = ctx.config.controller_id
    if ctx.store.account_of_user(user["id"], controller_id) is not None:
        raise Conflict(f"{email} already has a system account on this controller")
    if ctx.store.get_account_by_username(username) is not None:
        raise Conflict(f"system account {username} is already recorded")
    adapters = ctx.adapters
    home = os.path.join(ctx.config.get("volumes", "home_root"), username)
    posix = adapters.directory.create_account(username, home=home, uid=uid)
    try:
        return ctx.store.insert_account(
            {
                "user_id": user["id"],
                "username": posix.username,
                "uuid": new_id(),
                "uid": posix.uid,
                "gid": posix.gid,
                "home": posix.home,
                "cloud_controller_id": controller_id,
                "created_at_utc": utc_now(),
            }
        )
    except BaseException:
        adapters.directory.delete_account(username)
        raise


def disable_account(ctx: Context, email: str) -> dict:
    """Remove the user's system account; refused while it still has a volume or owns instances."""
    user = get_user_by_email_or_404(ctx, email)
    account = ctx.store.account_of_user(user["id"], ctx.config.controller_id)
    if account is None:
        raise NotFound(f"{email} has no system account on this controller")
    if ctx.store.volume_of_user(user["id"]) is not None:
        raise Conflict(f"{email} still has a storage volume: delete it first")
    if ctx.store.list_instances(visible_to=None, owner_id=user["id"]):
        raise Conflict(f"{email} still owns server-instances: delete them first")
    if ctx.store.list_groups(visible_to=None, owner_id=user["id"]):
        raise Conflict(f"{email} still owns groups: delete them first")
    from controller import groups, instances

    instances.drop_account_everywhere(ctx, account)
    groups.drop_member_everywhere(ctx, account["username"])
    ctx.adapters.directory.delete_account(account["username"])
    ctx.store.delete_account(account["id"])
    return account
