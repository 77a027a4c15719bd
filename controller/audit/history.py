"""The instance history: what was done to an instance, by whom, under which request id, with
what result (`GET /v1/server-instance/<id>/actions`).

Recorded by the service functions that act (create, the power tasks, modify-users,
delete, evacuation, a move), never by the API layer: an admin command records as a
request does. A request refused before it names a visible instance (404, 401, a bad
body) is not recorded; once it names one, its outcome is, errors included (a reboot of
a stopped instance: `error` with the 409's message).

Rows keep the instance's owner, so the history outlives the instance: after the delete
whoever would see the instance by the visibility rule (the owner, the owner's owner, a
superuser) still reads it, until the audit retention prunes it (audit.prune_before).
"""

import base64
import binascii
import logging
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from controller import permissions as perms
from controller.audit import request_ids
from controller.errors import ControllerError, InvalidInput
from controller.permissions import Requester
from controller.rules import find_or_404
from controller.store import Store, utc_now

log = logging.getLogger(__name__)

# The lease's (docs/leases.md): renew (a user or an admin), warning and expire (the sweep).
ACTIONS = ("create", "reboot", "power-on", "power-off", "modify-users", "move", "evacuate", "delete",
           "renew", "warning", "expire")
RESULTS = ("success", "error")
_MAX_MESSAGE = 1000
# The history is bounded. An answer holds at most `limit` entries (1 to MAX_LIMIT, default
# MAX_LIMIT), the most recent ones; each instance keeps its newest KEPT_PER_INSTANCE entries
# (older ones go as a new one is written), so one page always holds all that is kept.
MAX_LIMIT = 1000
KEPT_PER_INSTANCE = 1000
# Repeats that add nothing are coalesced into the instance's newest entry (its time and
# request id become the repeat's): an error identical to the last one (a reboot of a stopped
# instance, again), and a power-on or power-off just like the last one (it changed nothing).
_COALESCED_SUCCESSES = ("power-on", "power-off")
# What an unexpected failure (a bug, answered 500) leaves in the history: its details are
# in the service log, under the same request id.
INTERNAL_ERROR = "internal error; see the service log"


def record(ctx, instance: dict, action: str, *, requester: str | None, result: str = "success",
           message: str = "", request_id: str | None = None) -> None:
    """One action on `instance` (a row: `id` and `owner_id`). `requester`: the cloud auth id
    of the user who asked, None for an admin command; `request_id` defaults to the current
    request's or command's (controller/audit/request_ids.py)."""
    if action not in ACTIONS or result not in RESULTS:
        raise ValueError(f"history: unknown action {action!r} or result {result!r}")
    entry = {
        "instance_id": instance["id"], "owner_id": instance["owner_id"], "action": action, "requester": requester,
        "request_id": request_id or request_ids.current() or request_ids.new(), "result": result,
        "message": message[:_MAX_MESSAGE], "at_utc": utc_now(),
    }
    coalesce = result == "error" or action in _COALESCED_SUCCESSES
    try:
        ctx.store.insert_instance_action(entry, keep=KEPT_PER_INSTANCE, coalesce=coalesce)
    except sqlite3.Error as e:
        # The action itself already happened (or failed for its own reason): a lost history
        # row must not change its answer, as for the audit.
        log.error("could not record %s of instance %s: %s", action, instance["id"], e)


class Outcome:
    """What a block under recorded() has to say of its success: the history's `message`, and
    `changed = False` when the task changed nothing (access users already have, removing
    users who have none): not recorded."""

    def __init__(self) -> None:
        self.message = ""
        self.changed = True


@contextmanager
def recorded(ctx, instance: dict, action: str, *, requester: str | None) -> Iterator[Outcome]:
    """Record `action` as a success when the block ends (with the message the block set on the
    Outcome it gets; not at all when it set `changed = False`), as an error with its message
    when it raises (the error goes on to the
    caller unchanged)."""
    outcome = Outcome()
    try:
        yield outcome
    except ControllerError as e:
        record(ctx, instance, action, requester=requester, result="error", message=e.message)
        raise
    except Exception:
        record(ctx, instance, action, requester=requester, result="error", message=INTERNAL_ERROR)
        raise
    if outcome.changed:
        record(ctx, instance, action, requester=requester, message=outcome.message)


def parse_limit(value: str | None) -> int:
    """The `limit` query parameter of the history: 1 to MAX_LIMIT, MAX_LIMIT when absent."""
    if value is None:
        return MAX_LIMIT
    if not re.fullmatch(r"[0-9]{1,7}", value) or not 1 <= int(value) <= MAX_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(value)


# A cursor names the entry a page ended at, opaque to clients (they pass back what they were
# given): base64url of "before:<id>". Its id is a position in the history's id order only; read
# through the same visibility rule as the rest, so a made-up one shows nothing it should not.
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,40}")
_CURSOR_TEXT = re.compile(r"before:([1-9][0-9]{0,17})")
# Entries a chunk of a streamed page holds: a page is read and sent this many at a time (up to
# about 110 KB of the longest entries; a page of 1,000 is ten chunks).
PER_CHUNK = 100


def cursor_of(entry_id: int) -> str:
    """The cursor of the page that goes on below the entry `entry_id`."""
    return base64.urlsafe_b64encode(f"before:{entry_id}".encode()).decode().rstrip("=")


def parse_cursor(value: str | None) -> int | None:
    """The `before` query parameter of the history: a cursor an earlier answer gave (its `next`
    link), as the id the page goes on below; None when absent."""
    if value is None:
        return None
    text = None
    if _CURSOR.fullmatch(value):
        try:
            text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            text = None
    found = _CURSOR_TEXT.fullmatch(text or "")
    if found is None:
        raise InvalidInput("before must be a cursor an earlier answer gave (its Link: rel=\"next\")")
    return int(found.group(1))


@dataclass
class ActionsPage:
    """One page of an instance's history: `chunks`, its entries oldest first as JSON objects
    joined by commas (read as they are sent), and `next_cursor`, the cursor of the page of
    older entries (None: this page reaches the oldest kept)."""

    instance_id: str
    chunks: Iterator[str]
    next_cursor: str | None


def page_actions(ctx, requester: Requester, instance_id: str, *, limit: int = MAX_LIMIT,
                 before: int | None = None) -> ActionsPage:
    """The instance's `limit` most recent actions below the cursor `before` (parse_cursor; None:
    the most recent of all), oldest first, for whoever sees the instance (while it lives or, by
    its kept owner, after its delete); 404 otherwise. Where the page lies is found first (two
    indexed statements); its entries are read a chunk at a time as the answer is sent."""
    scope = perms.visible_to(requester)

    def visible_page(parsed: str) -> ActionsPage | None:
        bounds = ctx.store.instance_action_page(parsed, visible_to=scope, limit=limit, before=before)
        if bounds is None:
            # Nothing on this page: an empty history, or a cursor past its oldest entry, of an
            # instance the requester sees (its row, or a kept entry after its delete); else
            # 404 as for the instance.
            seen = (ctx.store.get_instance(parsed, visible_to=scope) is not None
                    or ctx.store.instance_action_page(parsed, visible_to=scope, limit=1) is not None)
            return ActionsPage(parsed, iter(()), None) if seen else None
        first, last, older = bounds
        chunks = ctx.store.iter_instance_actions_json(parsed, visible_to=scope, first=first, last=last,
                                                      per_chunk=PER_CHUNK)
        return ActionsPage(parsed, chunks, cursor_of(first) if older else None)

    return find_or_404("server-instance", instance_id, visible_page)


def list_actions(ctx, requester: Requester, instance_id: str, *, limit: int = MAX_LIMIT) -> list[dict]:
    """The instance's `limit` most recent actions, oldest first, for whoever sees the instance
    (while it lives or, by its kept owner, after its delete); 404 otherwise."""
    scope = perms.visible_to(requester)

    def visible_rows(parsed: str) -> list[dict] | None:
        rows = ctx.store.list_instance_actions(parsed, visible_to=scope, limit=limit)
        # No rows: an empty history of an instance the requester sees (one made before the
        # history existed), else 404 as for the instance.
        if rows or ctx.store.get_instance(parsed, visible_to=scope) is not None:
            return rows
        return None

    return [_action_object(r) for r in find_or_404("server-instance", instance_id, visible_rows)]


def _action_object(row: dict) -> dict:
    return {"action": row["action"], "requester": row["requester"], "request-id": row["request_id"],
            "result": row["result"], "message": row["message"], "time": row["at_utc"]}


def prune_before(store: Store, before: str) -> int:
    """Delete the actions older than `before` (RFC 3339 UTC), with the audit's; how many went."""
    return store.delete_instance_actions_before(before)
