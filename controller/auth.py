"""Token issuance and the check every authenticated request goes through (CONTRACT.md section 2)."""

import time
from datetime import datetime, timezone

from controller.context import Context
from controller.errors import InvalidInput, Unauthenticated
from controller.permissions import Requester
from controller.rules import is_uuid
from controller.security import new_token, same, token_hash

_BAD_CREDENTIALS = "invalid credentials"


def issue_token(
    ctx: Context,
    *,
    api_key: str | None = None,
    api_secret: str | None = None,
    email: str | None = None,
    password: str | None = None,
) -> dict:
    by_key = api_key is not None or api_secret is not None
    by_password = email is not None or password is not None
    if by_key == by_password:
        raise InvalidInput("give either api_key and api_secret, or email and password")
    for name, value in (("api_key", api_key), ("api_secret", api_secret)) if by_key else (
        ("email", email), ("password", password)
    ):
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"{name} is required and must be a non-empty string")

    throttle_key = f"key:{api_key}" if by_key else f"email:{email.lower()}"
    ctx.throttle.check(throttle_key)

    if by_key:
        user = ctx.store.get_user_by_api_key(api_key)
        stored = None
        if user is not None and user["api_secret_enc"] is not None:
            stored = ctx.secret_box.decrypt(user["api_secret_enc"])
        ok = same(stored, api_secret)
        source = "api_key"
    else:
        user = ctx.store.get_user_by_email(email)
        ok = ctx.passwords.verify(user["password_hash"] if user else None, password)
        source = "password"

    if not ok or user is None or user["active"] <= 0:
        ctx.throttle.failed(throttle_key)
        raise Unauthenticated(_BAD_CREDENTIALS)
    ctx.throttle.succeeded(throttle_key)

    token = new_token()
    expires_at = int(time.time()) + ctx.config.get_int("auth", "token_ttl_seconds")
    ctx.store.insert_token(token_hash=token_hash(token), user_id=user["id"], source=source, expires_at=expires_at)
    return {
        "token": token,
        "expires_at": datetime.fromtimestamp(expires_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "userid": user["id"],
    }


def authenticate(ctx: Context, *, token: str | None, user_id: str | None) -> Requester:
    """The requester behind X-Auth-Token and X-Auth-Cloudauth-Id, or Unauthenticated."""
    if not token or not user_id:
        raise Unauthenticated("X-Auth-Token and X-Auth-Cloudauth-Id headers are required")
    if not is_uuid(user_id):
        raise Unauthenticated("X-Auth-Cloudauth-Id must be a user id (UUID)")
    user = ctx.store.token_owner(token_hash(token), now=int(time.time()))
    # The hash lookup already compared the token; the id comparison is constant-time too.
    if user is None or not same(user["id"], user_id):
        raise Unauthenticated("invalid or expired token for this user")
    return Requester.from_user(user)
