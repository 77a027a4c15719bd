"""Users (table users), their roles and ownership links, and the email reservations of
admin commands (table email_reservations)."""

import json
import sqlite3
import time

from controller.errors import Conflict


# The INSERT the service makes one row at a time with and the sandbox's bulk load (bulk.py)
# many at once: one column list for both, as each INSERT_* of this package.
INSERT_USER = """INSERT INTO users (id, email, name, password_hash, active, owner_userid, roles,
    registration_source, api_key, api_secret_enc, created_at_utc)
    VALUES (:id, :email, :name, :password_hash, :active, :owner_userid, :roles,
    :registration_source, :api_key, :api_secret_enc, :created_at_utc)"""


class UserRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    def insert_user(self, user: dict, *, admit=None) -> None:
        """Insert a user. With an owner, admit(overrides=, owned=) sees the owner's limit
        overrides and how many users it owns, inside the insert's transaction, and may raise."""
        row = dict(user, roles=json.dumps(sorted(user.get("roles", []))))
        try:
            with self.write() as conn:
                self._refuse_reserved_email(conn, user["email"], user_id=None)
                if admit is not None and user.get("owner_userid"):
                    owner = user["owner_userid"]
                    admit(overrides=self._limit_overrides(conn, owner),
                          owned=conn.execute("SELECT COUNT(*) FROM users WHERE owner_userid = ?",
                                             (owner,)).fetchone()[0])
                conn.execute(INSERT_USER, row)
        except sqlite3.IntegrityError as e:
            if "users.email" in str(e):
                raise Conflict(f"email already used: {user['email']}") from None
            raise

    @staticmethod
    def _user_row(row: dict | None) -> dict | None:
        if row is not None:
            row["roles"] = json.loads(row["roles"])
        return row

    def get_user(self, user_id: str) -> dict | None:
        return self._user_row(self._one("SELECT * FROM users WHERE id = ?", (user_id,)))

    def emails_of(self, user_ids) -> dict[str, str]:
        """User id -> email, for the ids that are users (the portal names owners with it)."""
        ids = sorted(set(user_ids))
        out: dict[str, str] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            rows = self._all(f"SELECT id, email FROM users WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            out.update({r["id"]: r["email"] for r in rows})
        return out

    def get_user_by_email(self, email: str) -> dict | None:
        return self._user_row(self._one("SELECT * FROM users WHERE email = ?", (email,)))

    def get_user_by_api_key(self, api_key: str) -> dict | None:
        return self._user_row(self._one("SELECT * FROM users WHERE api_key = ?", (api_key,)))

    def list_users(
        self,
        *,
        visible_to: str | None = None,
        owner_userid: str | None = None,
        include_inactive: bool = False,
        registration_source: str | None = None,
    ) -> list[dict]:
        """Users in creation order. visible_to limits to that user and the users it owns."""
        where, params = [], []
        if visible_to is not None:
            where.append("(id = ? OR owner_userid = ?)")
            params += [visible_to, visible_to]
        if owner_userid is not None:
            where.append("owner_userid = ?")
            params.append(owner_userid)
        if not include_inactive:
            where.append("active > 0")
        if registration_source is not None:
            where.append("registration_source = ?")
            params.append(registration_source)
        sql = "SELECT * FROM users"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at_utc, rowid"
        return [self._user_row(r) for r in self._all(sql, params)]

    def users_with_username(self, username: str) -> list[dict]:
        return [
            self._user_row(r)
            for r in self._all(
                "SELECT u.* FROM users u JOIN system_accounts a ON a.user_id = u.id WHERE a.username = ?",
                (username,),
            )
        ]

    def update_user(self, user_id: str, changes: dict) -> None:
        if not changes:
            return
        changes = dict(changes)
        if "roles" in changes:
            changes["roles"] = json.dumps(sorted(changes["roles"]))
        columns = ", ".join(f"{k} = :{k}" for k in changes)
        try:
            with self.write() as conn:
                if "email" in changes:
                    self._refuse_reserved_email(conn, changes["email"], user_id=user_id)
                conn.execute(f"UPDATE users SET {columns} WHERE id = :_id", dict(changes, _id=user_id))
                if changes.get("active") == 0:
                    conn.execute("DELETE FROM tokens WHERE user_id = ?", (user_id,))
                    conn.execute("DELETE FROM portal_sessions WHERE user_id = ?", (user_id,))
        except sqlite3.IntegrityError as e:
            if "users.email" in str(e):
                raise Conflict(f"email already used: {changes.get('email')}") from None
            raise

    def set_password_hash(self, user_id: str, password_hash: str) -> None:
        with self.write() as conn:
            conn.execute("UPDATE users SET password_hash = ? WHERE id = ?", (password_hash, user_id))
            conn.execute("DELETE FROM tokens WHERE user_id = ? AND source = 'password'", (user_id,))
            # Portal sessions are password logins too.
            conn.execute("DELETE FROM portal_sessions WHERE user_id = ?", (user_id,))

    def upgrade_password_hash(self, user_id: str, *, old: str, new: str) -> bool:
        """The same password's hash made with new argon2 parameters: no session or token ends.
        Only while the stored hash is still `old` (a password changed meanwhile stays)."""
        with self.write() as conn:
            return conn.execute("UPDATE users SET password_hash = ? WHERE id = ? AND password_hash = ?",
                                (new, user_id, old)).rowcount == 1

    def set_api_secret(self, user_id: str, api_secret_enc: str | None) -> None:
        """A new secret kills the tokens issued from the key; a null one kills them all."""
        with self.write() as conn:
            conn.execute("UPDATE users SET api_secret_enc = ? WHERE id = ?", (api_secret_enc, user_id))
            if api_secret_enc is None:
                conn.execute("DELETE FROM tokens WHERE user_id = ?", (user_id,))
            else:
                conn.execute("DELETE FROM tokens WHERE user_id = ? AND source = 'api_key'", (user_id,))

    def delete_user(self, user_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM users WHERE id = ?", (user_id,))

    def count_owned(self, user_ids: list[str]) -> dict[str, int]:
        if not user_ids:
            return {}
        marks = ",".join("?" * len(user_ids))
        rows = self._all(
            f"SELECT owner_userid, COUNT(*) AS n FROM users WHERE owner_userid IN ({marks}) GROUP BY owner_userid",
            user_ids,
        )
        return {r["owner_userid"]: r["n"] for r in rows}

    def user_has_volume_or_account(self, user_id: str) -> tuple[bool, bool]:
        volume = self._one("SELECT 1 FROM volumes WHERE owner_id = ?", (user_id,)) is not None
        account = self._one("SELECT 1 FROM system_accounts WHERE user_id = ? UNION ALL "
                            "SELECT 1 FROM registered_accounts WHERE user_id = ?", (user_id, user_id)) is not None
        return volume, account

    def set_roles(self, user_id: str, roles: list[str], *, keeps_owner) -> list[dict]:
        """Set a user's roles and, in the same transaction, cut every ownership link that
        keeps_owner(owner_roles, user_roles) no longer allows: the user's own link to its
        owner and the links of the users it owns. Returns the cut links, each
        {"user_id", "owner_userid"}."""
        cut = []
        with self.write() as conn:
            conn.execute("UPDATE users SET roles = ? WHERE id = ?", (json.dumps(sorted(roles)), user_id))
            owner = conn.execute(
                "SELECT o.id, o.roles FROM users u JOIN users o ON o.id = u.owner_userid WHERE u.id = ?", (user_id,)
            ).fetchone()
            if owner is not None and not keeps_owner(json.loads(owner["roles"]), roles):
                cut.append({"user_id": user_id, "owner_userid": owner["id"]})
            for managed in conn.execute("SELECT id, roles FROM users WHERE owner_userid = ?", (user_id,)).fetchall():
                if not keeps_owner(roles, json.loads(managed["roles"])):
                    cut.append({"user_id": managed["id"], "owner_userid": user_id})
            conn.executemany("UPDATE users SET owner_userid = NULL WHERE id = ?", [(c["user_id"],) for c in cut])
        return cut

    def reserve_user_email(self, *, reservation_id: str, holder: str, expires_at: int,
                           user_id: str | None = None, email: str | None = None) -> dict | None:
        """Look a user up by id or email and reserve its current address, in one transaction,
        so no other user can take the address until release_email_reservation (or expiry).
        None when no such user exists."""
        with self.write() as conn:
            conn.execute("DELETE FROM email_reservations WHERE expires_at <= ?", (int(time.time()),))
            if user_id is not None:
                row = conn.execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
            else:
                row = conn.execute("SELECT * FROM users WHERE email = ?", (email,)).fetchone()
            if row is None:
                return None
            conn.execute(
                "INSERT INTO email_reservations (id, email, user_id, holder, expires_at) VALUES (?, ?, ?, ?, ?)",
                (reservation_id, row["email"], row["id"], holder, expires_at),
            )
        return self._user_row(dict(row))

    def release_email_reservation(self, reservation_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM email_reservations WHERE id = ?", (reservation_id,))

    @staticmethod
    def _refuse_reserved_email(conn: sqlite3.Connection, email: str, *, user_id: str | None) -> None:
        """Conflict when a live reservation holds this address for another user (inside the
        write transaction that would take it, so the check and the change are one step)."""
        held = conn.execute(
            "SELECT 1 FROM email_reservations WHERE email = ? AND user_id IS NOT ? AND expires_at > ?",
            (email, user_id, int(time.time())),
        ).fetchone()
        if held is not None:
            raise Conflict(f"email {email} is reserved by an administrator's command in progress; try again shortly")
