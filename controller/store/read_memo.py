"""Answers of the read path remembered until the next committed write (PERF: docs/performance.md).

A GET of one instance and an owner's list each cost SQLite statements, and every
statement hands Python's GIL to another thread: under load, getting it back is most of a
read's wait. Nothing a read answers can change without a committed write, and every
committed write of any process changes the write mark (controller/store/write_mark.py). So a
read's answer is kept with the mark read *before* its statement, and served again only
while the mark is that one: a write committed meanwhile (a row deleted, a status synced, a
user given to another owner, a role taken away) makes the next read a fresh one, in this
process or any other, as for a token's owner (Store.token_owner).

Bounded twice: at most `max_entries` answers (all forgotten when full, as the token
memo), each for at most `seconds` (writes by other programs, such as the sqlite3 shell,
do not change the mark). Where the mark is unusable nothing is remembered.
"""

import time
from collections.abc import Callable, Hashable


class ReadMemo:
    def __init__(self, *, max_entries: int, seconds: float, clock: Callable[[], float] = time.monotonic):
        self._held: dict[Hashable, tuple[bytes, float, object]] = {}
        self._max = max_entries
        self._seconds = seconds
        self._clock = clock

    def get(self, key: Hashable, mark: bytes):
        """The answer kept for key under this mark, or None."""
        held = self._held.get(key)
        if held is None or held[0] != mark or self._clock() >= held[1]:
            return None
        return held[2]

    def put(self, key: Hashable, mark: bytes, answer) -> None:
        """Keep answer (never None), read after `mark` was read."""
        if len(self._held) >= self._max:
            self._held.clear()  # dict operations are atomic under the GIL: no lock
        self._held[key] = (mark, self._clock() + self._seconds, answer)

    def clear(self) -> None:
        self._held.clear()
