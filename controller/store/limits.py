"""Per-user limit overrides (table user_limits) and what each user holds against them."""

import sqlite3

from controller.limits import KINDS as LIMIT_KINDS


class LimitRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    @staticmethod
    def _limit_overrides(conn: sqlite3.Connection, user_id: str) -> dict[str, int]:
        row = conn.execute("SELECT * FROM user_limits WHERE user_id = ?", (user_id,)).fetchone()
        return {k: row[k] for k in LIMIT_KINDS if row is not None and row[k] is not None}

    def limit_overrides(self, user_id: str) -> dict[str, int]:
        """The user's own limits (kind -> value); kinds without an override are absent."""
        return self._limit_overrides(self.conn, user_id)

    def set_limit_overrides(self, user_id: str, values: dict[str, int], *, reset: bool = False) -> None:
        """Set these overrides (after dropping all of the user's with reset); others stay."""
        unknown = set(values) - set(LIMIT_KINDS)
        if unknown:
            raise ValueError(f"unknown limit kinds: {sorted(unknown)}")
        with self.write() as conn:
            if reset:
                conn.execute("DELETE FROM user_limits WHERE user_id = ?", (user_id,))
            if values:
                columns = ", ".join(values)
                marks = ", ".join(f":{k}" for k in values)
                updates = ", ".join(f"{k} = excluded.{k}" for k in values)
                conn.execute(
                    f"""INSERT INTO user_limits (user_id, {columns}) VALUES (:_user_id, {marks})
                        ON CONFLICT (user_id) DO UPDATE SET {updates}""",
                    dict(values, _user_id=user_id),
                )

    @staticmethod
    def _instance_usage(conn: sqlite3.Connection, owner_id: str | None = None) -> dict[str, int]:
        """Live instances and the sums of their flavors' vcpu and memory: one owner's, or all."""
        sql = """SELECT COUNT(*), COALESCE(SUM(f.vcpu), 0), COALESCE(SUM(f.memory), 0)
                 FROM instances i JOIN flavors f ON f.id = i.flavor_id"""
        params: tuple = ()
        if owner_id is not None:
            sql += " WHERE i.owner_id = ?"
            params = (owner_id,)
        instances, vcpus, memory_mb = conn.execute(sql, params).fetchone()
        return {"instances": instances, "vcpus": vcpus, "memory_mb": memory_mb}

    def instance_usage(self) -> dict[str, int]:
        """Live instances of every user, and the sums of their flavors' vcpu and memory."""
        return self._instance_usage(self.conn)

    def usage_of(self, user_id: str) -> dict[str, int]:
        """What a user holds, per limit kind."""
        conn = self.conn
        usage = self._instance_usage(conn, user_id)
        usage["groups"] = conn.execute("SELECT COUNT(*) FROM groups WHERE owner_id = ?", (user_id,)).fetchone()[0]
        usage["managed_users"] = conn.execute(
            "SELECT COUNT(*) FROM users WHERE owner_userid = ?", (user_id,)).fetchone()[0]
        return usage

    def usage_by_user(self) -> list[dict]:
        """What each user holds per limit kind, with its overrides (None: the config's), for
        every user that holds something or has an override: one pass over each table."""
        overrides = ", ".join(f"l.{k} AS limit_{k}" for k in LIMIT_KINDS)
        return self._all(f"""
            WITH inst AS (SELECT i.owner_id AS user_id, COUNT(*) AS instances, SUM(f.vcpu) AS vcpus,
                                 SUM(f.memory) AS memory_mb
                          FROM instances i JOIN flavors f ON f.id = i.flavor_id GROUP BY i.owner_id),
                 grp AS (SELECT owner_id AS user_id, COUNT(*) AS groups FROM groups GROUP BY owner_id),
                 mgd AS (SELECT owner_userid AS user_id, COUNT(*) AS managed_users FROM users
                         WHERE owner_userid IS NOT NULL GROUP BY owner_userid),
                 ids AS (SELECT user_id FROM inst UNION SELECT user_id FROM grp UNION SELECT user_id FROM mgd
                         UNION SELECT user_id FROM user_limits)
            SELECT ids.user_id, COALESCE(inst.instances, 0) AS instances, COALESCE(inst.vcpus, 0) AS vcpus,
                   COALESCE(inst.memory_mb, 0) AS memory_mb, COALESCE(grp.groups, 0) AS groups,
                   COALESCE(mgd.managed_users, 0) AS managed_users, {overrides}
            FROM ids LEFT JOIN inst ON inst.user_id = ids.user_id LEFT JOIN grp ON grp.user_id = ids.user_id
                 LEFT JOIN mgd ON mgd.user_id = ids.user_id LEFT JOIN user_limits l ON l.user_id = ids.user_id""")
