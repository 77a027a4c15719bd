"""Storage volumes (table volumes): each user's one home directory."""

import sqlite3

from controller.errors import Conflict


INSERT_VOLUME = """INSERT INTO volumes (id, owner_id, size_gb, name, visibility, mount_point, creation_date, state,
    uid)
    VALUES (:id, :owner_id, :size_gb, :name, :visibility, :mount_point, :creation_date, :state, :uid)"""


class VolumeRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_volume(self, volume: dict) -> None:
        try:
            with self.write() as conn:
                conn.execute(INSERT_VOLUME, {"state": "creating", **volume})
        except sqlite3.IntegrityError as e:
            if "volumes.owner_id" in str(e):
                raise Conflict("you already have a home volume (one per user)") from None
            raise

    def list_volumes(self, *, visible_to: str | None, owner_id: str | None = None,
                     volume_id: str | None = None, with_intents: bool = False) -> list[dict]:
        """Ready volumes; those being created or deleted too with_intents (reconcile)."""
        where, params = self._where(visible_to, owner_id=owner_id, id=volume_id)
        if not with_intents:
            where += " AND state = 'ready'"
        return self._all(f"SELECT * FROM volumes WHERE {where} ORDER BY creation_date, id", params)

    def volume_of_user(self, user_id: str) -> dict | None:
        return self._one("SELECT * FROM volumes WHERE owner_id = ?", (user_id,))

    def volumes_with_uid(self, uid: int) -> list[dict]:
        """Volumes made or being made whose quota is kept under uid (not those being deleted)."""
        return self._all("SELECT * FROM volumes WHERE uid = ? AND state != 'deleting'", (uid,))

    def set_volume_state(self, volume_id: str, state: str, *, expect: str) -> bool:
        """Move the volume from state `expect` to `state`; False (nothing changed) if it was not in `expect`."""
        with self.write() as conn:
            cur = conn.execute("UPDATE volumes SET state = ? WHERE id = ? AND state = ?", (state, volume_id, expect))
        return cur.rowcount == 1

    def volume_owners(self, user_ids: list[str]) -> set[str]:
        if not user_ids:
            return set()
        marks = ",".join("?" * len(user_ids))
        return {r["owner_id"] for r in self._all(
            f"SELECT owner_id FROM volumes WHERE owner_id IN ({marks}) AND state = 'ready'", user_ids)}

    def volume_mount_points(self, user_ids: list[str]) -> dict[str, str]:
        """user id -> mount point of its volume, for the users that have one."""
        if not user_ids:
            return {}
        marks = ",".join("?" * len(user_ids))
        return {
            r["owner_id"]: r["mount_point"]
            for r in self._all(
                f"SELECT owner_id, mount_point FROM volumes WHERE owner_id IN ({marks}) AND state = 'ready'", user_ids)
        }

    def list_volumes_with_owners(self, controller_id: int) -> list[dict]:
        """Every ready volume, oldest first (those of one second in the order made), with its
        owner's email (`owner_email`) and the username and uid of the owner's account on this
        controller (`username`, `account_uid`; None without one)."""
        return self._all(
            """SELECT v.*, u.email AS owner_email, a.username AS username, a.uid AS account_uid
               FROM volumes v
               LEFT JOIN users u ON u.id = v.owner_id
               LEFT JOIN system_accounts a ON a.user_id = v.owner_id AND a.cloud_controller_id = ?
               WHERE v.state = 'ready'
               ORDER BY v.creation_date, v.rowid""", (controller_id,))

    def set_volume_size(self, volume_id: str, size_gb: int) -> bool:
        """Record a ready volume's new size; False (nothing changed) when it is not ready
        (being deleted, or gone)."""
        with self.write() as conn:
            cur = conn.execute("UPDATE volumes SET size_gb = ? WHERE id = ? AND state = 'ready'", (size_gb, volume_id))
        return cur.rowcount == 1

    def delete_volume(self, volume_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM volumes WHERE id = ?", (volume_id,))
