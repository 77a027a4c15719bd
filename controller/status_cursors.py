"""Where each host's status sync left off, in this process (controller/hosts/status_sync.py).

A cursor is what a Hypervisor's `status_changes` answered last (its "mark"): given
back, the host tells only what changed since. Not to be confused with the database's
write mark (controller/store/write_mark.py), which every committed write changes.
"""

import threading


class StatusCursors:
    """Per process: each host's cursor from its last sync, and when its whole view was last taken."""

    def __init__(self):
        self.cursors: dict[str, tuple[object, float]] = {}
        # One sync of a host at a time (a slower one must not write an older view over a
        # newer one); a lock per host, so a slow host delays only the lists holding its rows.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock_of(self, host_name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(host_name, threading.Lock())
