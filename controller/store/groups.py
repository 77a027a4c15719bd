"""UNIX groups (table groups) and their members (group_members)."""

import sqlite3

from controller.errors import Conflict


INSERT_GROUP = """INSERT INTO groups (id, owner_id, name, creation_date, state)
    VALUES (:id, :owner_id, :name, :creation_date, :state)"""
INSERT_MEMBER = "INSERT INTO group_members (group_id, username, position) VALUES (?, ?, ?)"


class GroupRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_group(self, group: dict, members: list[str], *, admit=None) -> None:
        """Insert a group and its members; admit(overrides=, owned=) may refuse it inside the
        transaction, given the owner's limit overrides and how many groups it owns."""
        try:
            with self.write() as conn:
                if admit is not None:
                    owner = group["owner_id"]
                    admit(overrides=self._limit_overrides(conn, owner),
                          owned=conn.execute("SELECT COUNT(*) FROM groups WHERE owner_id = ?", (owner,)).fetchone()[0])
                conn.execute(INSERT_GROUP, {"state": "creating", **group})
                self._write_members(conn, group["id"], members)
        except sqlite3.IntegrityError as e:
            if "groups.name" in str(e):
                raise Conflict(f"group {group['name']} exists") from None
            raise

    @staticmethod
    def _write_members(conn, group_id: str, members: list[str]) -> None:
        conn.execute("DELETE FROM group_members WHERE group_id = ?", (group_id,))
        conn.executemany(INSERT_MEMBER, [(group_id, m, i) for i, m in enumerate(members)])

    def set_group_members(self, group_id: str, members: list[str]) -> None:
        with self.write() as conn:
            self._write_members(conn, group_id, members)

    def list_groups(self, *, visible_to: str | None, owner_id: str | None = None, name: str | None = None,
                    group_id: str | None = None, with_intents: bool = False) -> list[dict]:
        """Ready groups; those being created or deleted too with_intents (reconcile)."""
        where, params = self._where(visible_to, owner_id=owner_id, name=name, id=group_id)
        if not with_intents:
            where += " AND state = 'ready'"
        rows = self._all(f"SELECT * FROM groups WHERE {where} ORDER BY creation_date, name", params)
        if rows:
            marks = ",".join("?" * len(rows))
            members: dict[str, list[str]] = {}
            for m in self._all(
                f"SELECT group_id, username FROM group_members WHERE group_id IN ({marks}) ORDER BY position",
                [r["id"] for r in rows],
            ):
                members.setdefault(m["group_id"], []).append(m["username"])
            for r in rows:
                r["members"] = members.get(r["id"], [])
        return rows

    def set_group_state(self, group_id: str, state: str, *, expect: str) -> bool:
        """Move the group from state `expect` to `state`; False (nothing changed) if it was not in `expect`."""
        with self.write() as conn:
            cur = conn.execute("UPDATE groups SET state = ? WHERE id = ? AND state = ?", (state, group_id, expect))
        return cur.rowcount == 1

    def delete_group(self, group_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM groups WHERE id = ?", (group_id,))

    def group_names_of_members(self, usernames: list[str]) -> dict[str, list[str]]:
        """username -> names of the API-made groups it is a member of, sorted."""
        if not usernames:
            return {}
        marks = ",".join("?" * len(usernames))
        out: dict[str, list[str]] = {}
        for r in self._all(
            f"""SELECT m.username, g.name FROM group_members m JOIN groups g ON g.id = m.group_id
                WHERE m.username IN ({marks}) AND g.state = 'ready' ORDER BY g.name""",
            usernames,
        ):
            out.setdefault(r["username"], []).append(r["name"])
        return out

    def groups_with_member(self, username: str) -> list[dict]:
        return self._all(
            "SELECT g.* FROM groups g JOIN group_members m ON m.group_id = g.id WHERE m.username = ? AND g.state = 'ready'",
            (username,)
        )
