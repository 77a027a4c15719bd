"""All SQL of the project: one SQLite database reached through sqlite-utils.

One connection per thread (a sqlite3 connection belongs to the thread that
made it), WAL so readers never wait for the writer, foreign keys on, and write
transactions opened with BEGIN IMMEDIATE so a read-then-write never fails with
SQLITE_BUSY half way. Hot paths run prepared SQL; sqlite-utils serves schema
work and admin paths.
"""

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import sqlite_utils

from controller import migrations
from controller.errors import Conflict
from controller.limits import KINDS as LIMIT_KINDS
from controller.read_memo import ReadMemo
from controller.write_mark import WriteMark

BUSY_TIMEOUT_MS = 10_000
# The host of instance rows made before there were hosts (migration _M8_HOSTS).
DEFAULT_HOST = "default"
# How long a token's owner is remembered at most, for writes that do not change the
# write mark (the sqlite3 shell); every write of the service or cloud-agent ends it at once.
TOKEN_MEMO_SECONDS = 5.0
_TOKEN_MEMO_MAX = 10_000
# Reads remembered until the next committed write (controller/read_memo.py): GETs of one
# instance (a row each, under 1 KB: at most about 2 MB), and lists of one chunk with the
# hosts holding their rows (up to a chunk of objects each, some 80 KB: at most about 5 MB).
_INSTANCE_MEMO_MAX = 2_000
_LIST_MEMO_MAX = 64


# The INSERT of each table whose rows the service makes one at a time and the sandbox's
# bulk load makes many at once (insert_loaded): one column list for both.
_INSERT_USER = """INSERT INTO users (id, email, name, password_hash, active, owner_userid, roles,
    registration_source, api_key, api_secret_enc, created_at_utc)
    VALUES (:id, :email, :name, :password_hash, :active, :owner_userid, :roles,
    :registration_source, :api_key, :api_secret_enc, :created_at_utc)"""
_INSERT_ACCOUNT = """INSERT INTO system_accounts (user_id, username, uuid, uid, gid, home,
    cloud_controller_id, created_at_utc)
    VALUES (:user_id, :username, :uuid, :uid, :gid, :home, :cloud_controller_id, :created_at_utc)"""
_INSERT_VOLUME = """INSERT INTO volumes (id, owner_id, size_gb, name, visibility, mount_point, creation_date, state,
    uid)
    VALUES (:id, :owner_id, :size_gb, :name, :visibility, :mount_point, :creation_date, :state, :uid)"""
_INSERT_GROUP = """INSERT INTO groups (id, owner_id, name, creation_date, state)
    VALUES (:id, :owner_id, :name, :creation_date, :state)"""
_INSERT_MEMBER = "INSERT INTO group_members (group_id, username, position) VALUES (?, ?, ?)"
_INSERT_INSTANCE = """INSERT INTO instances (id, owner_id, image_id, flavor_id, status, hostname, public_ip,
    private_ip, mac, public_mac, creation_date, intent, host) VALUES (:id, :owner_id, :image_id,
    :flavor_id, :status, :hostname, :public_ip, :private_ip, :mac, :public_mac, :creation_date,
    :intent, :host)"""
_INSERT_INSTANCE_USER = "INSERT INTO instance_users (instance_id, account_uuid) VALUES (?, ?)"


def _used_addresses(conn) -> dict[str, set[str]]:
    """What live instances use (keys private_ip, public_ip, mac, hostname), as allocate() takes it."""
    used: dict[str, set[str]] = {"private_ip": set(), "public_ip": set(), "mac": set(), "hostname": set()}
    for r in conn.execute("SELECT private_ip, public_ip, mac, public_mac, hostname FROM instances"):
        for key, value in (("private_ip", r[0]), ("public_ip", r[1]), ("mac", r[2]), ("mac", r[3]),
                           ("hostname", r[4])):
            if value is not None:
                used[key].add(value)
    return used


def utc_now() -> str:
    """RFC 3339 UTC with seconds, as every date-time of the API."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# A server-instance object (spec section 2.1) made by SQLite: `users` in the
# order they were granted (users_json, kept by triggers: migration _M10_LISTED_USERS), the
# address fields only when set. One printf per row: a json_object() with its nested array
# cost half as much again (10,000 rows: 57 ms, 37 ms; 21 ms with users_json).
_INSTANCE_JSON = """printf(
    '{{"id":%s,"cloudauth-id":%s,"users":[%s],"server-image":%s,"server-flavor":"%d","creation-date":%s,"status":%s%s%s%s}}',
    json_quote(id), json_quote(owner_id),
    users_json,
    json_quote(image_id), flavor_id, json_quote(creation_date), json_quote({status}),
    iif(coalesce(hostname, '') = '', '', ',"hostname":' || json_quote(hostname)),
    iif(coalesce(public_ip, '') = '', '', ',"public-ip":' || json_quote(public_ip)),
    iif(coalesce(private_ip, '') = '', '', ',"private-ip":' || json_quote(private_ip)))"""

# One entry of an instance's history as its API object (controller/history.py), encoded by SQLite.
_ACTION_JSON = """json_object('action', action, 'requester', requester, 'request-id', request_id,
    'result', result, 'message', message, 'time', at_utc)"""

# The two forms a GET uses, made once: with the stored status, or with a status given.
_INSTANCE_JSON_STORED = _INSTANCE_JSON.format(status="status")
_INSTANCE_JSON_GIVEN = _INSTANCE_JSON.format(status="?")


def _with_users(row: dict) -> dict:
    """An instance row with `users` (account uuids in grant order) from its users_json."""
    row["users"] = json.loads("[" + row.pop("users_json") + "]")
    return row



# What instances moving to a host (cloud-agent host drain) allocate there before their row names it.
_MOVES_IN_FLIGHT = """SELECT m.to_host, f.vcpu, f.memory FROM moves m JOIN instances i ON i.id = m.instance_id
                      JOIN flavors f ON f.id = i.flavor_id WHERE i.host != m.to_host"""

class Store:
    def __init__(self, path: str, *, create: bool = False):
        """Open the database at path; only with create=True (`cloud-agent init`) may it be made."""
        self.path = str(path)
        self.create = create
        self._local = threading.local()
        self._mark: WriteMark | None = None
        # token hash -> (write mark, token expiry, memo expiry, user id, roles)
        self._token_memo: dict[str, tuple] = {}
        self._instance_memo = ReadMemo(max_entries=_INSTANCE_MEMO_MAX, seconds=TOKEN_MEMO_SECONDS)
        self._list_memo = ReadMemo(max_entries=_LIST_MEMO_MAX, seconds=TOKEN_MEMO_SECONDS)

    @property
    def write_mark(self) -> WriteMark:
        if self._mark is None:
            self._mark = WriteMark(self.path)
        return self._mark

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
        target, uri = self.path, False
        if self.path != ":memory:":
            if self.create:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                # Private from its first byte, whatever the umask (SQLite would make it 0644):
                # its -wal, -shm and -mark files take its mode when they are made.
                try:
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
                except FileExistsError:
                    pass
            # mode=rw: a missing database is an error, not a new empty file.
            if not self.create and not os.path.exists(self.path):
                raise sqlite3.OperationalError(f"database {self.path} does not exist: run `cloud-agent init`")
            target = f"file:{quote(os.path.abspath(self.path))}?mode={'rwc' if self.create else 'rw'}"
            uri = True
        conn = sqlite3.connect(
            target, uri=uri, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True
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
        self.write_mark.change()

    def migrate(self) -> tuple[int, int]:
        try:
            return migrations.migrate(self.conn)
        finally:
            self.write_mark.change()

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
                conn.execute(_INSERT_USER, row)
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
        account = self._one("SELECT 1 FROM system_accounts WHERE user_id = ?", (user_id,)) is not None
        return volume, account

    # -- roles and ownership links -------------------------------------------
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

    # -- email reservations (admin commands that look a user up by email) -----
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

    # -- tokens -----------------------------------------------------------
    def insert_token(self, *, token_hash: str, user_id: str, source: str, expires_at: int) -> None:
        with self.write() as conn:
            conn.execute(
                "INSERT INTO tokens (token_hash, user_id, source, expires_at, created_at_utc) VALUES (?, ?, ?, ?, ?)",
                (token_hash, user_id, source, expires_at, utc_now()),
            )

    def token_owner(self, token_hash: str, *, now: int) -> dict | None:
        """The id and roles of the active user a live token belongs to, or None. Only what a
        Requester holds is read: this runs on every authenticated request.

        A found owner is remembered while no write has been committed since (the write mark
        is the one read before the lookup), the token has not expired, and for at most
        TOKEN_MEMO_SECONDS: the token's statement was half of a GET's statements, and each
        statement hands the GIL to another thread. So a deactivation, a secret reset or a
        token's removal ends it at once, here or in any other process."""
        mark = self.write_mark.read()
        held = self._token_memo.get(token_hash)
        if held is not None and held[0] == mark and now < held[1] and time.monotonic() < held[2]:
            return {"id": held[3], "roles": list(held[4])}
        row = self._one(
            """SELECT u.id, u.roles, t.expires_at FROM tokens t JOIN users u ON u.id = t.user_id
               WHERE t.token_hash = ? AND t.expires_at > ? AND u.active > 0
               AND u.api_secret_enc IS NOT NULL""",
            (token_hash, now),
        )
        if row is None:
            return None
        roles = tuple(json.loads(row["roles"]))
        if self.write_mark.usable:
            if len(self._token_memo) >= _TOKEN_MEMO_MAX:
                self._token_memo.clear()
            self._token_memo[token_hash] = (mark, row["expires_at"], time.monotonic() + TOKEN_MEMO_SECONDS,
                                            row["id"], roles)
        return {"id": row["id"], "roles": list(roles)}

    def purge_expired_tokens(self, *, now: int) -> int:
        with self.write() as conn:
            return conn.execute("DELETE FROM tokens WHERE expires_at <= ?", (now,)).rowcount

    # -- portal sessions (api/portal/, controller/portal_sessions.py) --------
    def insert_portal_session(self, *, id_hash: str, user_id: str, now: int, purge_before: int,
                              started_before: int) -> None:
        """A new session; sessions idle since purge_before or started before started_before go."""
        with self.write() as conn:
            conn.execute("DELETE FROM portal_sessions WHERE seen_at < ? OR created_at < ?",
                         (purge_before, started_before))
            conn.execute("INSERT INTO portal_sessions (id_hash, user_id, created_at, seen_at) VALUES (?, ?, ?, ?)",
                         (id_hash, user_id, now, now))

    def portal_session(self, id_hash: str) -> dict | None:
        """The session and its user's id, roles and email, while the user is active and may use
        the APIs (a null API secret shuts it out, as for tokens)."""
        row = self._one(
            """SELECT s.id_hash, s.user_id, s.created_at, s.seen_at, u.roles, u.email
               FROM portal_sessions s JOIN users u ON u.id = s.user_id
               WHERE s.id_hash = ? AND u.active > 0 AND u.api_secret_enc IS NOT NULL""",
            (id_hash,),
        )
        if row is not None:
            row["roles"] = json.loads(row["roles"])
        return row

    def touch_portal_session(self, id_hash: str, now: int) -> None:
        with self.write() as conn:
            conn.execute("UPDATE portal_sessions SET seen_at = ? WHERE id_hash = ?", (now, id_hash))

    def delete_portal_session(self, id_hash: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM portal_sessions WHERE id_hash = ?", (id_hash,))

    def set_portal_reveal(self, id_hash: str, *, secret_hash: str, until: int) -> None:
        with self.write() as conn:
            conn.execute("UPDATE portal_sessions SET reveal_hash = ?, reveal_until = ? WHERE id_hash = ?",
                         (secret_hash, until, id_hash))

    def take_portal_reveal(self, id_hash: str) -> dict | None:
        """The session's show-once window ({"reveal_hash", "reveal_until"}), cleared in the same
        transaction: only one read ever gets it. None when there was none."""
        with self.write() as conn:
            row = conn.execute(
                "SELECT reveal_hash, reveal_until FROM portal_sessions WHERE id_hash = ? AND reveal_hash IS NOT NULL",
                (id_hash,)).fetchone()
            if row is None:
                return None
            conn.execute("UPDATE portal_sessions SET reveal_hash = NULL, reveal_until = NULL WHERE id_hash = ?",
                         (id_hash,))
        return dict(row)

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
                cur = conn.execute(_INSERT_ACCOUNT, account)
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

    # -- visibility ---------------------------------------------------------
    # A resource is visible to its owner and to the owner's owner; a superuser
    # passes visible_to=None and sees everything.
    @staticmethod
    def _where(visible_to: str | None, **equal) -> tuple[str, list]:
        """A WHERE clause: owner_id visible to visible_to (None: all), and column = value for each
        filter that is not None."""
        clauses, params = ["1"], []
        if visible_to is not None and equal.get("id") is not None:
            # One row by id: only that row's owner is tested (10 us). The form below made
            # SQLite build the list of users first: 1.3 ms with 10,000 users.
            clauses.append("(owner_id = ? OR owner_id IN (SELECT id FROM users WHERE owner_userid = ?))")
            params += [visible_to, visible_to]
        elif visible_to is not None:
            clauses.append("owner_id IN (SELECT id FROM users WHERE id = ? OR owner_userid = ?)")
            params += [visible_to, visible_to]
        for column, value in equal.items():
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(clauses), params

    def owner_owner(self, owner_id: str) -> str | None:
        row = self._one("SELECT owner_userid FROM users WHERE id = ?", (owner_id,))
        return row["owner_userid"] if row else None

    # -- images and flavors -----------------------------------------------
    @staticmethod
    def _refuse_active_namesake(conn: sqlite3.Connection, name: str, image_id: str) -> None:
        """Names of active images are unique: a name then picks one bootable image
        (common.client.image_names). Checked in the write's transaction, so two adds cannot
        both pass."""
        other = conn.execute("SELECT id FROM images WHERE active = 1 AND name = ? AND id != ?",
                             (name, image_id)).fetchone()
        if other is not None:
            raise Conflict(f"an active image is already named {name!r} ({other[0]}): names of active images "
                           "are unique; deactivate that one or choose another name")

    def insert_image(self, image: dict) -> None:
        with self.write() as conn:
            if image.get("active", 1):
                self._refuse_active_namesake(conn, image["name"], image["id"])
            self.db["images"].insert(image)

    def active_image_named(self, name: str) -> dict | None:
        return self._one("SELECT * FROM images WHERE active = 1 AND name = ?", (name,))

    def get_image(self, image_id: str) -> dict | None:
        return self._one("SELECT * FROM images WHERE id = ?", (image_id,))

    def _usable(self, table: str, access: str, key: str, order: str, usable_by: str | None,
                item_id: object) -> list[dict]:
        """Rows of `table` (images or flavors): all of them (usable_by None) or the public ones
        plus those `access` grants to usable_by; only item_id's when given."""
        where, params = ["1"], []
        if usable_by is not None:
            where.append(f"(public = 1 OR id IN (SELECT {key} FROM {access} WHERE user_id = ?))")
            params.append(usable_by)
        if item_id is not None:
            where.append("id = ?")
            params.append(item_id)
        return self._all(f"SELECT * FROM {table} WHERE {' AND '.join(where)} ORDER BY {order}", params)

    def list_images(self, *, usable_by: str | None = None, image_id: str | None = None) -> list[dict]:
        """All images (usable_by None) or the public ones plus those granted to usable_by."""
        return self._usable("images", "image_access", "image_id", "creation_date, id", usable_by, image_id)

    def update_image(self, image_id: str, changes: dict) -> None:
        with self.write() as conn:
            now = conn.execute("SELECT name, active FROM images WHERE id = ?", (image_id,)).fetchone()
            if now is not None and changes.get("active", now["active"]):
                self._refuse_active_namesake(conn, changes.get("name", now["name"]), image_id)
            self.db["images"].update(image_id, changes)

    def delete_image(self, image_id: str) -> None:
        """Remove an image's row (its grants go with it); refused while an instance row names it."""
        try:
            with self.write() as conn:
                conn.execute("DELETE FROM images WHERE id = ?", (image_id,))
        except sqlite3.IntegrityError:
            raise Conflict(f"server-image {image_id} is used by server-instances: delete them first "
                           "(an evacuation rebuilds from it)") from None

    def update_flavor(self, flavor_id: int, changes: dict) -> None:
        try:
            with self.write():
                self.db["flavors"].update(flavor_id, changes)
        except sqlite3.IntegrityError:
            raise Conflict(f"a flavor named {changes.get('name')!r} exists") from None

    def delete_flavor(self, flavor_id: int) -> None:
        """Remove a flavor's row (its grants go with it); refused while an instance row names it."""
        try:
            with self.write() as conn:
                conn.execute("DELETE FROM flavors WHERE id = ?", (flavor_id,))
        except sqlite3.IntegrityError:
            raise Conflict(f"server-flavor {flavor_id} is used by server-instances: delete them first") from None

    def grant_image(self, image_id: str, user_id: str) -> None:
        with self.write() as conn:
            conn.execute("INSERT OR IGNORE INTO image_access (image_id, user_id) VALUES (?, ?)", (image_id, user_id))

    def insert_flavor(self, flavor: dict) -> dict:
        flavor = {"public": 1, **flavor}
        try:
            with self.write() as conn:
                cur = conn.execute(
                    "INSERT INTO flavors (name, memory, disk, vcpu, public) VALUES (:name, :memory, :disk, :vcpu, :public)",
                    flavor,
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a flavor named {flavor['name']!r} exists") from None
        return dict(flavor, id=cur.lastrowid)

    def get_flavor(self, flavor_id: int) -> dict | None:
        return self._one("SELECT * FROM flavors WHERE id = ?", (flavor_id,))

    def list_flavors(self, *, usable_by: str | None = None, flavor_id: int | None = None) -> list[dict]:
        """All flavors (usable_by None) or the public ones plus those granted to usable_by."""
        return self._usable("flavors", "flavor_access", "flavor_id", "id", usable_by, flavor_id)

    def grant_flavor(self, flavor_id: int, user_id: str) -> None:
        with self.write() as conn:
            conn.execute("INSERT OR IGNORE INTO flavor_access (flavor_id, user_id) VALUES (?, ?)",
                         (flavor_id, user_id))

    # -- accounts by user -----------------------------------------------------
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

    # -- instances --------------------------------------------------------------
    def insert_instance(self, instance: dict, account_uuids: list[str], *, allocate=None, admit=None,
                        place=None) -> dict:
        """Insert the instance and its users; return the row as stored.

        admit(overrides=, owned=, allocated=) may refuse it (by raising) inside the
        same write transaction, given the owner's limit overrides, what the owner
        holds (instances, vcpus, memory_mb) and what every live instance
        allocates (vcpus, memory_mb), so concurrent creates never pass a limit together.

        allocate(used) -> {column: value} picks the address columns inside the same
        write transaction, given what live instances use (keys private_ip,
        public_ip, mac, hostname: sets), so concurrent creates never share one.

        place(hosts) -> name picks the instance's host inside the same write
        transaction, given every host with what its live instances allocate
        (list_hosts rows), so concurrent creates never over-commit a host.
        """
        with self.write() as conn:
            if admit is not None:
                owner = instance["owner_id"]
                admit(overrides=self._limit_overrides(conn, owner), owned=self._instance_usage(conn, owner),
                      allocated=self._instance_usage(conn))
            if place is not None:
                instance = dict(instance, host=place(self._hosts(conn)))
            if allocate is not None:
                instance = dict(instance, **allocate(_used_addresses(conn)))
            row = {"mac": None, "public_mac": None, "intent": "creating", "host": DEFAULT_HOST, **instance}
            conn.execute(_INSERT_INSTANCE, row)
            conn.executemany(_INSERT_INSTANCE_USER, [(instance["id"], u) for u in account_uuids])
        return row

    def list_instances(self, *, visible_to: str | None, owner_id: str | None = None,
                       instance_id: str | None = None, instance_ids: list[str] | None = None,
                       with_intents: bool = False, host: str | None = None) -> list[dict]:
        """Instances in creation order; those being created or deleted only with_intents (reconcile)."""
        where, params = self._where(visible_to, owner_id=owner_id, id=instance_id, host=host)
        if not with_intents:
            where += " AND intent IS NULL"
        if instance_ids is not None:
            if not instance_ids:
                return []
            where += f" AND id IN ({','.join('?' * len(instance_ids))})"
            params += list(instance_ids)
        return [_with_users(r) for r in
                self._all(f"SELECT * FROM instances WHERE {where} ORDER BY creation_date, id", params)]

    def instance_status_counts(self, *, visible_to: str | None, owner_id: str | None = None) -> dict[str, int]:
        """list_instances' rows counted by their stored status, in one statement (the portal's
        overview counts; no row is read into Python)."""
        where, params = self._where(visible_to, owner_id=owner_id)
        return {r["status"]: r["n"] for r in self._all(
            f"SELECT status, COUNT(*) AS n FROM instances WHERE {where} AND intent IS NULL GROUP BY status", params)}

    def get_instance(self, instance_id: str, *, visible_to: str | None) -> dict | None:
        """list_instances(instance_id=...)'s row (a GET of one instance: the most frequent request)."""
        where, params = self._where(visible_to, id=instance_id)
        row = self._one(f"SELECT * FROM instances WHERE {where} AND intent IS NULL", params)
        return _with_users(row) if row is not None else None

    def get_instance_json(self, instance_id: str, *, visible_to: str | None,
                          status: str | None = None) -> dict | None:
        """get_instance's id, host and stored status, with `json`: its server-instance object encoded
        as iter_instance_json encodes it, with the stored status or the status given."""
        where, params = self._where(visible_to, id=instance_id)
        obj = _INSTANCE_JSON_STORED if status is None else _INSTANCE_JSON_GIVEN
        sql = f"SELECT id, host, status, {obj} AS json FROM instances WHERE {where} AND intent IS NULL"
        if status is not None:
            return self._one(sql, [status, *params])
        # The stored form is remembered until the next committed write (controller/read_memo.py).
        mark = self.write_mark.read() if self.write_mark.usable else None
        key = (instance_id, visible_to)
        held = self._instance_memo.get(key, mark) if mark is not None else None
        if held is not None:
            return dict(held)
        row = self._one(sql, params)
        if row is not None and mark is not None:
            self._instance_memo.put(key, mark, dict(row))
        return row

    def iter_instance_json(self, *, visible_to: str | None, owner_id: str | None = None,
                           error_hosts: Iterable[str] = (), per_chunk: int = 200) -> Iterator[str]:
        """list_instances' rows (without intents) as server-instance objects
        encoded by SQLite: chunks of up to per_chunk JSON objects joined by commas, in
        creation order. Each chunk is read by its own statements, ended before it is
        yielded: a client that stops reading holds no transaction or cursor, in any thread.
        A row created or deleted while a long list is sent may be in it or not; none is
        listed twice (a chunk starts after the creation date and id the last one ended at).
        The stored status is given (status_sync brings it to the hosts' view first), or
        "error" for rows on error_hosts. SQLite builds a chunk in one step, without Python's
        GIL; rows are never Python objects."""
        where, params = self._where(visible_to, owner_id=owner_id)
        where += " AND intent IS NULL"
        error_hosts = list(error_hosts)
        status = "status"
        if error_hosts:
            status = f"CASE WHEN host IN ({','.join('?' * len(error_hosts))}) THEN 'error' ELSE status END"
        obj = _INSTANCE_JSON.format(status=status)

        def chunks() -> Iterator[str]:
            after, after_params = "", []
            # The first chunk in one statement: up to per_chunk objects and how many there
            # are. A list shorter than a chunk (most of them) is then done; the two
            # statements below cost a GET's worth more (docs/performance.md). Such a list
            # is remembered until the next committed write (controller/read_memo.py).
            mark = self.write_mark.read() if self.write_mark.usable else None
            key = ("list", visible_to, owner_id, tuple(error_hosts), per_chunk)
            held = self._list_memo.get(key, mark) if mark is not None else None
            if held is not None:
                count, text = held
            else:
                count, text = self.conn.execute(
                    f"""SELECT count(*), group_concat(obj, ',') FROM (SELECT {obj} AS obj FROM instances
                        WHERE {where} ORDER BY creation_date, id LIMIT ?)""",
                    [*error_hosts, *params, per_chunk]).fetchone()
                if count < per_chunk and mark is not None:
                    self._list_memo.put(key, mark, (count, text))
            if count < per_chunk:
                if text:
                    yield text
                return
            while True:
                # The chunk ends at its per_chunk-th row (by the creation-order index); the
                # next starts after it. Each statement is done before its chunk is yielded:
                # nothing of the database is held between chunks.
                end = self.conn.execute(
                    f"""SELECT creation_date, id FROM instances WHERE {where}{after}
                        ORDER BY creation_date, id LIMIT 1 OFFSET ?""",
                    [*params, *after_params, per_chunk - 1]).fetchone()
                upto, upto_params = ("", []) if end is None else (" AND (creation_date, id) <= (?, ?)", list(end))
                # The objects are concatenated in the order the subquery gives them.
                text = self.conn.execute(
                    f"""SELECT group_concat(obj, ',') FROM (SELECT {obj} AS obj FROM instances
                        WHERE {where}{after}{upto} ORDER BY creation_date, id)""",
                    [*error_hosts, *params, *after_params, *upto_params]).fetchone()[0]
                if text:
                    yield text
                if end is None:
                    return
                after, after_params = " AND (creation_date, id) > (?, ?)", list(end)

        return chunks()

    def sync_host_statuses(self, host: str, statuses: dict[str, str]) -> None:
        """The stored status of each live instance of the host set to statuses (one missing
        from it: "error", the host has no domain for it); only differing rows are written."""
        stored = self.conn.execute(
            "SELECT id, status FROM instances WHERE host = ? AND intent IS NULL", (host,)).fetchall()
        changed = {i: statuses.get(i, "error") for i, status in stored if statuses.get(i, "error") != status}
        if changed:
            self.set_live_instance_statuses(changed, host=host)

    def set_live_instance_statuses(self, statuses: dict[str, str], *, host: str) -> None:
        """Statuses of the host's live instances (those being created or deleted are left
        to the operation under way)."""
        with self.write() as conn:
            conn.executemany(
                "UPDATE instances SET status = ? WHERE id = ? AND host = ? AND intent IS NULL AND status != ?",
                [(status, instance_id, host, status) for instance_id, status in statuses.items()])

    def instance_hosts(self, *, visible_to: str | None, owner_id: str | None = None) -> list[str]:
        """The hosts holding live instances that iter_instance_json with the same filters gives."""
        # Remembered until the next committed write, as the lists (controller/read_memo.py).
        mark = self.write_mark.read() if self.write_mark.usable else None
        key = ("hosts", visible_to, owner_id)
        held = self._list_memo.get(key, mark) if mark is not None else None
        if held is not None:
            return list(held)
        where, params = self._where(visible_to, owner_id=owner_id)
        hosts = [r[0] for r in self.conn.execute(
            f"SELECT DISTINCT host FROM instances WHERE {where} AND intent IS NULL ORDER BY host", params)]
        if mark is not None:
            self._list_memo.put(key, mark, tuple(hosts))
        return hosts

    def instance_users(self, instance_ids: list[str]) -> dict[str, list[str]]:
        if not instance_ids:
            return {}
        marks = ",".join("?" * len(instance_ids))
        out: dict[str, list[str]] = {}
        for r in self._all(
            f"SELECT instance_id, account_uuid FROM instance_users WHERE instance_id IN ({marks}) ORDER BY rowid",
            instance_ids,
        ):
            out.setdefault(r["instance_id"], []).append(r["account_uuid"])
        return out

    def set_instance_users(self, instance_id: str, account_uuids: list[str]) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM instance_users WHERE instance_id = ?", (instance_id,))
            conn.executemany(_INSERT_INSTANCE_USER, [(instance_id, u) for u in account_uuids])

    def set_instance_status(self, instance_id: str, status: str) -> None:
        with self.write() as conn:
            conn.execute("UPDATE instances SET status = ? WHERE id = ?", (status, instance_id))

    def set_instance_statuses(self, statuses: dict[str, str]) -> None:
        with self.write() as conn:
            conn.executemany("UPDATE instances SET status = ? WHERE id = ?",
                             [(status, instance_id) for instance_id, status in statuses.items()])

    def set_console_since(self, instance_id: str, mark: str | None) -> None:
        """The instance's console answers the output after `mark` (JSON; None: all of its run)."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET console_since = ? WHERE id = ?", (mark, instance_id))

    def delete_instance(self, instance_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM instances WHERE id = ?", (instance_id,))

    def instances_with_account(self, account_uuid: str) -> list[str]:
        return [
            r["instance_id"]
            for r in self._all("SELECT instance_id FROM instance_users WHERE account_uuid = ?", (account_uuid,))
        ]

    def all_instances(self) -> list[dict]:
        return self.list_instances(visible_to=None, with_intents=True)

    def find_instance(self, instance_id: str) -> dict | None:
        """The instance's row whatever its intent (being created, deleted, moved), or None."""
        return next(iter(self.list_instances(visible_to=None, instance_id=instance_id, with_intents=True)), None)

    def set_instance_intent(self, instance_id: str, intent: str | None, *, expect: str | None = None) -> bool:
        """Set the instance's intent if it is `expect` now; False (nothing changed) otherwise."""
        with self.write() as conn:
            cur = conn.execute("UPDATE instances SET intent = ? WHERE id = ? AND intent IS ?",
                               (intent, instance_id, expect))
        return cur.rowcount == 1

    # -- hypervisor hosts (issue 10) --------------------------------------------------
    _HOSTS_SQL = """SELECT h.*, COUNT(i.id) AS instances, COALESCE(SUM(f.vcpu), 0) AS allocated_vcpus,
                           COALESCE(SUM(f.memory), 0) AS allocated_memory_mb
                    FROM hosts h LEFT JOIN instances i ON i.host = h.name LEFT JOIN flavors f ON f.id = i.flavor_id
                    {where} GROUP BY h.name ORDER BY h.name"""

    @classmethod
    def _hosts(cls, conn: sqlite3.Connection, name: str | None = None) -> list[dict]:
        """Hosts with what their live instances (every row, being created or deleted too) allocate."""
        sql = cls._HOSTS_SQL.format(where="WHERE h.name = ?" if name is not None else "")
        hosts = [dict(r) for r in conn.execute(sql, () if name is None else (name,)).fetchall()]
        # An instance moving to a host (drain) counts there too until its row names it.
        for m in conn.execute(_MOVES_IN_FLIGHT).fetchall():
            for h in hosts:
                if h["name"] == m["to_host"]:
                    h["allocated_vcpus"] += m["vcpu"]
                    h["allocated_memory_mb"] += m["memory"]
        return hosts

    def list_hosts(self) -> list[dict]:
        return self._hosts(self.conn)

    def get_host(self, name: str) -> dict | None:
        """A host's record alone: the sums of host_with_allocation() scan its instances."""
        return self._one("SELECT * FROM hosts WHERE name = ?", (name,))

    def host_with_allocation(self, name: str) -> dict | None:
        """A host's record with what its instances allocate, as list_hosts() gives it."""
        return next(iter(self._hosts(self.conn, name)), None)

    def insert_host(self, host: dict) -> None:
        """Record a host; Conflict when its name exists or another record reaches the same
        libvirt (`host_uuid` or `pool_uuid`, checked in the insert's transaction)."""
        now = utc_now()
        values = {"enabled": 1, "vcpus": None, "memory_mb": None, "capacity_read_at": None, "host_uuid": None,
                  "pool_uuid": None, **host, "now": now}
        try:
            with self.write() as conn:
                self._refuse_same_libvirt(conn, values)
                conn.execute(
                    """INSERT INTO hosts (name, uri, storage_pool, network, enabled, vcpus, memory_mb,
                       capacity_read_at, host_uuid, pool_uuid, created_at_utc, updated_at_utc) VALUES (:name,
                       :uri, :storage_pool, :network, :enabled, :vcpus, :memory_mb, :capacity_read_at,
                       :host_uuid, :pool_uuid, :now, :now)""",
                    values,
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"a hypervisor host named {host['name']!r} exists") from None

    @staticmethod
    def _refuse_same_libvirt(conn: sqlite3.Connection, host: dict) -> None:
        other = conn.execute(
            "SELECT name, uri FROM hosts WHERE name != :name AND ((:host_uuid IS NOT NULL AND host_uuid = :host_uuid)"
            " OR (:pool_uuid IS NOT NULL AND pool_uuid = :pool_uuid))", host).fetchone()
        if other is not None:
            raise Conflict(f"another record, host {other['name']} ({other['uri']}), reaches the same libvirt "
                           f"(host UUID {host['host_uuid'] or 'none'}, storage pool UUID {host['pool_uuid']})")

    def set_host_identity(self, name: str, *, host_uuid: str | None, pool_uuid: str) -> None:
        """Record which libvirt host `name` reaches; Conflict when another record reaches it."""
        values = {"name": name, "host_uuid": host_uuid, "pool_uuid": pool_uuid}
        try:
            with self.write() as conn:
                self._refuse_same_libvirt(conn, values)
                conn.execute("UPDATE hosts SET host_uuid = :host_uuid, pool_uuid = :pool_uuid WHERE name = :name",
                             values)
        except sqlite3.IntegrityError:  # another process recorded it meanwhile
            raise Conflict(f"another record reaches the same libvirt as host {name}") from None

    def upsert_config_host(self, host: dict, *, legacy_name: str = DEFAULT_HOST) -> None:
        """The config's host: made, or its uri, pool and network set (enabled and capacity stay).
        Instances recorded on `legacy_name` while no such host exists move to it (rows made
        before hosts existed got that name)."""
        now = utc_now()
        with self.write() as conn:
            conn.execute(
                """INSERT INTO hosts (name, uri, storage_pool, network, enabled, created_at_utc, updated_at_utc)
                   VALUES (:name, :uri, :storage_pool, :network, 1, :now, :now)
                   ON CONFLICT (name) DO UPDATE SET uri = excluded.uri, storage_pool = excluded.storage_pool,
                   network = excluded.network, updated_at_utc = excluded.updated_at_utc
                   WHERE hosts.uri <> excluded.uri OR hosts.storage_pool <> excluded.storage_pool
                      OR hosts.network <> excluded.network""",
                dict(host, now=now),
            )
            if host["name"] != legacy_name:
                conn.execute("UPDATE instances SET host = ? WHERE host = ? AND NOT EXISTS "
                             "(SELECT 1 FROM hosts WHERE name = ?)", (host["name"], legacy_name, legacy_name))

    def set_host_enabled(self, name: str, enabled: bool) -> bool:
        with self.write() as conn:
            cur = conn.execute("UPDATE hosts SET enabled = ?, updated_at_utc = ? WHERE name = ?",
                               (int(enabled), utc_now(), name))
        return cur.rowcount == 1

    def set_host_capacity(self, name: str, *, vcpus: int, memory_mb: int, read_at: int) -> None:
        with self.write() as conn:
            conn.execute("UPDATE hosts SET vcpus = ?, memory_mb = ?, capacity_read_at = ? WHERE name = ?",
                         (vcpus, memory_mb, read_at, name))

    def delete_host(self, name: str) -> None:
        """Remove a host that holds no instance (Conflict otherwise; checked in the same transaction)."""
        with self.write() as conn:
            held = conn.execute("SELECT COUNT(*) FROM instances WHERE host = ?", (name,)).fetchone()[0]
            if held:
                raise Conflict(f"hypervisor host {name} holds {held} instance(s); delete or move them first")
            # A move or evacuation not finished names it as where a copy of a disk is or goes.
            named = conn.execute(
                "SELECT 'move', instance_id, from_host, to_host FROM moves WHERE from_host = ?1 OR to_host = ?1 "
                "UNION ALL SELECT 'evacuation', instance_id, from_host, to_host FROM evacuations "
                "WHERE from_host = ?1 OR to_host = ?1 ORDER BY 2", (name,)).fetchall()
            if named:
                what = ", ".join(f"the {r[0]} of instance {r[1]} from host {r[2]} to host {r[3]}" for r in named)
                raise Conflict(f"hypervisor host {name} is named by {what}, not finished; finish it (drain or "
                               "evacuate again, `reconcile --fix`) or abandon it (`host drain HOST --abandon`) first")
            conn.execute("DELETE FROM hosts WHERE name = ?", (name,))

    # -- evacuations (cloud-agent host evacuate) --------------------------------------
    def begin_evacuation(self, instance_id: str, from_host: str, place) -> str | None:
        """Point a live instance of `from_host` at the host `place(hosts)` picks (hosts with
        their allocations, as list_hosts gives them) and record the evacuation, in one
        transaction: the new host's allocation counts it at once. None (nothing changed)
        when the instance is no longer a live one of `from_host`."""
        with self.write() as conn:
            row = conn.execute("SELECT host, intent FROM instances WHERE id = ?", (instance_id,)).fetchone()
            if row is None or row["host"] != from_host or row["intent"] is not None:
                return None
            # A move off the dead host not committed is moot: the copy it was making is not checked.
            # The guest it shut down is rebuilt in the power state it had before.
            conn.execute("UPDATE instances SET status = 'running' WHERE id = ?1 AND EXISTS (SELECT 1 FROM moves "
                         "WHERE instance_id = ?1 AND from_host = ?2 AND was_running = 1)", (instance_id, from_host))
            conn.execute("DELETE FROM moves WHERE instance_id = ? AND from_host = ?", (instance_id, from_host))
            target = place(self._hosts(conn))
            conn.execute("UPDATE instances SET host = ? WHERE id = ?", (target, instance_id))
            conn.execute("INSERT INTO evacuations (instance_id, from_host, to_host, started_at_utc) "
                         "VALUES (?, ?, ?, ?)", (instance_id, from_host, target, utc_now()))
        return target

    def list_evacuations(self, *, from_host: str | None = None) -> list[dict]:
        """Evacuations not finished, oldest first."""
        where, params = ("WHERE from_host = ?", (from_host,)) if from_host is not None else ("", ())
        return self._all(f"SELECT * FROM evacuations {where} ORDER BY started_at_utc, instance_id", params)

    def finish_evacuation(self, instance_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM evacuations WHERE instance_id = ?", (instance_id,))

    def undo_evacuation(self, instance_id: str) -> None:
        """The rebuild failed and nothing of it remains: the row names its old host again."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET host = (SELECT from_host FROM evacuations WHERE instance_id = ?) "
                         "WHERE id = ? AND EXISTS (SELECT 1 FROM evacuations WHERE instance_id = ?)",
                         (instance_id, instance_id, instance_id))
            conn.execute("DELETE FROM evacuations WHERE instance_id = ?", (instance_id,))

    # -- moves (cloud-agent host drain) ------------------------------------------------
    def begin_move(self, instance_id: str, from_host: str, place, *, was_running: bool) -> str | None:
        """Record the move of a live instance of `from_host` to the host `place(hosts)` picks
        (hosts with their allocations, as list_hosts gives them), in one transaction: the
        target's allocation counts it at once. The row still names `from_host`. None (nothing
        changed) when the instance is no longer a live one of `from_host`."""
        with self.write() as conn:
            row = conn.execute("SELECT host, intent FROM instances WHERE id = ?", (instance_id,)).fetchone()
            if row is None or row["host"] != from_host or row["intent"] is not None:
                return None
            target = place(self._hosts(conn))
            conn.execute("INSERT INTO moves (instance_id, from_host, to_host, was_running, started_at_utc) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (instance_id, from_host, target, int(was_running), utc_now()))
        return target

    def list_moves(self, *, from_host: str | None = None, instance_id: str | None = None) -> list[dict]:
        """Moves not finished, oldest first."""
        where, params = "WHERE 1", []
        if from_host is not None:
            where, params = where + " AND from_host = ?", params + [from_host]
        if instance_id is not None:
            where, params = where + " AND instance_id = ?", params + [instance_id]
        return self._all(f"SELECT * FROM moves {where} ORDER BY started_at_utc, instance_id", tuple(params))

    def commit_move(self, instance_id: str) -> None:
        """The target holds the checked copy: the row names it (shut off there; its console
        starts afresh with the run there)."""
        with self.write() as conn:
            conn.execute("UPDATE instances SET host = (SELECT to_host FROM moves WHERE instance_id = ?), "
                         "status = 'shutoff', console_since = NULL "
                         "WHERE id = ? AND EXISTS (SELECT 1 FROM moves WHERE instance_id = ?)",
                         (instance_id, instance_id, instance_id))

    def abandon_move(self, instance_id: str) -> dict | None:
        """The move is given up and the instance stays on, or returns to, its source (whose copy
        of the disk was never removed): the row names the source again (shut off there when it
        had been committed), and the record goes, in one transaction. The record, or None."""
        with self.write() as conn:
            move = conn.execute("SELECT * FROM moves WHERE instance_id = ?", (instance_id,)).fetchone()
            if move is None:
                return None
            conn.execute("UPDATE instances SET host = ?, status = 'shutoff', console_since = NULL "
                         "WHERE id = ? AND host = ?", (move["from_host"], instance_id, move["to_host"]))
            conn.execute("DELETE FROM moves WHERE instance_id = ?", (instance_id,))
        return dict(move)

    def end_move(self, instance_id: str) -> None:
        """The move is finished, or undone before its commit (the row names the source)."""
        with self.write() as conn:
            conn.execute("DELETE FROM moves WHERE instance_id = ?", (instance_id,))

    # -- instance claims (controller/instance_claims.py) -------------------------------
    def take_instance_claim(self, claim: dict, *, replacing: str | None = None) -> tuple[bool, dict | None]:
        """Compare-and-set of the instance's claim: made when the instance has none, or (with
        `replacing`, a dead holder's token) put in its place only while that claim is still
        there. (True, None) when taken; (False, the claim that holds it); (False, None) when
        the instance does not exist. A replaced claim's refresh_wanted is kept."""
        with self.write() as conn:
            if replacing is None:
                cur = conn.execute(
                    """INSERT INTO instance_claims (instance_id, operation, token, pid, proc_start, boot_id, machine,
                       claimed_at_utc) SELECT :instance_id, :operation, :token, :pid, :proc_start, :boot_id, :machine,
                       :claimed_at_utc FROM instances WHERE id = :instance_id
                       ON CONFLICT (instance_id) DO NOTHING""", claim)
            else:
                cur = conn.execute(
                    """UPDATE instance_claims SET operation = :operation, token = :token, pid = :pid,
                       proc_start = :proc_start, boot_id = :boot_id, machine = :machine,
                       claimed_at_utc = :claimed_at_utc WHERE instance_id = :instance_id AND token = :replacing""",
                    dict(claim, replacing=replacing))
            if cur.rowcount == 1:
                return True, None
            held = conn.execute("SELECT * FROM instance_claims WHERE instance_id = ?",
                                (claim["instance_id"],)).fetchone()
        return False, dict(held) if held is not None else None

    def release_instance_claim(self, instance_id: str, token: str) -> bool:
        """Drop the claim with this token unless a guest refresh was asked for meanwhile: True
        when it is gone; False when one was (the request is cleared: the holder refreshes the
        guest, then releases again)."""
        with self.write() as conn:
            if conn.execute("DELETE FROM instance_claims WHERE instance_id = ? AND token = ? AND refresh_wanted = 0",
                            (instance_id, token)).rowcount:
                return True
            cur = conn.execute("UPDATE instance_claims SET refresh_wanted = 0 WHERE instance_id = ? AND token = ?",
                               (instance_id, token))
        return cur.rowcount == 0

    def drop_instance_claim(self, instance_id: str, token: str) -> bool:
        """Remove the claim with this token whatever it asks (a dead holder's, or one let go
        after its refreshes failed); False when it is no longer that claim."""
        with self.write() as conn:
            cur = conn.execute("DELETE FROM instance_claims WHERE instance_id = ? AND token = ?", (instance_id, token))
        return cur.rowcount == 1

    def want_guest_refresh(self, instance_id: str) -> bool:
        """Ask the holder of the instance's claim to rebuild its guest before it lets go;
        False when no claim is held (the caller refreshes it itself)."""
        with self.write() as conn:
            cur = conn.execute("UPDATE instance_claims SET refresh_wanted = 1 WHERE instance_id = ?", (instance_id,))
        return cur.rowcount == 1

    def list_instance_claims(self) -> list[dict]:
        return self._all("SELECT * FROM instance_claims ORDER BY claimed_at_utc, instance_id")

    # -- volumes ------------------------------------------------------------------
    def insert_volume(self, volume: dict) -> None:
        try:
            with self.write() as conn:
                conn.execute(_INSERT_VOLUME, {"state": "creating", **volume})
        except sqlite3.IntegrityError as e:
            if "volumes.owner_id" in str(e):
                raise Conflict("this user already has a storage volume (one per user)") from None
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

    def set_volume_size(self, volume_id: str, size_gb: int) -> None:
        with self.write() as conn:
            conn.execute("UPDATE volumes SET size_gb = ? WHERE id = ?", (size_gb, volume_id))

    def delete_volume(self, volume_id: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM volumes WHERE id = ?", (volume_id,))

    # -- groups -------------------------------------------------------------------
    def insert_group(self, group: dict, members: list[str], *, admit=None) -> None:
        """Insert a group and its members; admit(overrides=, owned=) may refuse it inside the
        transaction, given the owner's limit overrides and how many groups it owns."""
        try:
            with self.write() as conn:
                if admit is not None:
                    owner = group["owner_id"]
                    admit(overrides=self._limit_overrides(conn, owner),
                          owned=conn.execute("SELECT COUNT(*) FROM groups WHERE owner_id = ?", (owner,)).fetchone()[0])
                conn.execute(_INSERT_GROUP, {"state": "creating", **group})
                self._write_members(conn, group["id"], members)
        except sqlite3.IntegrityError as e:
            if "groups.name" in str(e):
                raise Conflict(f"group {group['name']} exists") from None
            raise

    @staticmethod
    def _write_members(conn, group_id: str, members: list[str]) -> None:
        conn.execute("DELETE FROM group_members WHERE group_id = ?", (group_id,))
        conn.executemany(_INSERT_MEMBER, [(group_id, m, i) for i, m in enumerate(members)])

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

    def instances_with_accounts(self, account_uuids: list[str]) -> list[str]:
        """Ids of the instances any of these accounts can access."""
        if not account_uuids:
            return []
        marks = ",".join("?" * len(account_uuids))
        return [
            r["instance_id"]
            for r in self._all(
                f"SELECT DISTINCT instance_id FROM instance_users WHERE account_uuid IN ({marks}) ORDER BY instance_id",
                account_uuids,
            )
        ]

    def groups_with_member(self, username: str) -> list[dict]:
        return self._all(
            "SELECT g.* FROM groups g JOIN group_members m ON m.group_id = g.id WHERE m.username = ? AND g.state = 'ready'",
            (username,)
        )

    # -- limits -------------------------------------------------------------------
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

    # -- audit --------------------------------------------------------------------
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

    # -- instance history (controller/history.py) -----------------------------------------
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

    # -- bulk load (agent/sandbox_load.py) -------------------------------------------
    def insert_loaded(self, *, users: list[dict], accounts: list[dict], volumes: list[dict], groups: list[dict],
                      members: list[tuple[str, str, int]], instances: list[dict],
                      instance_users: list[tuple[str, str]]) -> None:
        """The rows of a bulk load, in one transaction: all of them or none. The caller made
        them valid; the schema's UNIQUE and foreign keys still refuse a clash (IntegrityError)."""
        with self.write() as conn:
            conn.executemany(_INSERT_USER, [dict(u, roles=json.dumps(sorted(u["roles"]))) for u in users])
            conn.executemany(_INSERT_ACCOUNT, accounts)
            conn.executemany(_INSERT_VOLUME, [dict(v, state="ready") for v in volumes])
            conn.executemany(_INSERT_GROUP, [dict(g, state="ready") for g in groups])
            conn.executemany(_INSERT_MEMBER, members)
            conn.executemany(_INSERT_INSTANCE, [dict(i, intent=None) for i in instances])
            conn.executemany(_INSERT_INSTANCE_USER, instance_users)

    def used_addresses(self) -> dict[str, set[str]]:
        """What live instances use (keys private_ip, public_ip, mac, hostname), as allocate() takes it."""
        return _used_addresses(self.conn)

    # -- what the metrics read (controller/metrics.py) --------------------------------
    def instance_counts(self) -> list[dict]:
        """Live instances per host and stored status."""
        return self._all("SELECT host, status, COUNT(*) AS instances FROM instances GROUP BY host, status")

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
