"""The Prometheus endpoint `cloud-agent serve` runs on the `[metrics]` address, never the API's.

The exposition is prometheus_client's own (`make_wsgi_app` over the service's registry,
controller/monitoring/metrics.py), served at `/metrics` by a small waitress server of its own: one
request thread (a scrape reads the database once; scrapes wait their turn rather than add
threads), idle and slow connections closed soon (api/server.py's deadline). Any local user
can connect to the address, so held connections must never keep a scrape out: when all
_SLOTS are taken, a new connection closes the oldest one that is not being served (idle,
or with a request still trickling in), as OldestIdleMakeRoom below. It runs on a thread
of its own next to the host refresher and is stopped with the service.
"""

import logging
import threading

from prometheus_client import make_wsgi_app
from waitress import create_server
from waitress import wasyncore

from api.server import RequestDeadline, _listeners
from controller.context import Context
from controller.errors import InvalidInput
from controller.monitoring.metrics import HostRefresher, metrics_of

log = logging.getLogger(__name__)

PATH = "/metrics"
# A scraper or two, and whoever looks by hand; past that, the oldest connection not being
# served makes room for a new one. waitress's own limit is a little higher (its map also holds
# the listener and its wake-up pipe), so it never stops accepting on its own.
_SLOTS = 64
_CONNECTIONS = _SLOTS + 16
_TIMEOUT_SECONDS = 10


class OldestIdleMakeRoom:
    """Keeps a waitress listener at `slots` connections: after each accept past that, the
    oldest connections not being served (no request handed to a thread) are closed. Runs in
    the listener's accept, on the event loop's thread, as waitress's own maintenance does.
    A new connection is the last to go, so a scraper that sends its request at once is
    served whatever others hold open."""

    def __init__(self, listener, slots: int):
        self.listener, self.slots = listener, slots
        self.closed = self._reported = 0
        accept = listener.handle_accept

        def handle_accept():
            accept()
            self.make_room()

        listener.handle_accept = handle_accept

    def make_room(self) -> None:
        channels = list(self.listener.active_channels.values())
        extra = len(channels) - self.slots
        if extra <= 0:
            return
        idle = sorted((c for c in channels if not c.requests), key=lambda c: c.creation_time)
        for channel in idle[:extra]:
            channel.handle_close()
            self.closed += 1
        if self.closed and (not self._reported or self.closed - self._reported >= 100):
            self._reported = self.closed
            log.warning("metrics endpoint: %d connection(s) closed so far to make room for new ones "
                        "(someone holds connections open)", self.closed)


def metrics_app(ctx: Context):
    """The WSGI app: the registry's exposition at /metrics, 404 elsewhere."""
    expose = make_wsgi_app(metrics_of(ctx).registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at GET {PATH}\n".encode()]
        return expose(environ, start_response)

    return app


class MetricsServer:
    """The endpoint and the host refresher, started together and stopped together."""

    def __init__(self, ctx: Context, *, host: str, port: int):
        self._map: dict = {}
        try:
            self.server = create_server(metrics_app(ctx), map=self._map, host=host, port=port, threads=1,
                                        connection_limit=_CONNECTIONS, channel_timeout=_TIMEOUT_SECONDS,
                                        cleanup_interval=1, max_request_body_size=0, asyncore_use_poll=True,
                                        ident="cloud-controller-metrics")
        except OSError as e:
            raise InvalidInput(f"metrics endpoint not started: cannot listen on {host}:{port} ([metrics] "
                               f"listen_host, listen_port): {e.strerror or e}") from None
        RequestDeadline.attach(self.server, _TIMEOUT_SECONDS)
        for listener in _listeners(self.server):
            OldestIdleMakeRoom(listener, _SLOTS)
        self.refresher = HostRefresher(ctx, ctx.config.metrics.refresh_seconds)
        self._thread = threading.Thread(target=self.server.run, name="metrics-server", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.effective_host, self.server.effective_port

    def start(self) -> "MetricsServer":
        self._thread.start()
        self.refresher.start()
        log.info("metrics on http://%s:%s%s", *self.address, PATH)
        return self

    def stop(self) -> None:
        self.refresher.stop()
        self.server.task_dispatcher.shutdown()
        wasyncore.close_all(self._map)  # the loop ends once its map is empty
        self._thread.join(5)


def start_metrics(ctx: Context, *, port: int | None = None, api_address: tuple[str, int] | None = None
                  ) -> MetricsServer | None:
    """The service's metrics endpoint when `[metrics] enabled` or a port is given (`serve
    --metrics-port`); None when off. Refused on the API's own address."""
    settings = ctx.config.metrics
    if not settings.enabled and port is None:
        return None
    port = settings.listen_port if port is None else port
    if api_address is not None and port == api_address[1] and port != 0:
        raise InvalidInput(f"[metrics] listen_port {port} is the API's port: give the metrics a port of their own")
    return MetricsServer(ctx, host=settings.listen_host, port=port).start()
