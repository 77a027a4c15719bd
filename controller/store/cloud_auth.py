"""One cloud auth for several clusters: the controllers it serves (table controllers), the
accounts they registered (registered_accounts) and the changes feed (auth_changes, written
by the triggers of migrations.py, and auth_epoch)."""

import json
import sqlite3

from controller.errors import Conflict, NotFound
from controller.store.database import utc_now

_CONTROLLER_COLUMNS = "id, name, url, enabled, created_at_utc, last_seen_utc"
# A user as a controller's replica holds it: never the password hash, the API key or the
# encrypted secret (whether one is set is enough: a null secret shuts the user out).
_FEED_USER_COLUMNS = ("id, email, name, active, owner_userid, roles, "
                      "api_secret_enc IS NOT NULL AS api_secret_set, created_at_utc")


class CloudAuthRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

    # -- controllers ------------------------------------------------------------------------
    def insert_controller(self, row: dict) -> None:
        try:
            with self.write() as conn:
                conn.execute("INSERT INTO controllers (id, name, url, secret_hash, enabled, created_at_utc) "
                             "VALUES (:id, :name, :url, :secret_hash, 1, :created_at_utc)", row)
        except sqlite3.IntegrityError as e:
            if "controllers.name" in str(e):
                raise Conflict(f"a controller is already named {row['name']}") from None
            raise Conflict(f"controller {row['id']} already exists") from None

    def list_controllers(self) -> list[dict]:
        return self._all(
            f"""SELECT {', '.join('c.' + c.strip() for c in _CONTROLLER_COLUMNS.split(','))},
                   (SELECT COUNT(*) FROM registered_accounts a WHERE a.controller_id = c.id) AS accounts
                FROM controllers c ORDER BY c.id""")

    def get_controller(self, controller_id: int) -> dict | None:
        return self._one("SELECT * FROM controllers WHERE id = ?", (controller_id,))

    def set_controller(self, controller_id: int, **changes) -> None:
        columns = ", ".join(f"{k} = :{k}" for k in changes)
        with self.write() as conn:
            if conn.execute(f"UPDATE controllers SET {columns} WHERE id = :_id",
                            dict(changes, _id=controller_id)).rowcount != 1:
                raise NotFound(f"no controller {controller_id}")

    def remove_controller(self, controller_id: int) -> None:
        """Refused while accounts are registered for it (they name users on its cluster)."""
        with self.write() as conn:
            held = conn.execute("SELECT COUNT(*) FROM registered_accounts WHERE controller_id = ?",
                                (controller_id,)).fetchone()[0]
            if held:
                raise Conflict(f"controller {controller_id} still has {held} registered account(s): "
                               "disable them on that cluster first")
            if conn.execute("DELETE FROM controllers WHERE id = ?", (controller_id,)).rowcount != 1:
                raise NotFound(f"no controller {controller_id}")

    # -- accounts registered by controllers ----------------------------------------------------
    def register_account(self, *, controller_id: int, username: str, user_id: str, uuid: str, uid: int,
                         now: str) -> tuple[dict, bool]:
        """The account (controller_id, username) for user_id: made, or found the same
        (idempotent); Conflict when another user holds the name there, or the user has
        another account there. Returns (row, made)."""
        with self.write() as conn:
            held = conn.execute("SELECT * FROM registered_accounts WHERE controller_id = ? AND username = ?",
                                (controller_id, username)).fetchone()
            if held is not None:
                if held["user_id"] != user_id:
                    raise Conflict(f"username {username} belongs to another user on cluster {controller_id}")
                if (held["uuid"], held["uid"]) != (uuid, uid):
                    raise Conflict(f"{username} is registered on cluster {controller_id} with another "
                                   "account id or uid")
                return dict(held), False
            other = conn.execute("SELECT username FROM registered_accounts WHERE controller_id = ? AND user_id = ?",
                                 (controller_id, user_id)).fetchone()
            if other is not None:
                raise Conflict(f"this user already has the account {other['username']} on cluster {controller_id}")
            row = {"controller_id": controller_id, "username": username, "user_id": user_id, "uuid": uuid,
                   "uid": uid, "created_at_utc": now}
            try:
                conn.execute("INSERT INTO registered_accounts (controller_id, username, user_id, uuid, uid, "
                             "created_at_utc) VALUES (:controller_id, :username, :user_id, :uuid, :uid, "
                             ":created_at_utc)", row)
            except sqlite3.IntegrityError:
                raise Conflict(f"account id {uuid} is already registered") from None
            return row, True

    def unregister_account(self, *, controller_id: int, username: str) -> dict:
        with self.write() as conn:
            held = conn.execute("SELECT * FROM registered_accounts WHERE controller_id = ? AND username = ?",
                                (controller_id, username)).fetchone()
            if held is None:
                raise NotFound(f"no account {username} is registered on cluster {controller_id}")
            conn.execute("DELETE FROM registered_accounts WHERE controller_id = ? AND username = ?",
                         (controller_id, username))
            return dict(held)

    def registered_accounts_of_users(self, user_ids: list[str]) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {u: [] for u in user_ids}
        if not user_ids:
            return out
        marks = ",".join("?" * len(user_ids))
        for row in self._all(f"SELECT rowid AS id, controller_id AS cloud_controller_id, * FROM registered_accounts "
                             f"WHERE user_id IN ({marks}) ORDER BY controller_id, username", user_ids):
            out[row["user_id"]].append(row)
        return out

    def registered_usernames(self, controller_id: int, uuids: list[str]) -> dict[str, str]:
        """Account id -> username, for the accounts a controller registered (the portal names
        a server's users with it)."""
        out: dict[str, str] = {}
        for chunk in _chunks(uuids):
            marks = ",".join("?" * len(chunk))
            for row in self._all(f"SELECT uuid, username FROM registered_accounts WHERE controller_id = ? "
                                 f"AND uuid IN ({marks})", [controller_id, *chunk]):
                out[row["uuid"]] = row["username"]
        return out

    # -- the changes feed -------------------------------------------------------------------------
    def feed_epoch(self) -> str:
        return self._one("SELECT epoch FROM auth_epoch")["epoch"]

    def introspect_token(self, token_hash: str, *, now: int) -> tuple[dict | None, int]:
        """The live token of an active user with a secret set, and the feed's sequence number,
        read together: a revocation after that number is in the feed after it."""
        with self.reading() as conn:
            row = conn.execute(
                """SELECT t.user_id, t.source, t.expires_at, t.created_at_utc FROM tokens t
                   JOIN users u ON u.id = t.user_id
                   WHERE t.token_hash = ? AND t.expires_at > ? AND u.active > 0 AND u.api_secret_enc IS NOT NULL""",
                (token_hash, now)).fetchone()
            seq = self._feed_seq(conn)
        return (dict(row) if row else None), seq

    @staticmethod
    def _feed_seq(conn) -> int:
        return conn.execute("SELECT COALESCE(MAX(seq), 0) FROM auth_changes").fetchone()[0]

    def feed_bounds(self) -> tuple[int, int]:
        """(the oldest kept change's number, the newest's); (0, 0) when none is kept."""
        row = self._one("SELECT COALESCE(MIN(seq), 0) AS first, COALESCE(MAX(seq), 0) AS last FROM auth_changes")
        return row["first"], row["last"]

    def feed_changes(self, since: int, limit: int) -> dict:
        """The changes after `since` (at most `limit` of them) and the present state of what
        they name, read in one transaction: {"seq", "more", "users", "accounts", "tokens"};
        a user or account that no longer exists comes back as its key alone."""
        with self.reading() as conn:
            rows = conn.execute("SELECT seq, kind, key FROM auth_changes WHERE seq > ? ORDER BY seq LIMIT ?",
                                (since, limit + 1)).fetchall()
            more = len(rows) > limit
            rows = rows[:limit]
            keys = {"user": [], "account": [], "token": []}
            for r in rows:
                if r["key"] not in keys[r["kind"]]:
                    keys[r["kind"]].append(r["key"])
            users = self._feed_users(conn, keys["user"])
            accounts = self._feed_accounts(conn, keys["account"])
            return {"seq": rows[-1]["seq"] if rows else since, "more": more, "users": users,
                    "accounts": accounts, "tokens": keys["token"]}

    def feed_snapshot(self, *, kind: str, after: str, limit: int) -> tuple[list[dict], bool, int]:
        """A page of every user (kind "user", by id) or account (kind "account", by
        controller id and username) after the key `after`, with the feed's number at the
        read: (rows, more, seq)."""
        with self.reading() as conn:
            seq = self._feed_seq(conn)
            if kind == "user":
                got = [dict(r) for r in conn.execute(
                    f"SELECT {_FEED_USER_COLUMNS} FROM users WHERE id > ? ORDER BY id LIMIT ?",
                    (after, limit + 1)).fetchall()]
            else:
                got = [dict(r) for r in conn.execute(
                    f"SELECT * FROM ({_ALL_ACCOUNTS}) WHERE key > ? ORDER BY key LIMIT ?",
                    (after, limit + 1)).fetchall()]
        return got[:limit], len(got) > limit, seq

    def _feed_users(self, conn, ids: list[str]) -> list[dict]:
        found = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            for r in conn.execute(f"SELECT {_FEED_USER_COLUMNS} FROM users WHERE id IN ({marks})", chunk):
                found[r["id"]] = dict(r)
        return [found.get(i, {"id": i, "deleted": True}) for i in ids]

    def _feed_accounts(self, conn, keys: list[str]) -> list[dict]:
        found = {}
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            for r in conn.execute(f"SELECT * FROM ({_ALL_ACCOUNTS}) WHERE key IN ({marks})", chunk):
                found[r["key"]] = dict(r)
        out = []
        for key in keys:
            if key in found:
                out.append(found[key])
            else:
                controller_id, _, username = key.partition(":")
                out.append({"key": key, "controller_id": int(controller_id), "username": username, "deleted": True})
        return out

    def prune_feed(self, *, before: int) -> int:
        """Changes older than `before` go (a controller further behind reads a snapshot)."""
        with self.write() as conn:
            return conn.execute("DELETE FROM auth_changes WHERE at < ? AND seq < (SELECT MAX(seq) FROM auth_changes)",
                                (before,)).rowcount


# Every system account of every cluster: this node's own (system_accounts) and those the
# controllers registered, keyed "CONTROLLER_ID:USERNAME" as the feed names them.
_ALL_ACCOUNTS = """
    SELECT cloud_controller_id || ':' || username AS key, cloud_controller_id AS controller_id, username,
           user_id, uuid, uid FROM system_accounts
    UNION ALL
    SELECT controller_id || ':' || username AS key, controller_id, username, user_id, uuid, uid
    FROM registered_accounts"""


def _chunks(items: list, size: int = 500):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# -- a controller following a cloud auth ------------------------------------------------------
# Its copy of a user: no password (no login here), an API key no one can send, and a
# placeholder where the user has an API secret (a null one shuts the user out, as at cloud auth).
_REPLICA_UPSERT = """
    INSERT INTO users (id, email, name, password_hash, active, owner_userid, roles, registration_source, api_key,
                       api_secret_enc, created_at_utc)
    VALUES (:id, :placeholder, :name, '!', :active, NULL, :roles, 'cloud_auth', :api_key, :secret, :created_at)
    ON CONFLICT(id) DO UPDATE SET email = excluded.email, name = excluded.name, active = excluded.active,
        roles = excluded.roles, api_secret_enc = excluded.api_secret_enc"""


class FollowRows:
    """Store's methods for a controller's copy of cloud auth (composed in controller/store/__init__.py)."""

    def follow_state(self) -> dict:
        return self._one("SELECT epoch, seq, last_good FROM cloud_auth_follow")

    def set_follow_state(self, *, epoch: str | None, seq: int, last_good: float) -> None:
        with self.write() as conn:
            conn.execute("UPDATE cloud_auth_follow SET epoch = ?, seq = ?, last_good = ?", (epoch, seq, last_good))

    def apply_replica(self, users: list[dict], revoked: list[str], accounts: list[dict] = ()) -> None:
        """One page of the feed, in one transaction: users made, changed or removed (a user
        something here still names is kept, inactive), tokens revoked, this cluster's
        registered accounts made or removed."""
        with self.write() as conn:
            self._apply_accounts(conn, accounts)
            # Removals first: an address a removed user held may be a new user's in this page.
            for u in users:
                if u.get("deleted"):
                    self._remove_user(conn, u["id"])
            self._upsert_users(conn, [u for u in users if not u.get("deleted")])
            for chunk in _chunks(revoked):
                conn.execute(f"DELETE FROM tokens WHERE token_hash IN ({','.join('?' * len(chunk))})", chunk)

    def replace_replica(self, users: list[dict], accounts: list[dict] = ()) -> None:
        """A snapshot: the copy becomes exactly these users and this cluster's registered
        accounts, and no cached token is kept (one revoked while this controller was away would
        otherwise live on)."""
        with self.write() as conn:
            conn.execute("DELETE FROM tokens")
            conn.execute("DELETE FROM cloud_auth_accounts")
            self._apply_accounts(conn, accounts)
            keep = {u["id"] for u in users}
            for (user_id,) in conn.execute("SELECT id FROM users").fetchall():
                if user_id not in keep:
                    self._remove_user(conn, user_id)
            self._upsert_users(conn, users)

    @staticmethod
    def _apply_accounts(conn, accounts) -> None:
        conn.executemany("DELETE FROM cloud_auth_accounts WHERE username = ?",
                         [(a["username"],) for a in accounts if a.get("deleted")])
        conn.executemany("INSERT OR REPLACE INTO cloud_auth_accounts (username, user_id, uuid, uid) "
                         "VALUES (:username, :user_id, :uuid, :uid)", [a for a in accounts if not a.get("deleted")])

    def registry_copy(self) -> dict[str, dict]:
        """The accounts cloud auth lists for this cluster, as last read from the feed, by username."""
        return {r["username"]: r for r in self._all("SELECT * FROM cloud_auth_accounts")}

    @staticmethod
    def _upsert_users(conn, users: list[dict]) -> None:
        # Emails first as placeholders, so two users trading addresses in one page never collide.
        conn.executemany(_REPLICA_UPSERT, [{
            "id": u["id"], "placeholder": f"~{u['id']}", "name": u["name"], "active": u["active"],
            "roles": json.dumps(sorted(u["roles"])), "api_key": f"cloud-auth:{u['id']}",
            "secret": "set at cloud auth" if u["api_secret_set"] else None, "created_at": u["created_at"],
        } for u in users])
        conn.executemany("UPDATE users SET email = ?, owner_userid = ? WHERE id = ?",
                         [(u["email"], u["owner_userid"], u["id"]) for u in users])
        gone = [u["id"] for u in users if u["active"] <= 0 or not u["api_secret_set"]]
        conn.executemany("DELETE FROM tokens WHERE user_id = ?", [(i,) for i in gone])

    @staticmethod
    def _remove_user(conn, user_id: str) -> None:
        conn.execute("SAVEPOINT remove_user")
        try:
            conn.execute("DELETE FROM users WHERE id = ?", (user_id,))
        except sqlite3.IntegrityError:
            # Its account, volume, instances or groups here still name it: kept, inactive, for
            # an admin to clear (reconcile lists it).
            conn.execute("ROLLBACK TO remove_user")
            # Its email goes too: cloud auth may give it to another user.
            conn.execute("UPDATE users SET active = 0, email = '~' || id WHERE id = ?", (user_id,))
            conn.execute("DELETE FROM tokens WHERE user_id = ?", (user_id,))
        conn.execute("RELEASE remove_user")

    def user_is_active(self, user_id: str) -> bool:
        return self._one("SELECT 1 AS x FROM users WHERE id = ? AND active > 0", (user_id,)) is not None

    def cache_token(self, *, token_hash: str, user_id: str, source: str, expires_at: int) -> bool:
        """A token cloud auth vouched for; False when its user is not (or no longer) here."""
        with self.write() as conn:
            if conn.execute("SELECT 1 FROM users WHERE id = ? AND active > 0", (user_id,)).fetchone() is None:
                return False
            conn.execute("INSERT OR REPLACE INTO tokens (token_hash, user_id, source, expires_at, created_at_utc) "
                         "VALUES (?, ?, ?, ?, ?)", (token_hash, user_id, source, expires_at, utc_now()))
        return True
