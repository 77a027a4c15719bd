"""Instance leases: an instance's end (instances.expires_at) and what the sweep did about it
(lease_events: each warning, expiry and delete once per lease, with its notification).

Once per lease across processes is the UNIQUE key (instance, expires-at, event, step): the
process whose INSERT lands records the history entry in the same transaction; another
process's INSERT does nothing, and it records nothing (controller/instances/leases.py).
"""

from controller.store.records import insert_action


class LeaseRows:
    """Store's methods for leases (composed in controller/store/__init__.py)."""

    def set_instance_lease(self, instance_id: str, expires_at: str | None, *, history: dict | None = None,
                           keep: int | None = None) -> bool:
        """The live instance's end (None: no lease), with its history entry in the same
        transaction; False when there is no such live instance (nothing written)."""
        with self.write() as conn:
            cur = conn.execute("UPDATE instances SET expires_at = ? WHERE id = ? AND intent IS NULL",
                               (expires_at, instance_id))
            if cur.rowcount == 1 and history is not None:
                insert_action(conn, history, keep=keep)
        return cur.rowcount == 1

    def leases_due(self, until: str) -> list[dict]:
        """Live instances whose lease ends at or before `until`, soonest first, each with `done`:
        the events already recorded for its present lease, as "event:step" strings. Read by the
        index on expires_at: with no lease near its end this reads no row."""
        rows = self._all(
            """SELECT i.id, i.owner_id, i.hostname, i.expires_at, i.flavor_id, i.host, i.status,
                      (SELECT group_concat(e.event || ':' || e.step) FROM lease_events e
                       WHERE e.instance_id = i.id AND e.expires_at = i.expires_at) AS done
               FROM instances i WHERE i.expires_at IS NOT NULL AND i.expires_at <= ? AND i.intent IS NULL
               ORDER BY i.expires_at, i.id""", (until,))
        for row in rows:
            row["done"] = set((row["done"] or "").split(",")) - {""}
        return rows

    def lease_event_done(self, instance_id: str, expires_at: str, event: str, step: int = 0) -> bool:
        return self._one("SELECT 1 AS done FROM lease_events WHERE instance_id = ? AND expires_at = ? AND event = ? "
                         "AND step = ?", (instance_id, expires_at, event, step)) is not None

    def record_lease_event(self, event: dict, *, history: dict | None, keep: int | None = None) -> bool:
        """The event (instance_id, expires_at, event, step, payload, at_utc, notified_at) and,
        only when it is new, its history entry, in one transaction: True when this call
        recorded it, False when it was recorded already (by this process or another)."""
        with self.write() as conn:
            cur = conn.execute(
                """INSERT INTO lease_events (instance_id, expires_at, event, step, payload, at_utc, notified_at)
                   VALUES (:instance_id, :expires_at, :event, :step, :payload, :at_utc, :notified_at)
                   ON CONFLICT (instance_id, expires_at, event, step) DO NOTHING""", event)
            if cur.rowcount == 1 and history is not None:
                insert_action(conn, history, keep=keep)
        return cur.rowcount == 1

    def unnotified_lease_events(self, now: str, *, limit: int = 100) -> list[dict]:
        """Events notify_command has not taken yet and no process is running it for, oldest first."""
        return self._all("SELECT * FROM lease_events WHERE notified_at IS NULL AND "
                         "(notifying_until IS NULL OR notifying_until < ?) ORDER BY id LIMIT ?", (now, limit))

    def take_lease_notification(self, event_id: int, *, now: str, until: str) -> bool:
        """Compare-and-set: this process runs notify_command for the event until `until`
        (another process's hold ends then); False when another holds it or it is done."""
        with self.write() as conn:
            cur = conn.execute(
                """UPDATE lease_events SET notifying_until = ?, attempts = attempts + 1
                   WHERE id = ? AND notified_at IS NULL AND (notifying_until IS NULL OR notifying_until < ?)""",
                (until, event_id, now))
        return cur.rowcount == 1

    def end_lease_notification(self, event_id: int, *, notified_at: str | None) -> None:
        """Let go of the event: done (notified_at) or to be tried again at the next sweep (None)."""
        with self.write() as conn:
            conn.execute("UPDATE lease_events SET notifying_until = NULL, notified_at = ? WHERE id = ?",
                         (notified_at, event_id))

    def list_lease_events(self, instance_id: str | None = None) -> list[dict]:
        if instance_id is None:
            return self._all("SELECT * FROM lease_events ORDER BY id")
        return self._all("SELECT * FROM lease_events WHERE instance_id = ? ORDER BY id", (instance_id,))

    def lease_counts(self, *, now: str, until: str) -> tuple[int, int]:
        """(live instances whose lease ends after now and by `until`, those whose lease has ended)."""
        expiring, expired = self.conn.execute(
            """SELECT count(*) FILTER (WHERE expires_at > ?), count(*) FILTER (WHERE expires_at <= ?)
               FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? AND intent IS NULL""",
            (now, now, until)).fetchone()
        return expiring, expired

    def delete_lease_events_before(self, before: str, *, batch: int = 10_000) -> int:
        """Events older than `before` (the audit retention), notified or not."""
        return self._delete_before("lease_events", before, batch)
