"""The one credential of a controller, `Authorization: Controller N:SECRET`, checked on the
three things it reaches (introspection, the feed, its own accounts) and on nothing else."""

import re
import threading
import time
from dataclasses import dataclass

from controller.cloud_auth.registry import SECRET_PREFIX, secret_hash
from controller.context import Context
from controller.errors import Forbidden, Unauthenticated
from controller.security.crypto import same
from controller.store import utc_now

_HEADER = re.compile(r"^Controller ([1-9][0-9]{0,9}):(" + SECRET_PREFIX + r"[0-9a-f]{64})$")
_REFUSED = "controller credentials required: Authorization: Controller ID:SECRET"
# last_seen is written at most this often per controller: a poll every second need not write.
_SEEN_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class ControllerCaller:
    id: int
    name: str


_seen: dict[tuple[str, int], float] = {}
_seen_lock = threading.Lock()


def authenticate_controller(ctx: Context, authorization: str | None) -> ControllerCaller:
    """The enabled controller the header names, with its secret; Unauthenticated (401) for
    anything else, a user's token included; Forbidden (403) for a disabled controller."""
    found = _HEADER.fullmatch(authorization or "")
    if found is None:
        raise Unauthenticated(_REFUSED)
    controller_id, secret = int(found[1]), found[2]
    row = ctx.store.get_controller(controller_id)
    if row is None or not same(row["secret_hash"], secret_hash(secret)):
        raise Unauthenticated("invalid controller credentials")
    if not row["enabled"]:
        raise Forbidden(f"controller {controller_id} is disabled at cloud auth")
    _note_seen(ctx, controller_id)
    return ControllerCaller(id=controller_id, name=row["name"])


def _note_seen(ctx: Context, controller_id: int) -> None:
    now = time.monotonic()
    key = (ctx.store.path, controller_id)
    with _seen_lock:
        if key in _seen and now - _seen[key] < _SEEN_EVERY_SECONDS:
            return
        _seen[key] = now
    ctx.store.set_controller(controller_id, last_seen_utc=utc_now())
