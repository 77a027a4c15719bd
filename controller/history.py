"""The instance history: what was done to an instance, by whom, under which request id, with
what result (`GET /v1/server-instance/<id>/actions`, CONTRACT.md section 13).

Recorded by the service functions that act (create, the power tasks, modify-users,
delete, evacuation, a move), never by the API layer: an admin command records as a
request does. A request refused before it names a visible instance (404, 401, a bad
body) is not recorded; once it names one, its outcome is, errors included (a reboot of
a stopped instance: `error` with the 409's message).

Rows keep the instance's owner, so the history outlives the instance: after the delete
whoever would see the instance by the visibility rule (the owner, the owner's owner, a
superuser) still reads it, until the audit retention prunes it (audit.prune_before).
"""

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from controller import permissions as perms
from controller import request_ids
from controller.errors import ControllerError
from controller.permissions import Requester
from controller.rules import find_or_404
from controller.store import Store, utc_now

log = logging.getLogger(__name__)

ACTIONS = ("create", "reboot", "power-on", "power-off", "modify-users", "move", "evacuate", "delete")
RESULTS = ("success", "error")
_MAX_MESSAGE = 1000
# What an unexpected failure (a bug, answered 500) leaves in the history: its details are
# in the service log, under the same request id.
INTERNAL_ERROR = "internal error; see the service log"


def record(ctx, instance: dict, action: str, *, requester: str | None, result: str = "success",
           message: str = "", request_id: str | None = None) -> None:
    """One action on `instance` (a row: `id` and `owner_id`). `requester`: the cloud auth id
    of the user who asked, None for an admin command; `request_id` defaults to the current
    request's or command's (controller/request_ids.py)."""
    if action not in ACTIONS or result not in RESULTS:
        raise ValueError(f"history: unknown action {action!r} or result {result!r}")
    entry = {
        "instance_id": instance["id"], "owner_id": instance["owner_id"], "action": action, "requester": requester,
        "request_id": request_id or request_ids.current() or request_ids.new(), "result": result,
        "message": message[:_MAX_MESSAGE], "at_utc": utc_now(),
    }
    try:
        ctx.store.insert_instance_action(entry)
    except sqlite3.Error as e:
        # The action itself already happened (or failed for its own reason): a lost history
        # row must not change its answer, as for the audit.
        log.error("could not record %s of instance %s: %s", action, instance["id"], e)


class Outcome:
    """What a block under recorded() has to say of its success (the history's `message`)."""

    def __init__(self) -> None:
        self.message = ""


@contextmanager
def recorded(ctx, instance: dict, action: str, *, requester: str | None) -> Iterator[Outcome]:
    """Record `action` as a success when the block ends (with the message the block set on the
    Outcome it gets), as an error with its message when it raises (the error goes on to the
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
    record(ctx, instance, action, requester=requester, message=outcome.message)


def list_actions(ctx, requester: Requester, instance_id: str) -> list[dict]:
    """The instance's actions oldest first, for whoever sees the instance (while it lives or,
    by its kept owner, after its delete); 404 otherwise."""
    scope = perms.visible_to(requester)

    def visible_rows(parsed: str) -> list[dict] | None:
        rows = ctx.store.list_instance_actions(parsed, visible_to=scope)
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
