"""Who may hash a password now (issue 16, finding 3).

A password login costs one argon2 hash (tens of milliseconds, `argon2_memory_kib`
of memory), so at most `max_password_checks` hash at once and one more is
answered 429 at once. Left at that, one client with three threads of wrong
passwords for unknown emails keeps every slot busy and no one else logs in.
Two rules keep the slots shared:

- **Per source**: one client address holds at most `per_source` logins at once
  (hashing or answered as below); one more from it is 429 at once, whatever
  its email. Decided before anything about the email is known, so it says
  nothing about whether the email exists.
- **Unknown emails as a class**: a login for an email no user has hashes the
  dummy (so it takes as long as a wrong password) in at most half of the
  slots. When that share is busy it does not hash: it is answered as a wrong
  password is, 401 after as long as a recent real check took (`simulate`),
  holding no slot. Those answers are bounded too (`total` at once); past
  that, an unknown email takes a free slot as a known one would. So the
  status a login gets never depends on whether its email exists: only the
  per-source and all-slots-busy rules give 429, for both alike. What an
  observer can still learn is in docs/decisions.md ("Hash slots").
"""

import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from controller.errors import TooManyRequests

HASH = "hash"
SIMULATE = "simulate"
# Until a real check has been timed (the first seconds of a process), a simulated answer waits this long.
_FIRST_GUESS_SECONDS = 0.25
# A simulated answer never waits longer than this, whatever a check once took.
_MAX_WAIT_SECONDS = 5.0


class HashSlots:
    def __init__(self, *, total: int, per_source: int, clock=time.monotonic):
        self.total = total
        self.per_source = per_source  # 0: no cap per source
        self.unknown_share = total // 2
        self.simulated_max = total
        self._clock = clock
        self._lock = threading.Lock()
        self._hashing = 0
        self._unknown_hashing = 0
        self._simulating = 0
        self._by_source: dict[str, int] = {}
        self._durations: deque[float] = deque(maxlen=16)

    @contextmanager
    def admit(self, source: str, *, known: bool) -> Iterator[str]:
        """Yields HASH (hash now) or SIMULATE (answer as a wrong password without hashing);
        TooManyRequests at once when the source or every slot is busy."""
        with self._lock:
            # The only refusals, and neither looks at `known`.
            if self.per_source and self._by_source.get(source, 0) >= self.per_source:
                raise TooManyRequests("too many logins at once from this address; try again shortly",
                                      retry_after=1)
            if self._hashing >= self.total:
                raise TooManyRequests("too many logins at once; try again shortly", retry_after=1)
            unknown_over_share = not known and self._unknown_hashing >= self.unknown_share
            how = SIMULATE if unknown_over_share and self._simulating < self.simulated_max else HASH
            if how == SIMULATE:
                self._simulating += 1
            else:
                self._hashing += 1
                self._unknown_hashing += 0 if known else 1
            self._by_source[source] = self._by_source.get(source, 0) + 1
        try:
            yield how
        finally:
            with self._lock:
                if how == SIMULATE:
                    self._simulating -= 1
                else:
                    self._hashing -= 1
                    self._unknown_hashing -= 0 if known else 1
                left = self._by_source[source] - 1
                if left:
                    self._by_source[source] = left
                else:
                    del self._by_source[source]  # memory follows the logins in flight, not every address seen

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Times a real check, the model of a simulated answer."""
        started = self._clock()
        yield
        elapsed = self._clock() - started
        with self._lock:
            self._durations.append(elapsed)

    def simulated_wait(self) -> float:
        """How long a simulated answer waits: one of the last real checks' times, drawn at random,
        so the simulated answers follow the real ones' spread and not one fixed value."""
        with self._lock:
            recent = list(self._durations)
        return min(random.choice(recent) if recent else _FIRST_GUESS_SECONDS, _MAX_WAIT_SECONDS)
