"""`PUT` and `DELETE /v1/auth/accounts/N/USERNAME`: a controller registers (or removes) the
system account it makes for a user on its cluster, before it makes it. Usernames are unique
per cluster, as system accounts are; the same username may be another user's on another
cluster. A controller reaches only its own N."""

from controller.cloud_auth.callers import ControllerCaller
from controller.context import Context
from controller.errors import Forbidden, InvalidInput, NotFound
from controller.rules import as_uuid
from controller.store import utc_now
from host_adapters.names import check_username

_MAX_UID = 2**32 - 2


def _own(caller: ControllerCaller, controller_id: str) -> int:
    if not controller_id.isdigit() or int(controller_id) != caller.id:
        raise Forbidden(f"controller {caller.id} may change only its own accounts (/v1/auth/accounts/{caller.id}/...)")
    return caller.id


def registered_object(row: dict) -> dict:
    return {"controller_id": row["controller_id"], "username": row["username"], "user_id": row["user_id"],
            "uuid": row["uuid"], "uid": row["uid"]}


def register(ctx: Context, caller: ControllerCaller, controller_id: str, username: str, *, user_id: object,
             uuid: object, uid: object) -> tuple[dict, bool]:
    """The account, made or found the same; (account, made)."""
    controller_id = _own(caller, controller_id)
    check_username(username)
    if not isinstance(uuid, str) or as_uuid(uuid) is None:
        raise InvalidInput("uuid is required: the account id (a UUID) the controller gives the account")
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 < uid <= _MAX_UID:
        raise InvalidInput(f"uid is required: a whole number from 1 to {_MAX_UID}")
    user = ctx.store.get_user(as_uuid(user_id)) if isinstance(user_id, str) and as_uuid(user_id) else None
    if user is None or user["active"] <= 0:
        raise NotFound(f"user {str(user_id)[:64]} not found (or not active) at cloud auth")
    row, made = ctx.store.register_account(controller_id=controller_id, username=username, user_id=user["id"],
                                           uuid=as_uuid(uuid), uid=uid, now=utc_now())
    return registered_object(row), made


def unregister(ctx: Context, caller: ControllerCaller, controller_id: str, username: str) -> dict:
    controller_id = _own(caller, controller_id)
    check_username(username)
    try:
        return registered_object(ctx.store.unregister_account(controller_id=controller_id, username=username))
    except NotFound:
        raise NotFound(f"no account {username} is registered on cluster {controller_id}") from None
