"""The controllers a cloud auth serves (`cloud-agent controller add | list | disable | enable |
rotate-secret | remove`): each an id (the spec's cloud_controller_id), a name, the URL of its
API and one secret, shown once and kept as a hash."""

import hashlib
import secrets
from urllib.parse import urlsplit

from controller.config import HOST_NAME
from controller.context import Context
from controller.errors import Conflict, InvalidInput, NotFound
from controller.store import utc_now

NAME_RULE = ("controller names are 1 to 63 characters: lowercase letters, digits and -, "
             "starting with a letter or digit")
_MAX_ID = 2**31 - 1
_MAX_URL = 2048
SECRET_PREFIX = "ccs_"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(32)


def secret_hash(secret: str) -> str:
    """256 random bits need no slow hash: SHA-256, as tokens are kept."""
    return hashlib.sha256(secret.encode()).hexdigest()


def check_controller_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_ID:
        raise InvalidInput(f"a controller id is a whole number from 1 to {_MAX_ID}")
    return value


def check_name(value: object) -> str:
    if not isinstance(value, str) or not HOST_NAME.fullmatch(value):
        shown = value[:64] if isinstance(value, str) else value
        raise InvalidInput(f"invalid controller name {shown!r}: {NAME_RULE}")
    return value


def check_url(value: object) -> str:
    """The controller's API as clients reach it: http(s)://host[:port][/path], nothing more."""
    if not isinstance(value, str) or not value or len(value) > _MAX_URL or any(c.isspace() for c in value):
        raise InvalidInput("a controller URL is http:// or https:// and a host, without spaces")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password \
            or parts.query or parts.fragment:
        raise InvalidInput(f"invalid controller URL {value[:64]!r}: give http(s)://HOST[:PORT][/PATH], "
                           "with no user, query or fragment")
    try:
        parts.port
    except ValueError:
        raise InvalidInput(f"invalid port in controller URL {value[:64]!r}") from None
    return value.rstrip("/")


def controller_object(row: dict) -> dict:
    return {"id": row["id"], "name": row["name"], "url": row["url"], "enabled": bool(row["enabled"]),
            "accounts": row.get("accounts", 0), "last_seen": row.get("last_seen_utc")}


def add_controller(ctx: Context, *, controller_id: object, name: object, url: object) -> dict:
    """Registers a controller; returns it with its secret, the only time the secret is shown."""
    controller_id, name, url = check_controller_id(controller_id), check_name(name), check_url(url)
    if "controller" in ctx.config.server.interfaces and controller_id == ctx.config.controller.id:
        raise Conflict(f"controller {controller_id} is this service's own ([controller] id): "
                       "give the new cluster another id")
    secret = new_secret()
    ctx.store.insert_controller({"id": controller_id, "name": name, "url": url, "secret_hash": secret_hash(secret),
                                 "created_at_utc": utc_now()})
    return {"id": controller_id, "name": name, "url": url, "secret": secret}


def list_controllers(ctx: Context) -> list[dict]:
    return [controller_object(r) for r in ctx.store.list_controllers()]


def find_controller(ctx: Context, controller_id: object) -> dict:
    found = ctx.store.get_controller(check_controller_id(controller_id))
    if found is None:
        raise NotFound(f"no controller {controller_id}")
    return found


def set_enabled(ctx: Context, controller_id: object, enabled: bool) -> dict:
    """A disabled controller's calls are refused (403) until it is enabled again."""
    ctx.store.set_controller(check_controller_id(controller_id), enabled=1 if enabled else 0)
    return controller_object(_listed(ctx, controller_id))


def rotate_secret(ctx: Context, controller_id: object) -> dict:
    """A new secret; the old one stops working at once."""
    secret = new_secret()
    ctx.store.set_controller(check_controller_id(controller_id), secret_hash=secret_hash(secret))
    return {"id": controller_id, "secret": secret}


def remove_controller(ctx: Context, controller_id: object) -> dict:
    shown = controller_object(_listed(ctx, controller_id))
    ctx.store.remove_controller(controller_id)
    return shown


def _listed(ctx: Context, controller_id: int) -> dict:
    for row in ctx.store.list_controllers():
        if row["id"] == controller_id:
            return row
    raise NotFound(f"no controller {controller_id}")
