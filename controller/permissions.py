"""Every permission decision of the project, in one place (the rules: docs/api.md, "Who may do what")."""

from dataclasses import dataclass

from controller.errors import Forbidden

SUPERUSER = "superuser"
PERMISSIONS = ("view_user", "create_user", "update_user", "view_user_secret")
ROLES = (SUPERUSER, *PERMISSIONS)


@dataclass(frozen=True)
class Requester:
    id: str
    roles: frozenset[str]

    @classmethod
    def from_user(cls, user: dict) -> "Requester":
        return cls(id=user["id"], roles=frozenset(user.get("roles") or ()))

    @property
    def is_superuser(self) -> bool:
        return SUPERUSER in self.roles

    def has(self, permission: str) -> bool:
        return self.is_superuser or permission in self.roles


# -- ownership ----------------------------------------------------------------
def lacks(holder_roles, roles) -> set[str]:
    """The roles among `roles` that `holder_roles` does not give (superuser gives every role)."""
    held = set(holder_roles)
    return set() if SUPERUSER in held else set(roles) - held


def keeps_owner(owner_roles, user_roles) -> bool:
    """An ownership link holds only while the owner has every role of its managed user.

    Otherwise the owner's authority over the user (view, update, its secret, its
    resources) would hand it roles it was never given: granting such a role to a
    managed user, or taking it from the owner, cuts the link (Store.set_roles).
    """
    return not lacks(owner_roles, user_roles)


# -- cloud auth users -------------------------------------------------------
def manages(requester: Requester, target: dict) -> bool:
    """The requester is the target, or owns it and holds every role it holds (view_user /
    update_user on it). `target` carries id, owner_userid and roles."""
    if requester.id == target["id"]:
        return True
    # Checked here too, not only by cutting links on a grant: a link made before that rule
    # (or by a path that forgot it) gives no authority over a user with more roles.
    return target.get("owner_userid") == requester.id and keeps_owner(requester.roles, target["roles"])


def can_view_user(requester: Requester, target: dict) -> bool:
    return requester.is_superuser or manages(requester, target)


def can_update_user(requester: Requester, target: dict) -> bool:
    return requester.is_superuser or manages(requester, target)


def require_superuser(requester: Requester, what: str) -> None:
    if not requester.is_superuser:
        raise Forbidden(f"{what} needs the superuser role")


def require_permission(requester: Requester, permission: str, what: str) -> None:
    if not requester.has(permission):
        raise Forbidden(f"{what} needs the {permission} permission")


def can_view_secret(requester: Requester, target: dict) -> bool:
    return requester.is_superuser or ("view_user_secret" in requester.roles and manages(requester, target))


# -- controller resources (instances, volumes, groups) ---------------------
def visible_to(requester: Requester) -> str | None:
    """The user whose own and managed resources the requester sees; None: everything.

    The Store applies it in SQL (the spec's three visibility rules).
    """
    return None if requester.is_superuser else requester.id


def require_mutate(requester: Requester, *, owner_id: str, owner_owner_id: str | None, what: str) -> None:
    """Owner, the owner's owner, or a superuser may change a visible resource; else 403."""
    if not (requester.is_superuser or requester.id == owner_id
            or (owner_owner_id is not None and requester.id == owner_owner_id)):
        raise Forbidden(f"only the owner, the owner's owner or a superuser may change {what}")


def require_account_authority(requester: Requester, account: dict, message: str) -> None:
    """The requester may name this system account (grant access, add to a group): it is the
    account's user, manages it, or is a superuser. `account` carries user_id, user_owner_userid
    and user_roles."""
    owner = {"id": account["user_id"], "owner_userid": account["user_owner_userid"], "roles": account["user_roles"]}
    if not (requester.is_superuser or manages(requester, owner)):
        raise Forbidden(message)
