"""A controller's copy of cloud auth's users, kept by following the changes feed
(`[cloud_auth] url` set), and the check of a token it has not seen.

The copy lives in the controller's own `users` table (no password hash, no secret: an
API secret set is a placeholder), so its visibility rules and SQL stay as a single node's.
Tokens it has checked are cached in its `tokens` table, as hashes. The feed is read every
`poll_seconds` by a thread of its own; where it stopped (epoch, number, the last good
read) is kept in the database, so a restart goes on from there.

An unseen token is introspected once. Its answer carries the feed's number at the check.
A revocation of the token before that number would have made the answer "not active"; one
after it is either applied already (then the token is not cached: the race between an
introspection in flight and a revocation) or applied later (then it removes the cached
token). A user the copy does not hold yet is waited for until the copy reaches the number."""

import logging
import threading
import time
from datetime import datetime, timezone

from controller.cloud_auth.client import CloudAuthClient, CloudAuthDown
from controller.context import Context
from controller.errors import HostError, ServerBusy, Unauthenticated
from controller.security.crypto import token_hash

log = logging.getLogger(__name__)

# Revocations applied are remembered this long, for introspections still in flight.
_RECENT_SECONDS = 60.0


def _epoch_seconds(text: str) -> int:
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp())


class Follower:
    def __init__(self, ctx: Context, client: CloudAuthClient, *, clock=time.time, max_introspections: int = 2):
        self.ctx, self.client, self.clock = ctx, client, clock
        config = ctx.config.cloud_auth
        self.poll_seconds, self.timeout, self.grace = (config.poll_seconds, config.timeout_seconds,
                                                       config.offline_grace_seconds)
        state = ctx.store.follow_state()
        self.epoch, self.seq, self.last_good = state["epoch"], state["seq"], state["last_good"]
        self.last_error: str | None = None
        self._poll_lock = threading.Lock()  # one reader of the feed at a time
        self._apply_lock = threading.Lock()  # applying a page, or caching a token: never both at once
        self._applied = threading.Condition(self._apply_lock)
        self._recent: dict[str, tuple[int, float]] = {}  # token hash -> (seq, when applied)
        self._introspections = threading.BoundedSemaphore(max_introspections)
        self._stop = threading.Event()
        self._wake = threading.Event()  # an introspection waiting for the copy reads the feed now
        self._thread: threading.Thread | None = None

    # -- the feed --------------------------------------------------------------------------
    def poll(self) -> None:
        """Read the feed until caught up and apply it; CloudAuthDown when cloud auth does not
        answer (the copy stays as it was)."""
        with self._poll_lock:
            try:
                self._poll()
            except CloudAuthDown as e:
                self.last_error = e.message
                raise
            self.last_error = None
            self.last_good = self.clock()
            self.ctx.store.set_follow_state(epoch=self.epoch, seq=self.seq, last_good=self.last_good)

    def _poll(self) -> None:
        page = self.client.changes(since=self.seq, epoch=self.epoch)
        if page["reset"]:
            self._snapshot(page)
            return
        while True:
            self._apply(page, page["seq"])
            if not page["more"]:
                return
            page = self.client.changes(since=self.seq, epoch=self.epoch)
            if page["reset"]:
                self._snapshot(page)
                return

    def _snapshot(self, first: dict) -> None:
        users, accounts, page = [], [], first
        while True:
            users += page["users"]
            accounts += self._own(page)
            if not page["more"]:
                break
            page = self.client.changes(since=0, epoch=None, after=page["next"])
        with self._applied:
            self.ctx.store.replace_replica(users, accounts)
            self.epoch, self.seq = first["epoch"], first["seq"]
            self._applied.notify_all()
        log.info("cloud auth: copied %d users (epoch %s, change %d)", len(users), self.epoch, self.seq)

    def _own(self, page: dict) -> list[dict]:
        """The page's accounts of this cluster (the feed carries every cluster's)."""
        me = self.ctx.config.controller.id
        return [a for a in page.get("accounts", ()) if a["controller_id"] == me]

    def _apply(self, page: dict, seq: int) -> None:
        hashes = [r["token_hash"] for r in page["revocations"]]
        with self._applied:
            self.ctx.store.apply_replica(page["users"], hashes, self._own(page))
            now = time.monotonic()
            for h in hashes:
                self._recent[h] = (seq, now)
            for h in [h for h, (_, at) in self._recent.items() if now - at > _RECENT_SECONDS]:
                del self._recent[h]
            self.seq = seq
            self._applied.notify_all()

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cloud-auth-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)

    def _run(self) -> None:
        said = None
        while not self._stop.is_set():
            try:
                self.poll()
                if said:
                    log.info("cloud auth answers again")
                said = None
            except CloudAuthDown as e:
                if e.message != said:
                    log.warning("cloud auth: %s (tokens already seen work for %g s after the last good read)",
                                e.message, self.grace)
                said = e.message
            except Exception:  # noqa: BLE001 - the thread must go on; the next poll tries again
                log.exception("cloud auth: reading the changes feed failed")
            self._wake.wait(self.poll_seconds)
            self._wake.clear()

    # -- what requests ask ----------------------------------------------------------------------
    def age(self) -> float | None:
        """Seconds since the last good read of the feed; None before the first."""
        return None if self.last_good is None else max(0.0, self.clock() - self.last_good)

    def usable(self) -> None:
        """ServerBusy (503) once cloud auth has not answered for longer than the offline grace
        (0: from its first failed read). While reads succeed, the copy is current."""
        age = self.age()
        healthy = age is not None and self.last_error is None and age <= self.poll_seconds + self.timeout + 1
        if not healthy and (age is None or age > self.grace):
            raise ServerBusy("cloud auth has not answered for too long: no token can be checked now"
                             if age is not None else "this controller has not read cloud auth yet",
                             retry_after=max(1, round(self.poll_seconds)))

    def check(self) -> str:
        """/healthz and `cloud-agent check`: failed once the grace has passed."""
        age = self.age()
        if age is None:
            raise HostError(f"cloud auth {self.client.url} not read yet" +
                            (f": {self.last_error}" if self.last_error else ""))
        try:
            self.usable()
        except ServerBusy:
            raise HostError(f"cloud auth {self.client.url} last read {age:.0f} s ago, past the offline grace "
                            f"of {self.grace:g} s" + (f": {self.last_error}" if self.last_error else "")) from None
        return f"feed read {age:.1f} s ago, change {self.seq}"

    def admit(self, token: str, user_id: str) -> None:
        """An unseen token: introspected, and cached when live. Unauthenticated when cloud auth
        says it is not; ServerBusy (503) when cloud auth cannot say within timeout_seconds."""
        deadline = time.monotonic() + self.timeout
        if self.last_error is not None and self.age() is not None and self.age() > self.poll_seconds * 2:
            # Known to be down: no request thread waits for it.
            raise ServerBusy(f"cloud auth does not answer ({self.last_error}); try again", retry_after=2)
        if not self._introspections.acquire(blocking=False):
            raise ServerBusy("cloud auth is busy checking other new tokens; try again", retry_after=1)
        try:
            answer = self.client.introspect(token, user_id)
        finally:
            self._introspections.release()
        if not answer.get("active"):
            raise Unauthenticated("invalid or expired token for this user")
        seq, hashed = answer["seq"], token_hash(token)
        with self._applied:
            # A user this copy does not hold as active yet (made or reactivated a moment ago) is
            # waited for: the copy must reach the check's number. One it holds is used as it is
            # (a later change reaches it with the next read, as it reaches every cached token).
            if self.seq < seq and not self.ctx.store.user_is_active(answer["userid"]):
                self._wake.set()
            while self.seq < seq and not self.ctx.store.user_is_active(answer["userid"]):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerBusy("this controller's copy of cloud auth is behind; try again", retry_after=1)
                self._applied.wait(left)
            revoked = self._recent.get(hashed)
            if revoked is not None and revoked[0] > seq:
                raise Unauthenticated("invalid or expired token for this user")
            if not self.ctx.store.cache_token(token_hash=hashed, user_id=answer["userid"], source=answer["source"],
                                              expires_at=_epoch_seconds(answer["expires_at"])):
                raise Unauthenticated("invalid or expired token for this user")  # the user is gone since


def follower_for(ctx: Context) -> "Follower | None":
    """The follower of `[cloud_auth] url`, None when it is empty. InvalidInput when the secret
    file is missing, empty or readable by others."""
    if not ctx.config.cloud_auth.url:
        return None
    from controller.cloud_auth.client import read_secret

    secret = read_secret(ctx.config.cloud_auth.secret_file)
    return Follower(ctx, CloudAuthClient(ctx.config, secret))
