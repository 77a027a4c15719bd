"""System accounts on this cluster (table system_accounts), alone and with their users."""

import json
import sqlite3

from controller.errors import Conflict


INSERT_ACCOUNT = """INSERT INTO system_accounts (user_id, username, uuid, uid, gid, home,
    cloud_controller_id, created_at_utc)
    VALUES (:user_id, :username, :uuid, :uid, :gid, :home, :cloud_controller_id, :created_at_utc)"""


class AccountRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def accounts_of_users(self, user_ids: list[str]) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {u: [] for u in user_ids}
        if not user_ids:
            return out
        marks = ",".join("?" * len(user_ids))
        for row in self._all(
            f"SELECT * FROM system_accounts WHERE user_id IN ({marks}) ORDER BY id", user_ids
        ):
            out[row["user_id"]].append(row)
        return out

    def insert_account(self, account: dict) -> dict:
        try:
            with self.write() as conn:
                cur = conn.execute(INSERT_ACCOUNT, account)
        except sqlite3.IntegrityError as e:
            if "system_accounts.username" in str(e):
                raise Conflict(f"system account already exists: {account['username']}") from None
            raise
        return dict(account, id=cur.lastrowid)

    def get_account_by_username(self, username: str) -> dict | None:
        return self._one("SELECT * FROM system_accounts WHERE username = ?", (username,))

    def set_account_state(self, account_id: int, state: str, *, expect: str) -> bool:
        with self.write() as conn:
            cur = conn.execute("UPDATE system_accounts SET state = ? WHERE id = ? AND state = ?",
                               (state, account_id, expect))
        return cur.rowcount == 1

    def delete_account(self, account_id: int) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM system_accounts WHERE id = ?", (account_id,))

    def list_accounts(self) -> list[dict]:
        return self._all("SELECT * FROM system_accounts ORDER BY id")

    def account_of_user(self, user_id: str, controller_id: int) -> dict | None:
        return self._one(
            "SELECT * FROM system_accounts WHERE user_id = ? AND cloud_controller_id = ?", (user_id, controller_id)
        )

    def accounts_with_owners(self, *, uuids: list[str] | None = None, usernames: list[str] | None = None) -> list[dict]:
        """Accounts joined with their user's owner, roles (for permission checks) and active flag."""
        column, values = ("a.uuid", uuids) if uuids is not None else ("a.username", usernames)
        if not values:
            return []
        marks = ",".join("?" * len(values))
        rows = self._all(
            f"""SELECT a.*, u.owner_userid AS user_owner_userid, u.roles AS user_roles, u.active AS user_active
                FROM system_accounts a
                JOIN users u ON u.id = a.user_id WHERE {column} IN ({marks})""",
            list(values),
        )
        for r in rows:
            r["user_roles"] = json.loads(r["user_roles"])
        return rows
