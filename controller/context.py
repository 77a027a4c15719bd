"""What every service function needs, built once per process."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.audit.trail import AnonymousFailures
from controller.config import Config
from controller.security.crypto import Passwords, SecretBox
from controller.status_cursors import StatusCursors
from controller.store import Store
from controller.security.throttle import FailureThrottle


@dataclass
class Context:
    config: Config
    store: Store
    passwords: Passwords
    throttle: FailureThrottle
    adapters: object = None  # host_adapters.Adapters; None for the user interface alone
    background: object = None  # controller.background.Background in the server; None: work runs at once
    anonymous_failures: AnonymousFailures | None = None  # counted instead of one audit row each
    status_cursors: StatusCursors = field(default_factory=StatusCursors, repr=False)
    _secret_box: SecretBox | None = field(default=None, repr=False)
    # controller.monitoring.health.HealthMonitor, made by controller.monitoring.health.monitor_of on first use.
    health_monitor: object = field(default=None, repr=False)
    # controller.monitoring.metrics.ServiceMetrics (its own Prometheus registry), made by metrics_of on first use.
    metrics: object = field(default=None, repr=False)
    # controller.cloud_auth.follower.Follower when [cloud_auth] url is set: users and tokens come from there.
    cloud_auth: object = field(default=None, repr=False)
    # Seconds since the epoch, for the leases (controller/instances/leases.py); tests give their own.
    clock: Callable[[], float] = field(default=time.time, repr=False)

    @property
    def secret_box(self) -> SecretBox:
        # Loaded on first use so a missing key file shows up in /healthz instead of a crash.
        if self._secret_box is None:
            self._secret_box = SecretBox(self.config.auth.secret_key_file)
        return self._secret_box



def build_context(config: Config, *, adapters=None, store: Store | None = None) -> Context:
    store = store or Store(config.database_path)
    return Context(
        config=config,
        store=store,
        passwords=Passwords(
            time_cost=config.auth.argon2_time_cost,
            memory_kib=config.auth.argon2_memory_kib,
            parallelism=config.auth.argon2_parallelism,
            max_concurrent_checks=config.auth.max_password_checks,
            max_checks_per_source=config.auth.max_password_checks_per_source,
        ),
        throttle=FailureThrottle(
            max_failures=config.auth.max_failures,
            window_seconds=config.auth.failure_window_seconds,
            lockout_seconds=config.auth.lockout_seconds,
        ),
        adapters=adapters,
        anonymous_failures=AnonymousFailures(
            store, interval_seconds=config.audit.anonymous_interval_seconds
        ),
    )
