"""What a signed-in user holds: API tokens (table tokens) and portal sessions (table
portal_sessions)."""

import json
import time

from controller.store.database import TOKEN_MEMO_SECONDS, utc_now


_TOKEN_MEMO_MAX = 10_000


class TokenRows:
    """Store's methods for these tables (composed in controller/store/__init__.py): they read
    and write through Database's connection (_one, _all, conn) and its write()."""

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

    def insert_portal_session(self, *, id_hash: str, user_id: str, now: int, purge_before: int,
                              started_before: int, token_hash: str, token_expires_at: int) -> None:
        """A new session and its API token; sessions idle since purge_before or started before
        started_before go, and their tokens with them."""
        with self.write() as conn:
            gone = "SELECT token_hash FROM portal_sessions WHERE seen_at < ? OR created_at < ?"
            conn.execute(f"DELETE FROM tokens WHERE token_hash IN ({gone})", (purge_before, started_before))
            conn.execute("DELETE FROM portal_sessions WHERE seen_at < ? OR created_at < ?",
                         (purge_before, started_before))
            # A password login's token: a password set ends it with the session.
            conn.execute("INSERT INTO tokens (token_hash, user_id, source, expires_at, created_at_utc) "
                         "VALUES (?, ?, 'password', ?, ?)", (token_hash, user_id, token_expires_at, utc_now()))
            conn.execute("INSERT INTO portal_sessions (id_hash, user_id, created_at, seen_at, token_hash) "
                         "VALUES (?, ?, ?, ?, ?)", (id_hash, user_id, now, now, token_hash))

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
        """The session and its API token (a revocation every cluster hears of)."""
        with self.write() as conn:
            conn.execute("DELETE FROM tokens WHERE token_hash = (SELECT token_hash FROM portal_sessions "
                         "WHERE id_hash = ?)", (id_hash,))
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
