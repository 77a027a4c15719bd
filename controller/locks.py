"""Who may change the host at the same time.

Two locks, both advisory:

- `host_changes(ctx)`: every operation that changes host state (create,
  delete, member and user changes) holds it shared while it works, in the
  server and in the agent alike; `cloud-agent reconcile --fix` holds it
  exclusive for its whole run. So reconcile never sees a create or a delete
  half way and takes it for drift, and no operation starts while reconcile
  repairs. It is an flock on `<database>.lock`, which every process of one
  deployment reaches; flock locks belong to the open file, so each thread
  takes its own.
- `one_at_a_time(kind, id)`: within the server process, operations on one
  resource (modify-users on one instance, member changes of one group) run one
  after the other, so none reads a list another is about to replace (a lost
  update).
- `across_processes(ctx, kind, key)`: the same across every process of the
  deployment (a base image copied to a host: the server's creates and the
  agent's drains and evacuations), an flock on a file of its own under
  `<database>.locks/`, whose content says what a holder that died was doing.

A long task on one instance (a power task, which may wait a guest's shutdown
out; a move) holds the instance's claim (instance_claims.py), across
processes: a second is refused at once with Conflict naming the first.
"""

import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from controller.errors import Conflict, ControllerError

RECONCILE_WAIT_MESSAGE = "another reconcile --fix or host change is running"


def _lock_path(ctx) -> str | None:
    path = ctx.store.path
    return None if path == ":memory:" else f"{path}.lock"


@contextmanager
def host_changes(ctx, *, exclusive: bool = False, wait: bool = True) -> Iterator[None]:
    """Hold the deployment's host-change lock: shared for one operation, exclusive for reconcile --fix.

    With wait=False an exclusive lock that is taken raises Conflict at once.
    """
    path = _lock_path(ctx)
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        flags = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, flags | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Conflict(RECONCILE_WAIT_MESSAGE) from None
        yield
    finally:
        os.close(fd)  # releases the lock


_resource_locks: dict[tuple[str, str], threading.Lock] = {}
_resource_locks_guard = threading.Lock()


@contextmanager
def one_at_a_time(kind: str, resource_id: str, *, wait_seconds: float | None = None,
                  busy: ControllerError | None = None) -> Iterator[None]:
    """Serialize read-modify-write operations on one resource within this process.

    With wait_seconds, a lock still held after that long raises `busy` instead of waiting on."""
    key = (kind, resource_id)
    with _resource_locks_guard:
        lock = _resource_locks.setdefault(key, threading.Lock())
    if not lock.acquire(timeout=-1 if wait_seconds is None else wait_seconds):
        raise busy or Conflict(f"{kind} {resource_id} is busy")
    try:
        yield
    finally:
        lock.release()


class CrossProcessMark:
    """What the holder of an across_processes lock left in its file: "" when its work ended,
    else what it was doing when its process died (the kernel drops an flock with its process,
    the file's content stays)."""

    def __init__(self, fd: int):
        self._fd = fd

    def read(self) -> str:
        os.lseek(self._fd, 0, os.SEEK_SET)
        return os.read(self._fd, 4096).decode(errors="replace")

    def write(self, text: str) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)
        os.fsync(self._fd)


@contextmanager
def across_processes(ctx, kind: str, key: str, *, wait_seconds: float,
                     busy: ControllerError) -> Iterator[CrossProcessMark | None]:
    """One holder at a time in every process of the deployment (the server and each
    `cloud-agent`): an flock on a file named for (kind, key) in `<database>.locks/`. Waits at
    most wait_seconds, then raises `busy`. Threads of one process queue in one_at_a_time
    first (an flock belongs to the open file, so each holder opens its own). Yields the lock
    file's CrossProcessMark (None without a database file: one process only)."""
    deadline = time.monotonic() + wait_seconds  # one bound for both waits
    with one_at_a_time(kind, key, wait_seconds=wait_seconds, busy=busy):
        path = _lock_path(ctx)
        if path is None:
            yield None
            return
        folder = f"{ctx.store.path}.locks"
        os.makedirs(folder, mode=0o700, exist_ok=True)
        name = f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"
        fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise busy from None
                    time.sleep(0.05)
            yield CrossProcessMark(fd)
        finally:
            os.close(fd)  # releases the lock
