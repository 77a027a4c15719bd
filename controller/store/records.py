"""What was done: the audit trail (table audit), each instance's history
(instance_actions) and the last reconcile's report (reconcile_runs, reconcile_drift)."""

import time
from collections.abc import Iterator


# One entry of an instance's history as its API object (controller/audit/history.py), encoded by SQLite.
_ACTION_JSON = """json_object('action', action, 'requester', requester, 'request-id', request_id,
    'result', result, 'message', message, 'time', at_utc)"""


def insert_action(conn, entry: dict, *, keep: int | None) -> None:
    """One history entry inserted in the caller's write transaction; with `keep`, only the
    instance's newest `keep` entries remain."""
    conn.execute(
        """INSERT INTO instance_actions (instance_id, owner_id, action, requester, request_id, result,
                                         message, at_utc)
           VALUES (:instance_id, :owner_id, :action, :requester, :request_id, :result, :message, :at_utc)""",
        entry,
    )
    if keep is not None:
        # The index (instance_id, id) finds the oldest kept entry without a scan.
        conn.execute(
            """DELETE FROM instance_actions WHERE instance_id = :i AND id < (
                   SELECT id FROM instance_actions WHERE instance_id = :i ORDER BY id DESC
                   LIMIT 1 OFFSET :skip)""", {"i": entry["instance_id"], "skip": keep - 1})


class RecordRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_audit(self, entry: dict) -> None:
        with self.write() as conn:
            conn.execute(
                """INSERT INTO audit (at_utc, actor, action, target, result, detail, request_id)
                   VALUES (:at_utc, :actor, :action, :target, :result, :detail, :request_id)""",
                entry,
            )

    def list_audit(self, *, since: str | None = None, actor: str | None = None, limit: int = 1000) -> list[dict]:
        where, params = ["1"], []
        if since is not None:
            where.append("at_utc >= ?")
            params.append(since)
        if actor is not None:
            where.append("actor = ?")
            params.append(actor)
        params.append(limit)
        return self._all(f"SELECT * FROM audit WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", params)

    def delete_audit_before(self, before: str, *, batch: int = 10_000) -> int:
        """Delete audit rows older than `before`, a batch per transaction so the server's own
        writes never wait long behind a large prune. Returns how many went."""
        return self._delete_before("audit", before, batch)

    def _delete_before(self, table: str, before: str, batch: int) -> int:
        total = 0
        while True:
            with self.write() as conn:
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE at_utc < ? LIMIT ?)",
                    (before, batch),
                ).rowcount
            total += deleted
            if deleted < batch:
                return total

    def insert_instance_action(self, entry: dict, *, keep: int | None = None, coalesce: bool = False) -> None:
        """One history entry. With `coalesce`, an entry like the instance's newest (same action,
        requester, result and message) only moves that one's time and request id; with
        `keep`, only the instance's newest `keep` entries remain."""
        with self.write() as conn:
            if coalesce:
                newest = conn.execute(
                    "SELECT id, action, requester, result, message FROM instance_actions WHERE instance_id = ? "
                    "ORDER BY id DESC LIMIT 1", (entry["instance_id"],)).fetchone()
                if newest is not None and (newest["action"], newest["requester"], newest["result"],
                                           newest["message"]) == (entry["action"], entry["requester"],
                                                                  entry["result"], entry["message"]):
                    conn.execute("UPDATE instance_actions SET request_id = ?, at_utc = ? WHERE id = ?",
                                 (entry["request_id"], entry["at_utc"], newest["id"]))
                    return
            insert_action(conn, entry, keep=keep)

    def list_instance_actions(self, instance_id: str, *, visible_to: str | None, limit: int = -1) -> list[dict]:
        """The instance's `limit` most recent actions (all: -1), oldest first, by the visibility
        rule of the instance itself applied to the owner each row keeps (so they stay readable
        after the delete)."""
        where, params = self._where(visible_to, instance_id=instance_id)
        return self._all(f"SELECT * FROM (SELECT * FROM instance_actions WHERE {where} ORDER BY id DESC LIMIT ?) "
                         "ORDER BY id", (*params, limit))

    def instance_action_page(self, instance_id: str, *, visible_to: str | None, limit: int,
                             before: int | None = None) -> tuple[int, int, bool] | None:
        """Where one page of the history lies: the ids of its oldest and newest entries, the
        instance's `limit` most recent with an id below `before` (all: None), and whether older
        ones remain; None when there is none. Keyed on the id (AUTOINCREMENT: never reused, a
        new entry's is above all others), so entries written meanwhile never shift a page."""
        where, params = self._where(visible_to, instance_id=instance_id)
        below, below_params = ("", []) if before is None else (" AND id < ?", [before])
        count, first, last = self.conn.execute(
            f"""SELECT count(*), min(id), max(id) FROM (SELECT id FROM instance_actions
                WHERE {where}{below} ORDER BY id DESC LIMIT ?)""", [*params, *below_params, limit]).fetchone()
        if not count:
            return None
        older = self.conn.execute(f"SELECT 1 FROM instance_actions WHERE {where} AND id < ? LIMIT 1",
                                  [*params, first]).fetchone() is not None
        return first, last, older

    def iter_instance_actions_json(self, instance_id: str, *, visible_to: str | None, first: int, last: int,
                                   per_chunk: int = 200) -> Iterator[str]:
        """The instance's entries with ids from `first` to `last` (instance_action_page), oldest
        first, as history objects encoded by SQLite: chunks of up to per_chunk JSON objects
        joined by commas. As iter_instance_json, each chunk is read by its own statement, ended
        before it is yielded: a page is never held whole, and a client that stops reading holds
        no transaction. An entry pruned meanwhile is left out; none is listed twice."""
        where, params = self._where(visible_to, instance_id=instance_id)

        def chunks() -> Iterator[str]:
            after = first - 1
            while True:
                # The objects are concatenated in the order the subquery gives them.
                count, upto, text = self.conn.execute(
                    f"""SELECT count(*), max(id), group_concat(obj, ',') FROM (
                            SELECT id, {_ACTION_JSON} AS obj FROM instance_actions
                            WHERE {where} AND id > ? AND id <= ? ORDER BY id LIMIT ?)""",
                    [*params, after, last, per_chunk]).fetchone()
                if text:
                    yield text
                if count < per_chunk:
                    return
                after = upto

        return chunks()

    def delete_instance_actions_before(self, before: str, *, batch: int = 10_000) -> int:
        return self._delete_before("instance_actions", before, batch)

    def record_reconcile(self, counts: dict[str, tuple[int, int]], *, fix: bool) -> None:
        """Replace the last reconcile's report: kind -> (items found, items left unrepaired)."""
        with self.write() as conn:
            conn.execute("DELETE FROM reconcile_drift")
            conn.executemany("INSERT INTO reconcile_drift (kind, found, remaining) VALUES (?, ?, ?)",
                             [(kind, found, remaining) for kind, (found, remaining) in counts.items()])
            conn.execute("INSERT OR REPLACE INTO reconcile_runs (id, finished_at, fix) VALUES (1, ?, ?)",
                         (int(time.time()), int(fix)))

    def last_reconcile(self) -> dict | None:
        """{"finished_at", "fix", "drift": [{"kind", "found", "remaining"}]}, or None before any run."""
        run = self._one("SELECT finished_at, fix FROM reconcile_runs WHERE id = 1")
        if run is None:
            return None
        return {**run, "drift": self._all("SELECT kind, found, remaining FROM reconcile_drift ORDER BY kind")}
