"""The cloud auth user service: accounts, owners, roles and API secrets."""

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

from common.words import quoted, shown
from controller import limits
from controller import permissions as perms
from controller.users.accounts import follow_active
from controller.context import Context
from controller.errors import Conflict, Forbidden, InvalidInput, NotFound
from controller.instances.guests import refresh_guests_of_user
from controller.lookups import find_user, user_by_email_or_404, user_or_404
from controller.permissions import Requester
from controller.rules import (
    EMAIL_MAX,
    SHORT_TEXT_MAX,
    USERNAME_MAX,
    as_uuid,
    check_email,
    check_length,
    check_name,
    check_password,
    new_id,
)
from controller.security.crypto import new_api_key, new_api_secret
from controller.store import utc_now


def users_live_here(ctx: Context) -> None:
    """A controller following a cloud auth holds a read-only copy of its users."""
    if ctx.config.cloud_auth.url:
        raise Conflict(f"users live at cloud auth {ctx.config.cloud_auth.url}: change them there")


# -- serialisation ------------------------------------------------------------
def account_object(account: dict) -> dict:
    return {
        "id": account["id"],
        "username": account["username"],
        "uuid": account["uuid"],
        "cloud_controller_id": account["cloud_controller_id"],
    }


def user_objects(ctx: Context, users: list[dict], *, superuser_view: bool) -> list[dict]:
    """The API's user objects; the password never appears, superuser fields only for superusers."""
    ids = [u["id"] for u in users]
    accounts = ctx.store.accounts_of_users(ids)
    # At a cloud auth serving several clusters: the accounts each controller registered too.
    for user_id, registered in ctx.store.registered_accounts_of_users(ids).items():
        accounts[user_id] = accounts[user_id] + registered
    owned = ctx.store.count_owned(ids) if superuser_view else {}
    out = []
    for u in users:
        obj = {
            "id": u["id"],
            "email": u["email"],
            "name": u["name"],
            "active": u["active"],
            "system_accounts": [account_object(a) for a in accounts[u["id"]]],
            "created_at_utc": u["created_at_utc"],
        }
        if u["owner_userid"]:
            obj["owner_userid"] = u["owner_userid"]
        if superuser_view:
            obj["api_key"] = u["api_key"]
            obj["num_owned_accounts"] = owned.get(u["id"], 0)
            obj["roles"] = sorted(u["roles"])
            obj["registration_source"] = u["registration_source"]
        out.append(obj)
    return out


def user_object(ctx: Context, user: dict, *, superuser_view: bool) -> dict:
    return user_objects(ctx, [user], superuser_view=superuser_view)[0]


# Long enough for any admin command (an LDAP add, a useradd); a command killed before
# it releases its reservation holds the address no longer than this.
RESERVATION_SECONDS = 600


@contextmanager
def admin_target(ctx: Context, *, holder: str, email: str | None = None, userid: str | None = None) -> Iterator[dict]:
    """The user an admin command acts on, looked up once by email or by id.

    While the command runs, the address the user has at that moment is reserved for
    it: no other user can take that address (/user/update and /user/create answer 409),
    so the address the admin named keeps naming the user being acted on. The command
    acts by the id it got here.
    """
    if (email is None) == (userid is None):
        raise InvalidInput("give the user's email or its user id, not both")
    canonical = None
    if userid is not None:
        canonical = as_uuid(userid)
        if canonical is None:
            raise InvalidInput(f"user id {shown(userid)} is not a UUID")
    reservation = new_id()
    user = ctx.store.reserve_user_email(
        reservation_id=reservation, holder=holder, expires_at=int(time.time()) + RESERVATION_SECONDS,
        user_id=canonical, email=email,
    )
    if user is None:
        raise NotFound(f"no user with email {shown(email)}" if email is not None
                       else f"user {shown(userid)} does not exist")
    try:
        yield user
    finally:
        ctx.store.release_email_reservation(reservation)


# -- operations -----------------------------------------------------------------
def insert_user(
    ctx: Context,
    *,
    email: str,
    password: str,
    name: str = "",
    owner_userid: str | None = None,
    active: int = 1,
    roles: tuple[str, ...] = (),
    registration_source: str = "",
) -> tuple[dict, str]:
    """Create a user with no permission check (the agent and create_user call it).

    A user with an owner counts against the owner's managed_users limit.
    Returns the stored row and the plaintext API secret, which is shown once.
    """
    users_live_here(ctx)
    check_email(email)
    check_name("name", name)
    check_length("registration_source", registration_source, SHORT_TEXT_MAX)
    check_password(password)
    if owner_userid is not None and roles:
        owner = ctx.store.get_user(owner_userid)
        if owner is None or not perms.keeps_owner(owner["roles"], roles):
            raise InvalidInput("a managed user may not hold a role its owner lacks")
    api_secret = new_api_secret()
    user = {
        "id": new_id(),
        "email": email,
        "name": name,
        "password_hash": ctx.passwords.hash(password),
        "active": active,
        "owner_userid": owner_userid,
        "roles": list(roles),
        "registration_source": registration_source,
        "api_key": new_api_key(),
        "api_secret_enc": ctx.secret_box.encrypt(api_secret),
        "created_at_utc": utc_now(),
    }
    ctx.store.insert_user(
        user, admit=lambda *, overrides, owned: limits.admit_count(ctx.config, "managed_users", overrides=overrides,
                                                                    owned=owned))
    return user, api_secret


def create_user(
    ctx: Context,
    requester: Requester,
    *,
    email: str,
    password: str,
    name: str = "",
    owner_userid: str | None = None,
    active: int = 1,
    registration_source: str | None = None,
) -> str:
    users_live_here(ctx)
    perms.require_permission(requester, "create_user", "creating users")
    if active < 0:
        raise InvalidInput("active must be 0 (inactive) or greater (active)")
    if requester.is_superuser:
        if owner_userid is not None:
            owner_userid = as_uuid(owner_userid)
            if owner_userid is None:
                raise InvalidInput("owner_userid must be a UUID")
            if ctx.store.get_user(owner_userid) is None:
                raise InvalidInput(f"owner_userid {owner_userid} does not exist")
    else:
        if owner_userid is not None and as_uuid(owner_userid) != requester.id:
            raise Forbidden("a user without the superuser role can only create users it owns")
        # A non-superuser's new user is always its own managed user.
        owner_userid = requester.id
    user, _secret = insert_user(
        ctx,
        email=email,
        password=password,
        name=name,
        owner_userid=owner_userid,
        active=active,
        registration_source=registration_source if registration_source is not None else "api",
    )
    return user["id"]


def list_users(
    ctx: Context,
    requester: Requester,
    *,
    owner_userid: str | None = None,
    show_inactive: bool | None = None,
    registration_source: str | None = None,
) -> list[dict]:
    check_length("registration_source", registration_source, SHORT_TEXT_MAX)
    if not requester.is_superuser:
        given = [
            name
            for name, value in (
                ("owner_userid", owner_userid),
                # show_inactive counts as given with any value but 0/false (docs/api.md).
                ("show_inactive", show_inactive or None),
                ("registration_source", registration_source),
            )
            if value is not None
        ]
        if given:
            raise Forbidden(f"{', '.join(given)} may only be used by a superuser")
        # The store's candidates are the requester and the users it owns; ownership of a user
        # holding roles the requester lacks gives no view of it.
        users = [u for u in ctx.store.list_users(visible_to=requester.id) if perms.can_view_user(requester, u)]
    else:
        if owner_userid is not None:
            owner_userid = as_uuid(owner_userid)
            if owner_userid is None:
                raise InvalidInput("owner_userid must be a UUID")
        users = ctx.store.list_users(
            owner_userid=owner_userid,
            include_inactive=bool(show_inactive),
            registration_source=registration_source,
        )
    return user_objects(ctx, users, superuser_view=requester.is_superuser)


def view_user(ctx: Context, requester: Requester, userid: str) -> dict:
    user = user_or_404(ctx, userid)
    if not perms.can_view_user(requester, user):
        raise Forbidden("you may not view this user")
    return user_object(ctx, user, superuser_view=requester.is_superuser)


def update_user(
    ctx: Context,
    requester: Requester,
    userid: str,
    *,
    email: str | None = None,
    name: str | None = None,
    active: int | None = None,
) -> None:
    users_live_here(ctx)
    user = user_or_404(ctx, userid)
    if not perms.can_update_user(requester, user):
        raise Forbidden("you may not update this user")
    changes: dict = {}
    if active is not None:
        perms.require_superuser(requester, "changing active")
        if active < 0:
            raise InvalidInput("active must be 0 (inactive) or greater (active)")
        changes["active"] = active
    if email is not None:
        changes["email"] = check_email(email)
    if name is not None:
        changes["name"] = check_name("name", name)
    # Deactivation locks the system account too, reactivation unlocks it (issue 8, finding 9).
    undo = follow_active(ctx, user["id"], active) if active is not None else (lambda: None)
    try:
        ctx.store.update_user(user["id"], changes)
    except BaseException:
        undo()
        raise
    if active is not None and bool(active) != bool(user["active"]):
        refresh_guests_of_user(ctx, user["id"])


def search_users(
    ctx: Context, requester: Requester, *, email: str | None = None, username: str | None = None
) -> list[dict]:
    if email is None and username is None:
        raise InvalidInput("give email or username to search for")
    check_length("email", email, EMAIL_MAX)
    check_length("username", username, USERNAME_MAX)
    if username is not None:
        candidates = ctx.store.users_with_username(username)
        if email is not None:
            candidates = [u for u in candidates if u["email"].lower() == email.lower()]
    else:
        found = ctx.store.get_user_by_email(email)
        candidates = [found] if found else []
    visible = [u for u in candidates if perms.can_view_user(requester, u)]
    return user_objects(ctx, visible, superuser_view=requester.is_superuser)


def set_password(ctx: Context, requester: Requester, userid: str, *, password: str) -> None:
    users_live_here(ctx)
    perms.require_superuser(requester, "setting a password")
    user = user_or_404(ctx, userid)
    check_password(password)
    ctx.store.set_password_hash(user["id"], ctx.passwords.hash(password))


def view_api_secret(ctx: Context, requester: Requester, userid: str) -> str | None:
    users_live_here(ctx)
    if not requester.has("view_user_secret"):
        raise Forbidden("viewing an API secret needs the superuser role or view_user_secret")
    user = user_or_404(ctx, userid)
    if not perms.can_view_secret(requester, user):
        raise Forbidden("you may not view this user's API secret")
    if user["api_secret_enc"] is None:
        return None
    return ctx.secret_box.decrypt(user["api_secret_enc"])


def reset_api_secret(ctx: Context, requester: Requester, userid: str, *, set_to_null: bool = False) -> str | None:
    users_live_here(ctx)
    perms.require_superuser(requester, "resetting an API secret")
    user = user_or_404(ctx, userid)
    secret = None if set_to_null else new_api_secret()
    ctx.store.set_api_secret(user["id"], None if secret is None else ctx.secret_box.encrypt(secret))
    return secret


# -- the administrator's command (cloud-agent: the machine's root, no requester) -------------
def admin_list_users(ctx: Context, *, include_inactive: bool = True) -> list[dict]:
    """Every user, as a superuser sees them (cloud-agent user list)."""
    return user_objects(ctx, ctx.store.list_users(include_inactive=include_inactive), superuser_view=True)


def admin_set_password(ctx: Context, user: dict, password: str) -> None:
    """A new password for a user who lost theirs; its password logins end."""
    users_live_here(ctx)
    check_password(password)
    ctx.store.set_password_hash(user["id"], ctx.passwords.hash(password))


def admin_api_secret(ctx: Context, user: dict, *, reset: bool) -> str | None:
    """The user's API secret; with reset a new one first (the old one's tokens end)."""
    users_live_here(ctx)
    if reset:
        secret = new_api_secret()
        ctx.store.set_api_secret(user["id"], ctx.secret_box.encrypt(secret))
        return secret
    return None if user["api_secret_enc"] is None else ctx.secret_box.decrypt(user["api_secret_enc"])


def delete_user(ctx: Context, requester: Requester, email: str) -> dict:
    users_live_here(ctx)
    perms.require_superuser(requester, "deleting a user")
    check_length("email", email, EMAIL_MAX)
    user = user_by_email_or_404(ctx, email)
    has_volume, has_account = ctx.store.user_has_volume_or_account(user["id"])
    if has_volume:
        raise Conflict(f"user {email} still has a storage volume: delete it first")
    if has_account:
        raise Conflict(f"user {email} has a system account (the account is enabled) and cannot be deleted")
    try:
        ctx.store.delete_user(user["id"])
    except sqlite3.IntegrityError:
        # Instances and groups reference their owner with ON DELETE RESTRICT.
        raise Conflict(f"user {email} still owns server-instances or groups: delete them first") from None
    return user


def change_role(ctx: Context, who: str, role: str, *, grant: bool) -> tuple[dict, list[dict]]:
    """Admin (agent) only: add or remove a role of section 3 of the user `who` (email or id).

    An owner must hold every role of its managed users (permissions.keeps_owner): a
    grant that gives the user a role its owner lacks detaches it from the owner, and a
    revoke that takes from the user a role one of its managed users holds detaches that
    managed user. Returns the user as stored and the links cut ({"user_id", "owner_userid"}).
    """
    users_live_here(ctx)
    if role not in perms.ROLES:
        raise InvalidInput(f"unknown role {quoted(role)}; roles are {', '.join(perms.ROLES)}")
    user = find_user(ctx, who)
    roles = set(user["roles"])
    roles = roles | {role} if grant else roles - {role}
    cut = ctx.store.set_roles(user["id"], sorted(roles), keeps_owner=perms.keeps_owner)
    return ctx.store.get_user(user["id"]), cut
