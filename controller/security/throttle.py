"""Slows down guessing: repeated failed logins for one key or email are refused for a while."""

import hashlib
import threading
import time

from controller.errors import TooManyRequests


class FailureThrottle:
    def __init__(self, *, max_failures: int = 5, window_seconds: int = 300, lockout_seconds: int = 60,
                 clock=time.monotonic):
        self.max_failures = max_failures
        self.window = window_seconds
        self.lockout = lockout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, list[float]] = {}
        self._locked_until: dict[str, float] = {}
        self._next_prune = 0.0

    @staticmethod
    def _slot(key: str) -> str:
        # A fixed-size digest: client-chosen keys of any length cost the same memory.
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()

    def check(self, key: str) -> None:
        """Raise TooManyRequests while key is locked out."""
        key = self._slot(key)
        with self._lock:
            until = self._locked_until.get(key)
            if until is None:
                return
            now = self._clock()
            if now < until:
                wait = int(until - now) + 1
                # Says how long, as Retry-After does: a person reads the message, not the header.
                raise TooManyRequests(f"too many failed attempts; try again in {wait} seconds", retry_after=wait)
            del self._locked_until[key]

    def failed(self, key: str) -> None:
        key = self._slot(key)
        with self._lock:
            now = self._clock()
            recent = [t for t in self._failures.get(key, []) if now - t < self.window]
            recent.append(now)
            if len(recent) >= self.max_failures:
                self._locked_until[key] = now + self.lockout
                recent = []
            self._failures[key] = recent
            # Bounded memory under a spray of distinct keys, pruned at most once a window.
            if len(self._failures) + len(self._locked_until) > 100_000 and now >= self._next_prune:
                self._failures = {k: v for k, v in self._failures.items() if v and now - v[-1] < self.window}
                self._locked_until = {k: t for k, t in self._locked_until.items() if t > now}
                self._next_prune = now + self.window

    def succeeded(self, key: str) -> None:
        key = self._slot(key)
        with self._lock:
            self._failures.pop(key, None)
