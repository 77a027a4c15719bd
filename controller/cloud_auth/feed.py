"""`GET /v1/auth/changes?since=SEQ`: what changed at cloud auth after SEQ, for a controller's
replica. Users (without password hash, API key or secret: `api_secret_set` instead), the
system accounts of every cluster, and revocations (a live token removed, by its hash).

When `since` is 0 without an `epoch`, older than the oldest change kept, ahead of the newest (a database
restored from an older backup), or given with another `epoch` (another database), the
answer is `reset: true` and a snapshot in pages: every user, then every account, `next`
naming the page after. The controller replaces its copy with the snapshot's pages, drops
the tokens it had cached, and goes on from the `seq` of the snapshot's first page."""

import json
import time

from controller.cloud_auth.callers import ControllerCaller
from controller.context import Context
from controller.errors import InvalidInput

PAGE = 1000  # changes per page
SNAPSHOT_PAGE = 5000  # users or accounts per snapshot page
# Changes are kept this long; a controller further behind reads a snapshot.
KEEP_SECONDS = 7 * 24 * 3600
_PRUNE_EVERY_SECONDS = 3600.0
_next_prune = 0.0


def _user(row: dict) -> dict:
    if row.get("deleted"):
        return {"id": row["id"], "deleted": True}
    return {"id": row["id"], "email": row["email"], "name": row["name"], "active": row["active"],
            "owner_userid": row["owner_userid"], "roles": json.loads(row["roles"]),
            "api_secret_set": bool(row["api_secret_set"]), "created_at": row["created_at_utc"]}


def _account(row: dict) -> dict:
    if row.get("deleted"):
        return {"controller_id": row["controller_id"], "username": row["username"], "deleted": True}
    return {"controller_id": row["controller_id"], "username": row["username"], "user_id": row["user_id"],
            "uuid": row["uuid"], "uid": row["uid"]}


def _number(value: object, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, str) and value.isdigit() and len(value) <= 19:
        return int(value)
    raise InvalidInput(f"{name} is a whole number, 0 or more")


def changes(ctx: Context, caller: ControllerCaller, *, since: object, epoch: object = None,
            after: object = None) -> dict:
    since = _number(since, "since")
    _prune_now_and_then(ctx)
    current = ctx.store.feed_epoch()
    first, last = ctx.store.feed_bounds()
    other_epoch = epoch not in (None, "") and epoch != current
    too_old = first and since < first - 1
    # 0 without an epoch: a controller that never read the feed. With its epoch, 0 is where a
    # snapshot of a database with no change yet left it.
    if (since == 0 and not epoch) or other_epoch or since > last or too_old or after:
        return _snapshot(ctx, current, after)
    page = ctx.store.feed_changes(since, PAGE)
    return {"epoch": current, "seq": page["seq"], "reset": False, "more": page["more"], "next": None,
            "users": [_user(u) for u in page["users"]], "accounts": [_account(a) for a in page["accounts"]],
            "revocations": [{"token_hash": h} for h in page["tokens"]]}


def _snapshot(ctx: Context, epoch: str, after: object) -> dict:
    """One page of the snapshot: `after` is None (the first page), "user:ID" or "account:KEY"."""
    if after in (None, ""):
        kind, key = "user", ""
    elif isinstance(after, str) and after.partition(":")[0] in ("user", "account") and len(after) <= 200:
        kind, _, key = after.partition(":")
    else:
        raise InvalidInput("after is the `next` of a snapshot page")
    users, accounts = [], []
    if kind == "user":
        rows, more, seq = ctx.store.feed_snapshot(kind="user", after=key, limit=SNAPSHOT_PAGE)
        users = [_user(r) for r in rows]
        following = f"user:{rows[-1]['id']}" if more else "account:"
    else:
        rows, more, seq = ctx.store.feed_snapshot(kind="account", after=key, limit=SNAPSHOT_PAGE)
        accounts = [_account(r) for r in rows]
        following = f"account:{rows[-1]['key']}" if more else None
    return {"epoch": epoch, "seq": seq, "reset": True, "more": following is not None, "next": following,
            "users": users, "accounts": accounts, "revocations": []}


def _prune_now_and_then(ctx: Context) -> None:
    global _next_prune
    now = time.monotonic()
    if now < _next_prune:
        return
    _next_prune = now + _PRUNE_EVERY_SECONDS
    ctx.store.prune_feed(before=int(time.time()) - KEEP_SECONDS)
