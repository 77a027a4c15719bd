"""The libvirt connection of one adapter: opened on first use (in bounded time), kept
alive, opened again when lost; and the libvirt helpers the package's modules share.

Every call to a host goes through ConnectionPart._call(what, op): op(conn) runs
on the current connection, libvirt's errors become the project's (HostError, or
HostUnreachable when the connection is gone), and an operation that is safe to
repeat is repeated once on a new connection. libvirt's event loop, which
keepalive and the lifecycle events (statuses.py) need, runs in one thread per
process.
"""

import functools
import logging
import threading
import time

from common.errors import CleanupFailed, ControllerError, HostError, HostUnreachable

log = logging.getLogger(__name__)


@functools.cache
def _libvirt():
    import libvirt

    # libvirt prints every error on stderr unless a handler takes it; ours are raised.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


_event_loop_lock = threading.Lock()
_event_loop_started = False

# A peer that misses this many keepalive answers, this many seconds apart, is dead:
# calls waiting on it fail (HostUnavailable) instead of holding a server thread.
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def _start_event_loop() -> None:
    """libvirt's keepalive needs an event loop registered before connections open."""
    global _event_loop_started
    with _event_loop_lock:
        if _event_loop_started:
            return
        lv = _libvirt()
        lv.virEventRegisterDefaultImpl()

        def run():
            while True:
                lv.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _event_loop_started = True


def _code(err) -> int:
    return err.get_error_code()


def _msg(err) -> str:
    return err.get_error_message() or str(err)


def _over_rpc_limit(err) -> bool:
    """The remote protocol refused a listing longer than it carries (16,384 volumes of one
    pool): an answer from the peer, not a lost connection."""
    return "for limit" in (err.get_error_message() or "")


# How long a volume operation waits for a job of its pool (a volume being built or copied)
# before the refusal counts: libvirt refuses, rather than queues, what meets one.
POOL_JOB_WAIT = 60.0


def _pool_busy(err) -> bool:
    """libvirt refused because a job of the pool runs (a volume being built or copied): a
    delete or refresh of the pool ("pool ... has asynchronous jobs running"), or a use of a
    volume still being made ("volume ... is still being allocated"). Transient, not a failure."""
    message = err.get_error_message() or ""
    return "asynchronous jobs running" in message or "is still being allocated" in message


def _while_pool_busy(call, *args, wait: float | None = None, **kwargs):
    """call(*args, **kwargs), again after a short pause while the pool is busy (_pool_busy),
    for at most `wait` seconds (POOL_JOB_WAIT): then the refusal is raised."""
    lv = _libvirt()
    deadline = time.monotonic() + (POOL_JOB_WAIT if wait is None else wait)
    pause = 0.05
    while True:
        try:
            return call(*args, **kwargs)
        except lv.libvirtError as e:
            left = deadline - time.monotonic()
            if not _pool_busy(e) or left <= 0:
                raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, 1.0)


def _connection_lost(err) -> bool:
    lv = _libvirt()
    code, domain = err.get_error_code(), err.get_error_domain()
    if code == lv.VIR_ERR_INVALID_CONN:
        return True
    if _over_rpc_limit(err):
        return False
    return code in (lv.VIR_ERR_SYSTEM_ERROR, lv.VIR_ERR_INTERNAL_ERROR, lv.VIR_ERR_RPC) and domain in (
        lv.VIR_FROM_REMOTE,
        lv.VIR_FROM_RPC,
    )


# A connection attempt that meets silence this long is joined by another (ConnectionPart._open).
HEDGE_AFTER_SECONDS = 1.0
OPEN_ATTEMPTS = 3


class ConnectionPart:
    """The connection of LibvirtHypervisor (driver.py): one per adapter (libvirt connections
    are thread-safe), opened on first use and opened again, once per call, when it was lost."""

    def _init_connection(self, uri: str, connect_timeout: float | None) -> None:
        self.uri = uri
        self._conn = None
        self._lock = threading.Lock()
        # A remote host that does not answer must not hold a server thread for the
        # kernel's TCP connect timeout (minutes): the open is given this long.
        self.connect_timeout = connect_timeout

    def _open(self):
        lv = _libvirt()
        if not self.connect_timeout:
            return lv.open(self.uri)
        # An attempt that meets silence is joined, after HEDGE_AFTER_SECONDS, by another
        # (at most OPEN_ATTEMPTS in flight): one begun while libvirtd was starting again can
        # wait the whole timeout though the daemon answers a second later, and every call to
        # the host waits behind it (faults (a)). The first answer wins, success or error; the
        # others are closed when they come. All within connect_timeout.
        outcome: dict = {}
        done = threading.Event()
        guard = threading.Lock()

        def attempt():
            try:
                conn = lv.open(self.uri)
            except lv.libvirtError as e:
                conn, error = None, e
            else:
                error = None
            with guard:
                if done.is_set() or outcome.get("abandoned"):
                    if conn is not None:
                        conn.close()  # answered too late: nobody uses it
                    return
                outcome["conn"], outcome["error"] = conn, error
                done.set()

        deadline = time.monotonic() + self.connect_timeout
        for n in range(OPEN_ATTEMPTS):
            threading.Thread(target=attempt, name=f"libvirt-open {self.uri} #{n + 1}", daemon=True).start()
            left = deadline - time.monotonic()
            wait = left if n == OPEN_ATTEMPTS - 1 else min(HEDGE_AFTER_SECONDS, left)
            if done.wait(max(wait, 0)) or time.monotonic() >= deadline:
                break
        with guard:
            if not done.is_set():
                outcome["abandoned"] = True
                raise HostUnreachable(f"cannot connect to libvirt at {self.uri}: "
                                      f"no answer within {self.connect_timeout:g} s")
        if outcome["error"] is not None:
            raise outcome["error"]
        return outcome["conn"]

    def _connection(self):
        lv = _libvirt()
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except lv.libvirtError:
                    pass
                self._conn = None
            _start_event_loop()
            try:
                self._conn = self._open()
            except lv.libvirtError as e:
                raise HostUnreachable(f"cannot connect to libvirt at {self.uri}: {_msg(e)}") from e
            try:
                self._conn.setKeepAlive(KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
            except lv.libvirtError:
                pass  # local drivers without a daemon (the test driver) have no keepalive
            return self._conn

    def _forget(self, conn) -> None:
        # Dropped, not closed: another thread may still be using it; the
        # binding closes it when the last reference goes.
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def _call(self, what: str, op, *, retry: bool = True):
        """op(conn), with libvirt errors turned into HostError/HostUnavailable.

        A lost connection is opened again and op repeated once when `retry`
        (for operations that are safe to repeat).
        """
        lv = _libvirt()
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return op(conn)
            except lv.libvirtError as e:
                if not _connection_lost(e):
                    raise HostError(f"{what}: {_msg(e)}") from e
                self._forget(conn)
                if not retry or attempt == 2:
                    raise HostUnreachable(f"{what}: lost the connection to libvirt at {self.uri}: {_msg(e)}") from e
                log.warning("connection to libvirt at %s lost (%s); reconnecting", self.uri, _msg(e))

    def _undo(self, err: BaseException, what: str, undo) -> None:
        """Run undo(conn) after a failed create; if that fails too, raise CleanupFailed naming what is left."""
        try:
            self._call(f"clean up {what}", undo)
        except ControllerError as undo_err:
            message = err.message if isinstance(err, ControllerError) else repr(err)
            raise CleanupFailed(f"{message}; cleanup failed, {what} may remain: {undo_err.message}") from err
