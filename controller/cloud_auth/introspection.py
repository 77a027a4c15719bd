"""`POST /v1/auth/introspect`: a controller asks about a token it has not seen. The answer
carries the feed's number read with the token, so the controller can tell whether a
revocation it applied meanwhile came after it (then the token is not cached)."""

import time
from datetime import datetime, timezone

from controller.cloud_auth.callers import ControllerCaller
from controller.context import Context
from controller.errors import InvalidInput
from controller.rules import as_uuid
from controller.security.crypto import same, token_hash

_MAX_TOKEN = 256


def introspect(ctx: Context, caller: ControllerCaller, *, token: object, userid: object) -> dict:
    if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN:
        raise InvalidInput("token is required: the X-Auth-Token a client sent")
    if not isinstance(userid, str) or as_uuid(userid) is None:
        raise InvalidInput("userid is required: the X-Auth-Cloudauth-Id a client sent (a user id)")
    row, seq = ctx.store.introspect_token(token_hash(token), now=int(time.time()))
    if row is None or not same(row["user_id"], as_uuid(userid)):
        return {"active": False, "seq": seq}
    return {"active": True, "userid": row["user_id"], "source": row["source"], "issued_at": row["created_at_utc"],
            "expires_at": datetime.fromtimestamp(row["expires_at"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seq": seq}
