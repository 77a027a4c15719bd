"""The cloud portal's sessions: a random id in the browser's cookie, only its hash here.

A session is a password login kept by the server: it ends at logout, after `[portal]
session_idle_seconds` without a request or `session_max_seconds` after its login, and
when the user's password is set or changed, the user is deactivated or deleted (the
store deletes the rows with those changes), or its API secret is set to null (the
look-up then finds nothing). Each login makes a new id. The CSRF value of a session is
derived from its id, so the database, which holds only the id's hash, yields neither.

Each session holds an API token, derived from its id as the CSRF value is, stored only
as a hash in `tokens` like any other: the portal at cloud auth renders the clusters'
pages from their APIs with it (as the user), and the session's end removes it, which
every cluster hears of as a revocation. It is a password login's token: a password set
ends it, and it expires with the session's `session_max_seconds` at the latest.

Time is passed in (`now`, seconds): the portal's middleware reads its clock, and tests
give it another.
"""

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

from controller.context import Context
from controller.permissions import Requester
from controller.security.crypto import token_hash

# A touch of `seen_at` is a write: one per minute of activity at most, not one per page.
_TOUCH_EVERY_SECONDS = 60
# A new API secret is shown once, on the first read of its page within this long.
REVEAL_SECONDS = 60
_ID_BYTES = 32  # 256 bits


@dataclass(frozen=True)
class Session:
    id_hash: str
    requester: Requester
    email: str
    csrf: str
    # The session's API token (never stored, derived from the cookie's id), kept out of any repr.
    api_token: str = field(default="", repr=False)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def csrf_of(session_id: str) -> str:
    return hmac.new(session_id.encode(), b"cloud portal csrf", hashlib.sha256).hexdigest()


def token_of(session_id: str) -> str:
    """The session's API token: 43 characters, as the API's own tokens."""
    digest = hmac.new(session_id.encode(), b"cloud portal api token", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def start(ctx: Context, user_id: str, *, now: int) -> str:
    """A new session for the user (logged in already); the id for its cookie, never stored."""
    session_id = secrets.token_urlsafe(_ID_BYTES)
    limits = ctx.config.portal
    # The token's expiry is on the API's clock (the wall clock), the session's on the portal's.
    ctx.store.insert_portal_session(id_hash=_hash(session_id), user_id=user_id, now=now,
                                    purge_before=now - limits.session_idle_seconds,
                                    started_before=now - limits.session_max_seconds,
                                    token_hash=token_hash(token_of(session_id)),
                                    token_expires_at=int(time.time()) + limits.session_max_seconds)
    return session_id


def find(ctx: Context, session_id: str | None, *, now: int) -> Session | None:
    """The live session of this id, or None (unknown, ended, expired: an expired one is deleted)."""
    if not session_id or len(session_id) > 100:
        return None
    id_hash = _hash(session_id)
    row = ctx.store.portal_session(id_hash)
    if row is None:
        return None
    limits = ctx.config.portal
    if now - row["seen_at"] >= limits.session_idle_seconds or now - row["created_at"] >= limits.session_max_seconds:
        ctx.store.delete_portal_session(id_hash)
        return None
    if now - row["seen_at"] >= _TOUCH_EVERY_SECONDS:
        ctx.store.touch_portal_session(id_hash, now)
    return Session(id_hash=id_hash, requester=Requester.from_user({"id": row["user_id"], "roles": row["roles"]}),
                   email=row["email"], csrf=csrf_of(session_id), api_token=token_of(session_id))


def same_csrf(session: Session, given: str | None) -> bool:
    return isinstance(given, str) and hmac.compare_digest(session.csrf.encode(), given.encode())


def end(ctx: Context, session: Session) -> None:
    ctx.store.delete_portal_session(session.id_hash)


def remember_reveal(ctx: Context, session: Session, secret: str, *, now: int) -> None:
    """After a rotation: the new secret may be shown once in this session, within REVEAL_SECONDS.
    Only its hash is kept; the page reads the secret itself from the user's record."""
    ctx.store.set_portal_reveal(session.id_hash, secret_hash=_hash(secret), until=now + REVEAL_SECONDS)


def take_reveal(ctx: Context, session: Session, *, now: int) -> str | None:
    """The new API secret on the first read within REVEAL_SECONDS of the rotation, else None
    (already shown, too late, or replaced since by another rotation or a reset)."""
    held = ctx.store.take_portal_reveal(session.id_hash)
    if held is None or now >= held["reveal_until"]:
        return None
    user = ctx.store.get_user(session.requester.id)
    if user is None or user["api_secret_enc"] is None:
        return None
    secret = ctx.secret_box.decrypt(user["api_secret_enc"])
    return secret if hmac.compare_digest(_hash(secret), held["reveal_hash"]) else None
