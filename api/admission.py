"""Which request gets a server thread now (issue 16, finding 4).

Creates are synchronous (the 201 comes once the guest is defined and started):
a create holds its request thread for the seconds libvirt, the disk and the
seed take, and so do deletes, power tasks, volume and group changes and
account locks. With one pool of threads a burst of them took every thread and
a `GET /v1/server-flavor` waited 24 s. So
`serve` runs `threads + host_workers + host_queue` threads and this
middleware shares them out:

- **Host work** (a resource lists the methods that change the host in
  `host_work`): at most `host_workers` run at once; up to `host_queue` more
  wait for one, each at most `host_queue_seconds`; past that the request is
  answered 503 with `Retry-After` at once. Host work therefore never holds
  more than `host_workers + host_queue` threads. One user holds at most
  `host_work_per_user` of those places (running or waiting): one more of
  theirs is answered 429 with `Retry-After` at once, so a single client's
  loop of tasks cannot fill the queue everyone else waits in.
- **Password logins** are bounded by the hash slots already
  (controller/security/hash_slots.py: at most `max_password_checks` hash and as many
  more wait on a timer); they wait on argon2 or the clock, not on Python's
  GIL, so they take no turn here and `serve` gives them threads of their
  own (two per slot): a flood of logins holds none of the threads reads use.
- **Everything else** (reads, API-key logins, `/healthz`) runs `threads` at
  once, the others waiting their turn, as with a pool of `threads` threads
  before: those threads are always free of host work and logins, and more
  requests than that running together only hand Python's GIL around
  (docs/performance.md).

The gate is taken after authentication for host work (an anonymous request
never queues for a worker) and before it for the rest.
"""

import threading
import time

from controller.errors import ServerBusy, TooManyRequests

# A read that waits this long for one of `threads` is answered 503 rather than waiting on.
_READ_WAIT_SECONDS = 30.0


class Gate:
    """`running` may run at once, `waiting` more may wait for them up to `wait_seconds`; one
    key (a user) holds at most `per_key` of those places when it is given.

    Two counters under one lock: entering and leaving a free gate (every read, most of
    the time) is one uncontended lock each way. Two BoundedSemaphores (a Condition and a
    Python-level lock each) cost four acquisitions and a notify per request, a tenth of
    a GET (docs/performance.md). Only a request that must wait sleeps on the condition."""

    def __init__(self, *, running: int, waiting: int, wait_seconds: float, what: str, per_key: int | None = None):
        self._limit = running
        self._admit_limit = running + waiting
        self._running = 0
        self._admitted = 0
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._sleepers = 0
        self._wait = wait_seconds
        self._what = what
        self._per_key = per_key
        self._held: dict[str, int] = {}
        self._held_lock = threading.Lock()

    def enter(self, key: str | None = None) -> None:
        self._take(key)
        try:
            self._enter()
        except BaseException:
            self._give(key)
            raise

    def _enter(self) -> None:
        with self._lock:
            if self._admitted >= self._admit_limit:
                raise ServerBusy(f"too many {self._what} at once; try again shortly", retry_after=5)
            self._admitted += 1
            if self._running < self._limit:
                self._running += 1
                return
            started = time.monotonic()
            deadline = started + self._wait
            self._sleepers += 1
            try:
                while self._running >= self._limit:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._admitted -= 1
                        raise ServerBusy(f"{self._what} waited {time.monotonic() - started:.0f} s for a turn; "
                                         "try again shortly", retry_after=5)
                    self._turn.wait(left)
            finally:
                self._sleepers -= 1
            self._running += 1

    def _take(self, key: str | None) -> None:
        if key is None or self._per_key is None:
            return
        with self._held_lock:
            held = self._held.get(key, 0)
            if held >= self._per_key:
                raise TooManyRequests(f"{held} {self._what} of yours are running or waiting already (at most "
                                      f"{self._per_key} at once); try again shortly", retry_after=5)
            self._held[key] = held + 1

    def _give(self, key: str | None) -> None:
        if key is None or self._per_key is None:
            return
        with self._held_lock:
            left = self._held.get(key, 1) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

    def leave(self, key: str | None = None) -> None:
        with self._lock:
            if self._running <= 0 or self._admitted <= 0:
                raise ValueError("Gate.leave() without enter()")
            self._running -= 1
            self._admitted -= 1
            if self._sleepers:
                self._turn.notify()
        self._give(key)


def gates_from(config) -> tuple[Gate, Gate]:
    workers, queue = config.server.host_workers, config.server.host_queue
    host = Gate(running=workers, waiting=queue, wait_seconds=config.server.host_queue_seconds,
                what="host operations", per_key=config.server.host_work_per_user)
    # Other requests are never refused at the door: there are never more of them than threads.
    other = Gate(running=config.server.threads, waiting=server_threads(config),
                 wait_seconds=_READ_WAIT_SECONDS, what="requests")
    return host, other


def server_threads(config) -> int:
    """waitress's threads: `threads` for other requests plus every thread host work and password
    logins may hold."""
    held = config.server.threads + config.server.host_workers + config.server.host_queue
    return held + 2 * config.auth.max_password_checks


def is_host_work(req, resource) -> bool:
    return resource is not None and req.method in getattr(resource, "host_work", ())


def _gated_elsewhere(req, resource) -> bool:
    """Host work (the host gate) and requests a resource bounds itself (`bounded_itself`)."""
    return is_host_work(req, resource) or req.method in getattr(resource, "bounded_itself", ())


class Admission:
    """Falcon middleware holding a request in `gate` from its resource to its response: the host
    gate for host work (placed after authentication), the other gate for the rest (before it)."""

    def __init__(self, gate: Gate, *, host_work: bool):
        self.gate = gate
        self.host_work = host_work
        self._held = "host_gate" if host_work else "other_gate"

    def process_resource(self, req, resp, resource, params):
        if is_host_work(req, resource) if self.host_work else not _gated_elsewhere(req, resource):
            # Host work comes after authentication: its places are counted per user too.
            requester = req.context.get("requester") if self.host_work else None
            key = requester.id if requester is not None else None
            self.gate.enter(key)
            setattr(req.context, self._held, (key,))

    def process_response(self, req, resp, resource, req_succeeded):
        # Called even when process_resource raised: only a gate entered is left.
        held = getattr(req.context, self._held, None)
        if held:
            setattr(req.context, self._held, None)
            self.gate.leave(held[0])
