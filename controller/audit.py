"""The audit trail: who did what to which target, with what result, and when.

Rows carry ids, route names and status codes only; request bodies never reach
the audit, so no password or secret can.
"""

import logging
import sqlite3

from controller.store import Store, utc_now

log = logging.getLogger(__name__)


def record(store: Store, *, actor: str, action: str, target: str = "", result: str, detail: str = "") -> None:
    try:
        store.insert_audit(
            {"at_utc": utc_now(), "actor": actor, "action": action, "target": target, "result": result,
             "detail": detail[:500]}
        )
    except sqlite3.Error as e:
        # The action itself already happened; losing its audit row must not turn it into an error.
        log.error("could not write the audit row for %s %s: %s", action, target, e)


def list_entries(store: Store, *, since: str | None = None, actor: str | None = None, limit: int = 1000) -> list[dict]:
    return store.list_audit(since=since, actor=actor, limit=limit)
