"""Token issuance (POST /v1/auth/token) and the check every authenticated request goes through:
X-Auth-Token issued to the X-Auth-Cloudauth-Id user, unexpired, unrevoked, the user active."""

import re
import threading
import time
from datetime import datetime, timezone

from controller.context import Context
from controller.errors import InvalidInput, ServerBusy, TooManyRequests, Unauthenticated
from controller.monitoring.metrics import metrics_of
from controller.permissions import Requester
from controller.rules import as_uuid
from controller.security.crypto import new_token, same, token_hash

_BAD_CREDENTIALS = "invalid credentials"
_API_KEY = re.compile(r"^ak_[0-9a-f]{32}$")
_MAX_CREDENTIAL = 256


def email_throttle_key(email: str) -> str:
    """The failure throttle's key of a user's password logins; a wrong proof in the
    self-service calls (controller/auth/credentials.py) counts against it too."""
    return f"email:{email.lower()}"


def _login_result(error: Exception) -> str:
    """A refused login's result in the logins metric (controller/monitoring/metrics.py)."""
    if isinstance(error, Unauthenticated):
        return "failed"
    return "refused" if isinstance(error, TooManyRequests) else "invalid"


def issue_token(ctx: Context, *, api_key: str | None = None, api_secret: str | None = None,
                email: str | None = None, password: str | None = None, source: str = "") -> dict:
    """A token for an API key and secret or an email and password. `source` is the client's
    address (api/client_address.py): password logins are shared out per source. Each call is
    counted by credential and result."""
    method = "api_key" if api_key is not None or api_secret is not None else "password"
    try:
        issued = _issue_token(ctx, api_key=api_key, api_secret=api_secret, email=email, password=password,
                              source=source)
    except (Unauthenticated, TooManyRequests, InvalidInput) as e:
        metrics_of(ctx).login(method, _login_result(e))
        raise
    metrics_of(ctx).login(method, "ok")
    return issued


def login_user(ctx: Context, *, email: str | None, password: str | None, source: str = "") -> dict:
    """The active user behind an email and password, by the very checks, throttles and
    per-source shares of a password login at /v1/auth/token, counted as one (the cloud
    portal's login, api/portal/). No token is issued."""
    try:
        user, _ = _check_credentials(ctx, api_key=None, api_secret=None, email=email, password=password,
                                     source=source)
    except (Unauthenticated, TooManyRequests, InvalidInput) as e:
        metrics_of(ctx).login("password", _login_result(e))
        raise
    metrics_of(ctx).login("password", "ok")
    return user


def _issue_token(ctx: Context, *, api_key: str | None, api_secret: str | None, email: str | None,
                 password: str | None, source: str) -> dict:
    user, source = _check_credentials(ctx, api_key=api_key, api_secret=api_secret, email=email, password=password,
                                      source=source)
    _purge_now_and_then(ctx)
    token = new_token()
    expires_at = int(time.time()) + ctx.config.auth.token_ttl_seconds
    ctx.store.insert_token(token_hash=token_hash(token), user_id=user["id"], source=source, expires_at=expires_at)
    return {
        "token": token,
        "expires_at": datetime.fromtimestamp(expires_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "userid": user["id"],
    }


def _check_credentials(ctx: Context, *, api_key: str | None, api_secret: str | None, email: str | None,
                       password: str | None, source: str) -> tuple[dict, str]:
    """The user the credentials belong to and the token source they make ("api_key" or
    "password"), or Unauthenticated / TooManyRequests / InvalidInput."""
    by_key = api_key is not None or api_secret is not None
    by_password = email is not None or password is not None
    if by_key == by_password:
        raise InvalidInput("give either api_key and api_secret, or email and password")
    for name, value in (("api_key", api_key), ("api_secret", api_secret)) if by_key else (
        ("email", email), ("password", password)
    ):
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"{name} is required and must be a non-empty string")

    # Values no user can have fail at once, before any throttle state or hashing.
    if by_key and (not _API_KEY.fullmatch(api_key) or len(api_secret) > _MAX_CREDENTIAL):
        raise Unauthenticated(_BAD_CREDENTIALS)
    if by_password and (len(email) > 254 or "@" not in email or len(password) > _MAX_CREDENTIAL):
        raise Unauthenticated(_BAD_CREDENTIALS)

    throttle_key = f"key:{api_key}" if by_key else email_throttle_key(email)
    ctx.throttle.check(throttle_key)
    address = source  # the client's; `source` becomes the token's kind below

    if by_key:
        user = ctx.store.get_user_by_api_key(api_key)
        stored = None
        if user is not None and user["api_secret_enc"] is not None:
            stored = ctx.secret_box.decrypt(user["api_secret_enc"])
        ok = same(stored, api_secret)
        source = "api_key"
    else:
        user = ctx.store.get_user_by_email(email)
        # 429 at once when this source or the bounded hash pool is busy (not counted as a
        # failure of this email).
        ok = ctx.passwords.verify_login(user["password_hash"] if user else None, password, source=source)
        source = "password"

    # A null API secret (reset_api_secret with set_to_null) shuts the user out of the
    # cloud APIs entirely, whichever credential it offers.
    if not ok or user is None or user["active"] <= 0 or user["api_secret_enc"] is None:
        ctx.throttle.failed(throttle_key)
        raise Unauthenticated(_BAD_CREDENTIALS)
    ctx.throttle.succeeded(throttle_key)
    if source == "password":
        # A hash made with older `[auth] argon2_*` parameters takes them on, once: until then a
        # check of it costs what they cost, and a wrong password for this user takes another
        # time than one for an unknown email (whose dummy hash has the current ones).
        upgraded = ctx.passwords.rehashed(user["password_hash"], password, source=address)
        if upgraded is not None:
            ctx.store.upgrade_password_hash(user["id"], old=user["password_hash"], new=upgraded)
    return user, source


_PURGE_EVERY_SECONDS = 3600
_monotonic = time.monotonic
_next_purge = 0.0
_purge_lock = threading.Lock()


def _purge_now_and_then(ctx: Context) -> None:
    """Expired tokens are dead already; deleting them keeps the table small."""
    global _next_purge
    with _purge_lock:
        if _monotonic() < _next_purge:
            return
        _next_purge = _monotonic() + _PURGE_EVERY_SECONDS
    ctx.store.purge_expired_tokens(now=int(time.time()))


def authenticate(ctx: Context, *, token: str | None, user_id: str | None) -> Requester:
    """The requester behind X-Auth-Token and X-Auth-Cloudauth-Id, or Unauthenticated."""
    counted = metrics_of(ctx)
    if not token or not user_id:
        counted.token_checked("missing")
        raise Unauthenticated("X-Auth-Token and X-Auth-Cloudauth-Id headers are required")
    user_id = as_uuid(user_id)
    if user_id is None:
        counted.token_checked("invalid")
        raise Unauthenticated("X-Auth-Cloudauth-Id must be a user id (UUID)")
    follower = ctx.cloud_auth
    if follower is not None:
        # A controller following a cloud auth: tokens it has seen are cached here; none is
        # trusted once its copy is older than the offline grace (503, never a 401).
        try:
            follower.usable()
        except ServerBusy:
            counted.token_checked("unavailable")
            raise
    user = ctx.store.token_owner(token_hash(token), now=int(time.time()))
    if user is None and follower is not None:
        try:
            follower.admit(token, user_id)
        except ServerBusy:
            counted.token_checked("unavailable")
            raise
        except Unauthenticated:
            counted.token_checked("invalid")
            raise
        user = ctx.store.token_owner(token_hash(token), now=int(time.time()))
    # The hash lookup already compared the token; the id comparison is constant-time too.
    if user is None or not same(user["id"], user_id):
        counted.token_checked("invalid")
        raise Unauthenticated("invalid or expired token for this user")
    counted.token_checked("ok")
    return Requester.from_user(user)
