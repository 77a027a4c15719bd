"""All SQL of the project: one SQLite database reached through sqlite-utils.

One connection per thread (a sqlite3 connection belongs to the thread that
made it), WAL so readers never wait for the writer, foreign keys on, and write
transactions opened with BEGIN IMMEDIATE so a read-then-write never fails with
SQLITE_BUSY half way. Hot paths run prepared SQL; sqlite-utils serves schema
work and admin paths.
"""

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from controller import migrations
from controller.errors import Conflict

BUSY_TIMEOUT_MS = 10_000


def utc_now() -> str:
    """RFC 3339 UTC with seconds, as every date-time of the API."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self, path: str):
        self.path = str(path)
        self._local = threading.local()

    # -- connections and transactions ------------------------------------
    @property
    def db(self) -> sqlite_utils.Database:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite_utils.Database(self._connect())
            self._local.db = db
        return db

    @property
    def conn(self) -> sqlite3.Connection:
        return self.db.conn

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.conn.close()
            self._local.db = None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE, COMMIT on success, ROLLBACK on any error."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def migrate(self) -> tuple[int, int]:
        return migrations.migrate(self.conn)

    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def ping(self) -> None:
        """Raise sqlite3.Error unless the database answers and is fully migrated."""
        version = self.schema_version()
        if version != migrations.SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"schema version {version}, expected {migrations.SCHEMA_VERSION}: run `cloud-agent init`"
            )

    def backup(self, dest: str) -> None:
        """A consistent online copy (SQLite's backup API), safe while others write."""
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        target = sqlite3.connect(dest)
        try:
            self.conn.backup(target)
        finally:
            target.close()

    def _one(self, sql: str, params=()) -> dict | None:
        row = self.conn.execute(sql, params).fetchone()
        return dict(row) if row else None

    def _all(self, sql: str, params=()) -> list[dict]:
        return [dict(r) for r in self.conn.execute(sql, params).fetchall()]

    # -- users ------------------------------------------------------------
    def insert_user(self, user: dict) -> None:
        row = dict(user, roles=json.dumps(sorted(user.get("roles", []))))
        try:
            with self.write() as conn:
                conn.execute(
                    """INSERT INTO users (id, email, name, password_hash, active, owner_userid, roles,
                       registration_source, api_key, api_secret_enc, created_at_utc)
                       VALUES (:id, :email, :name, :password_hash, :active, :owner_userid, :roles,
                       :registration_source, :api_key, :api_secret_enc, :created_at_utc)""",
                    row,
                )
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
                conn.execute(f"UPDATE users SET {columns} WHERE id = :_id", dict(changes, _id=user_id))
                if changes.get("active") == 0:
                    conn.execute("DELETE FROM tokens WHERE user_id = ?", (user_id,))
        except sqlite3.IntegrityError as e:
            if "users.email" in str(e):
                raise Conflict(f"email already used: {changes.get('email')}") from None
            raise

    def set_password_hash(self, user_id: str, password_hash: str) -> None:
        with self.write() as conn:
            conn.execute("UPDATE users SET password_hash = ? WHERE id = ?", (password_hash, user_id))
            conn.execute("DELETE FROM tokens WHERE user_id = ? AND source = 'password'", (user_id,))

    def set_api_secret(self, user_id: str, api_secret_enc: str | None) -> None:
        with self.write() as conn:
            conn.execute("UPDATE users SET api_secret_enc = ? WHERE id = ?", (api_secret_enc, user_id))
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
        account = self._one("SELECT 1 FROM system_accounts WHERE user_id = ?", (user_id,)) is not None
        return volume, account

    # -- tokens -----------------------------------------------------------
    def insert_token(self, *, token_hash: str, user_id: str, source: str, expires_at: int) -> None:
        with self.write() as conn:
            conn.execute(
                "INSERT INTO tokens (token_hash, user_id, source, expires_at, created_at_utc) VALUES (?, ?, ?, ?, ?)",
                (token_hash, user_id, source, expires_at, utc_now()),
            )

    def token_owner(self, token_hash: str, *, now: int) -> dict | None:
        """The active user a live token belongs to, with the token's user id, or None."""
        return self._user_row(
            self._one(
                """SELECT u.* FROM tokens t JOIN users u ON u.id = t.user_id
                   WHERE t.token_hash = ? AND t.expires_at > ? AND u.active > 0""",
                (token_hash, now),
            )
        )

    def purge_expired_tokens(self, *, now: int) -> int:
        with self.write() as conn:
            return conn.execute("DELETE FROM tokens WHERE expires_at <= ?", (now,)).rowcount

    # -- system accounts --------------------------------------------------
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
                cur = conn.execute(
                    """INSERT INTO system_accounts (user_id, username, uuid, uid, gid, home,
                       cloud_controller_id, created_at_utc)
                       VALUES (:user_id, :username, :uuid, :uid, :gid, :home, :cloud_controller_id, :created_at_utc)""",
                    account,
                )
        except sqlite3.IntegrityError as e:
            if "system_accounts.username" in str(e):
                raise Conflict(f"system account already exists: {account['username']}") from None
            raise
        return dict(account, id=cur.lastrowid)

    def get_account_by_username(self, username: str) -> dict | None:
        return self._one("SELECT * FROM system_accounts WHERE username = ?", (username,))

    def get_accounts_by_uuid(self, uuids: list[str]) -> list[dict]:
        if not uuids:
            return []
        marks = ",".join("?" * len(uuids))
        return self._all(f"SELECT * FROM system_accounts WHERE uuid IN ({marks})", uuids)

    def delete_account(self, account_id: int) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM system_accounts WHERE id = ?", (account_id,))

    def list_accounts(self) -> list[dict]:
        return self._all("SELECT * FROM system_accounts ORDER BY id")
