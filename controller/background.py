"""Slow host work taken off request threads.

Removing a large home (a tree of millions of files, `btrfs subvolume sync`)
can take minutes; a request thread must not wait for it. The request does the
quick, atomic part (the home is renamed aside and its row deleted) and queues
the rest here: one daemon thread runs the queue in order. A crash loses the
queue, not the work: what is left is on disk for `serve` (at start) and
`reconcile --fix` to finish.
"""

import logging
import queue
import threading
from collections.abc import Callable

from controller.errors import ControllerError

log = logging.getLogger(__name__)


class Background:
    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, what: str, work: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cloud-controller-background", daemon=True)
                self._thread.start()
        self._queue.put((what, work))

    def _run(self) -> None:
        while True:
            what, work = self._queue.get()
            try:
                run_logged(what, work)
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Until everything queued so far has run (tests, and a clean shutdown)."""
        self._queue.join()


def run_logged(what: str, work: Callable[[], None]) -> None:
    try:
        work()
    except ControllerError as e:
        log.warning("%s failed (reconcile --fix finishes it): %s", what, e.message)
    except Exception:  # noqa: BLE001 - a background failure must not kill the worker
        log.exception("%s failed (reconcile --fix finishes it)", what)


def run_later(ctx, what: str, work: Callable[[], None]) -> None:
    """Queue work on the context's background worker; without one (the agent), run it now."""
    worker = getattr(ctx, "background", None)
    if worker is None:
        run_logged(what, work)
    else:
        worker.submit(what, work)
