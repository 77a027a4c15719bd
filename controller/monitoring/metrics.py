"""The service's Prometheus metrics: every name, type and label in one place.

Each context gets a registry of its own (`metrics_of(ctx)`), never the library's global
one, so tests can build several apps in one process. Two kinds of values live here:

- counted as things happen: requests and their latency (by Falcon's route template, never
  the raw path, so a client cannot make new series), token checks and logins;
- read at scrape time by `StoreCollector` from what is already known: the database
  (instances, hosts, usage, the last reconcile's report), the file sizes of the database
  and its WAL, the host pool's back-off and the health monitor's last round. A scrape
  never calls a hypervisor host; `HostRefresher` does that on its own thread, bounded.

Served by api/metrics_server.py on the `[metrics]` address; every metric is listed in
docs/scaling.md, "Metrics".
"""

import heapq
import logging
import os
import sqlite3
import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily

from controller import limits
from controller.hosts.status_sync import sync_statuses

log = logging.getLogger(__name__)

PREFIX = "cloud_controller"
# The route label of a request no route answered (404), or refused before routing (413).
NO_ROUTE = "none"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Reads take milliseconds; host work (creates, deletes) seconds, up to minutes in its queue.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LOGIN_METHODS = ("password", "api_key")
# ok; failed (wrong credentials: 401); refused (429: throttled, or no hash slot free);
# invalid (400: a malformed body).
LOGIN_RESULTS = ("ok", "failed", "refused", "invalid")
# ok; missing (no token or id header); invalid (a wrong, expired or revoked token, a bad id).
TOKEN_RESULTS = ("ok", "missing", "invalid", "unavailable")
MIB = 1024 * 1024

# No `_created` series beside every counter and histogram: they double the series and no
# rule here reads them. The switch is the library's, for the whole process (the service's).
disable_created_metrics()


class ServiceMetrics:
    """The registry of one service and the metrics counted as things happen."""

    def __init__(self, ctx):
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests answered, by route template, "
                                "method and status code.", ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram(f"{PREFIX}_http_request_duration_seconds", "Time from a request's arrival in "
                                 "the app to its answer (a streamed list's body not included), by route template, "
                                 "method and status class (2xx..5xx).", ["route", "method", "status_class"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.token_checks = Counter(f"{PREFIX}_token_checks", "Authenticated requests' token checks, by result "
                                    "(ok, missing, invalid; unavailable: cloud auth could not say).", ["result"], registry=self.registry)
        self.logins = Counter(f"{PREFIX}_logins", "Token requests (POST /v1/auth/token), by credential (password, "
                              "api_key) and result (ok, failed, refused, invalid).", ["method", "result"],
                              registry=self.registry)
        # Every series known from the start at 0, so rate() sees the first failure.
        self._token_checks = {r: self.token_checks.labels(r) for r in TOKEN_RESULTS}
        self._logins = {(m, r): self.logins.labels(m, r) for m in LOGIN_METHODS for r in LOGIN_RESULTS}
        self._series: dict[tuple, tuple] = {}
        self.registry.register(StoreCollector(ctx))

    def request(self, *, route: str | None, method: str, status: int, seconds: float) -> None:
        # The series of a (route, method, status) are looked up once and kept: `labels()`
        # checks and joins its arguments under a lock on every call, a tenth of a GET's own
        # time (docs/performance.md). The keys are bounded: route templates, METHODS, statuses.
        series = self._series.get((route, method, status))
        if series is None:
            series = self._series_of(route, method, status)
        counter, latency = series
        counter.inc()
        latency.observe(seconds)

    def _series_of(self, route: str | None, method: str, status: int) -> tuple:
        label_route = route or NO_ROUTE
        label_method = method if method in METHODS else "other"  # any token is a method to waitress
        series = (self.requests.labels(label_route, label_method, str(status)),
                  self.latency.labels(label_route, label_method, f"{status // 100}xx"))
        if label_method != "other":  # a client's made-up method is not kept as a key
            self._series[(route, method, status)] = series
        return series

    def token_checked(self, result: str) -> None:
        self._token_checks[result].inc()

    def login(self, method: str, result: str) -> None:
        self._logins[(method, result)].inc()


_LOCK = threading.Lock()


def metrics_of(ctx) -> ServiceMetrics:
    """The context's metrics, made on first use (as controller.monitoring.health.monitor_of)."""
    if ctx.metrics is None:
        with _LOCK:
            if ctx.metrics is None:
                ctx.metrics = ServiceMetrics(ctx)
    return ctx.metrics


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


class StoreCollector:
    """The values read at each scrape: a few grouped queries over the database (no host call,
    no write), the database's file sizes, and what this process already knows of its hosts
    and health. A part whose read fails is left out and `scrape_error` says which."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)  # the context holds this collector: no cycle keeps it alive

    def describe(self):
        return []  # nothing read at registration; names are checked by the tests instead

    def collect(self):
        failed = _gauge("scrape_error", "1 when this part of the scrape could not be read (see the log).",
                        ("part",))
        parts = [("database_files", self._files), ("instances", self._instances), ("leases", self._leases),
                 ("hosts", self._hosts),
                 ("usage", self._usage), ("reconcile", self._reconcile), ("health", self._health)]
        if self._ctx.cloud_auth is not None:  # a controller following a cloud auth
            parts.append(("cloud_auth", self._cloud_auth))
        for part, read in parts:
            try:
                families = list(read())
            except (sqlite3.Error, OSError) as e:
                log.warning("metrics: %s not read: %s", part, e)
                failed.add_metric([part], 1)
                continue
            failed.add_metric([part], 0)
            yield from families
        yield failed

    def _cloud_auth(self):
        follower = self._ctx.cloud_auth
        if follower is None:
            return
        age = follower.age()
        family = _gauge("cloud_auth_feed_age_seconds", "Seconds since this controller last read cloud auth's "
                        "changes feed (-1: never); past [cloud_auth] offline_grace_seconds no token is accepted.", ())
        family.add_metric([], -1 if age is None else age)
        yield family
        seq = _gauge("cloud_auth_feed_seq", "The last change of cloud auth's feed this controller applied.", ())
        seq.add_metric([], follower.seq)
        yield seq

    def _files(self):
        sizes = _gauge("database_bytes", "Size of the SQLite database's files (file: db, wal).", ("file",))
        path = self._ctx.config.database_path
        for label, name in (("db", path), ("wal", f"{path}-wal")):
            try:
                sizes.add_metric([label], os.stat(name).st_size)
            except FileNotFoundError:
                sizes.add_metric([label], 0)  # no WAL between checkpoints of a closed database
        yield sizes

    def _instances(self):
        family = _gauge("instances", "Instances recorded, by host and status as last stored (lists and the "
                        "refresher bring statuses to the hosts' view).", ("host", "status"))
        for row in self._ctx.store.instance_counts():
            family.add_metric([row["host"], row["status"]], row["instances"])
        yield family

    def _leases(self):
        from controller.instances.lease_terms import lease_times

        now, until = lease_times(self._ctx)
        expiring, expired = self._ctx.store.lease_counts(now=now, until=until)
        family = _gauge("instances_expiring", "Instances whose lease ends within the first [leases] warn.")
        family.add_metric([], expiring)
        yield family
        family = _gauge("instances_expired", "Instances whose lease has ended (powered off, deleted [leases] keep "
                        "after the end unless renewed).")
        family.add_metric([], expired)
        yield family

    def _hosts(self):
        ctx = self._ctx
        pool = ctx.adapters.hosts if ctx.adapters is not None else None
        docs = {
            "host_enabled": "1 when the host takes new instances (not disabled).",
            "host_reachable": "1 unless the host failed to answer and is in its back-off ([hosts] retry_seconds), "
                              "as this process last found it.",
            "host_vcpus": "The host's CPUs as last read from libvirt.",
            "host_memory_bytes": "The host's memory as last read from libvirt.",
            "host_vcpu_limit": "vCPUs the host may allocate: CPUs x [capacity] cpu_allocation_ratio.",
            "host_memory_limit_bytes": "Memory the host may allocate: (memory - reserved_host_memory_mb) x "
                                       "ram_allocation_ratio.",
            "host_allocated_vcpus": "vCPUs of the flavors of the instances recorded on the host.",
            "host_allocated_memory_bytes": "Memory of the flavors of the instances recorded on the host.",
        }
        families = {name: _gauge(name, doc, ("host",)) for name, doc in docs.items()}
        for row in ctx.store.list_hosts():
            name = row["name"]
            values = {"host_enabled": int(bool(row["enabled"])),
                      "host_allocated_vcpus": row["allocated_vcpus"],
                      "host_allocated_memory_bytes": row["allocated_memory_mb"] * MIB}
            if pool is not None:
                values["host_reachable"] = int(pool.reachable(name))
            if row["vcpus"] is not None:  # capacity not read yet: no value rather than a false 0
                cpu_limit, ram_limit = limits.host_limits(ctx.config, vcpus=row["vcpus"], memory_mb=row["memory_mb"])
                values.update(host_vcpus=row["vcpus"], host_vcpu_limit=cpu_limit,
                              host_memory_bytes=row["memory_mb"] * MIB,
                              host_memory_limit_bytes=max(0, ram_limit) * MIB)
            for metric, value in values.items():
                families[metric].add_metric([name], value)
        yield from families.values()

    def _usage(self):
        ctx = self._ctx
        total = _gauge("usage", "What all users hold together, per limit kind.", ("kind",))
        at_limit = _gauge("users_at_limit", "Users holding at least their limit (not -1), per kind, among "
                          "those holding something or with an override.", ("kind",))
        highest = _gauge("usage_ratio_max", "The highest share of a limit any user holds, per kind.", ("kind",))
        top = _gauge("user_usage_ratio", "Share of their limit held by the [metrics] top_users users closest "
                     "to it, per kind (user: the user's id).", ("kind", "user"))
        rows = ctx.store.usage_by_user()
        # Each user's limits: its overrides over the config's, as admission reads them.
        in_force = [limits.in_force(ctx.config, {k: row[f"limit_{k}"] for k in limits.KINDS}) for row in rows]
        wanted = ctx.config.metrics.top_users
        for kind in limits.KINDS:
            ratios: list[tuple[float, str]] = []
            used_all = full = 0
            for row, limit_of in zip(rows, in_force):
                used, limit = row[kind], limit_of[kind]
                used_all += used
                if limit != limits.UNLIMITED:
                    full += used >= limit
                    ratios.append((used / limit if limit else 1.0, row["user_id"]))
            total.add_metric([kind], used_all)
            at_limit.add_metric([kind], full)
            highest.add_metric([kind], max((r for r, _ in ratios), default=0.0))
            # The closest to their limits, ties by id so that a scrape shows the same users again.
            for ratio, user in heapq.nsmallest(wanted, ratios, key=lambda item: (-item[0], item[1])):
                if ratio > 0:
                    top.add_metric([kind, user], ratio)
        yield from (total, at_limit, highest, top)

    def _reconcile(self):
        remaining = _gauge("reconcile_drift", "Drift the last reconcile left unrepaired, per kind.", ("kind",))
        fixed = _gauge("reconcile_fixed", "Drift the last reconcile repaired, per kind.", ("kind",))
        when = _gauge("reconcile_last_run_timestamp_seconds", "When the last reconcile (any process) finished.")
        report = self._ctx.store.last_reconcile()
        if report is not None:
            when.add_metric([], report["finished_at"])
            for item in report["drift"]:
                remaining.add_metric([item["kind"]], item["remaining"])
                fixed.add_metric([item["kind"]], item["found"] - item["remaining"])
        yield from (remaining, fixed, when)

    def _health(self):
        family = _gauge("health_check_ok", "1 when the check passed in the last round behind /healthz.",
                        ("check",))
        monitor = self._ctx.health_monitor
        checks = monitor.current() if monitor is not None else None  # never runs a check
        for check in checks or ():
            family.add_metric([check["name"]], int(check["ok"]))
        yield family


class HostRefresher:
    """Every `seconds`, the statuses of every recorded host's instances brought to the host's
    view (controller/hosts/status_sync.py: at most one call per host, several hosts at once, each
    bounded by the host pool's connect timeout and back-off). A host that does not answer is
    marked unreachable by the pool, which is what a scrape then reads. One thread: a host that
    hangs delays the next round, never adds threads."""

    def __init__(self, ctx, seconds: float):
        self._ctx, self.seconds = ctx, seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.seconds <= 0 or self._ctx.adapters is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="metrics-host-refresher", daemon=True)
        self._thread.start()

    def refresh(self) -> set[str]:
        """One round; the hosts that did not answer."""
        names = [row["name"] for row in self._ctx.store.list_hosts()]
        return sync_statuses(self._ctx, names)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the refresher must outlive one bad round
                log.exception("metrics: a round of host status reads failed")
            self._stop.wait(self.seconds)

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
