"""The connection of each thread, write transactions, schema migrations and the
reads every family of tables shares."""

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import sqlite_utils

from controller.store.migrations import SCHEMA_VERSION, migrate as apply_migrations
from controller.store.read_memo import ReadMemo
from controller.store.write_mark import WriteMark


BUSY_TIMEOUT_MS = 10_000

# How long a token's owner is remembered at most, for writes that do not change the
# write mark (the sqlite3 shell); every write of the service or cloud-agent ends it at once.
TOKEN_MEMO_SECONDS = 5.0

# Reads remembered until the next committed write (controller/store/read_memo.py): GETs of one
# instance (a row each, under 1 KB: at most about 2 MB), and lists of one chunk with the
# hosts holding their rows (up to a chunk of objects each, some 80 KB: at most about 5 MB).
_INSTANCE_MEMO_MAX = 2_000
_LIST_MEMO_MAX = 64


def utc_now() -> str:
    """RFC 3339 UTC with seconds, as every date-time of the API."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Database:
    """The database file at a path: its connections, transactions and schema, and the reads
    remembered until the next committed write (token owners, instances, lists)."""

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

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """Several reads from one snapshot of the database (a deferred transaction: in WAL mode
        it never waits for the writer)."""
        conn = self.conn
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def migrate(self) -> tuple[int, int]:
        try:
            return apply_migrations(self.conn)
        finally:
            self.write_mark.change()

    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def ping(self) -> None:
        """Raise sqlite3.Error unless the database answers and is fully migrated."""
        version = self.schema_version()
        if version != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"schema version {version}, expected {SCHEMA_VERSION}: run `cloud-agent init`"
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
