"""Many hypervisor hosts: one Hypervisor per host, and which hosts answer.

A HostPool hands out the Hypervisor of a host (built on first use from the
host's record: its libvirt URI, storage pool and network; one shared
connection per host). Every call through it is guarded: a host that did not
answer (HostUnreachable) is marked unreachable for `retry_seconds`, during
which calls to it fail at once instead of waiting on it again; the first
call after the back-off tries it again. What is unreachable is known per
process (the service's threads share it). Tests build a pool over fakes:
FakeHosts in host_adapters/fake_hypervisor.py.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import ControllerError, HostUnreachable
from host_adapters.hypervisor import Hypervisor


@dataclass(frozen=True)
class HostSpec:
    """What a Hypervisor is built from: a host record's connection settings."""

    name: str
    uri: str
    storage_pool: str
    network: str


# The Hypervisor interface's public methods: the guard wraps each.
_METHODS = sorted(n for n, v in vars(Hypervisor).items() if callable(v) and not n.startswith("_"))


class _Health:
    """When each host last failed to answer, and why."""

    def __init__(self, retry_seconds: float, clock: Callable[[], float]):
        self.retry_seconds, self.clock = retry_seconds, clock
        self._down: dict[str, tuple[float, str]] = {}
        # When each host last answered a call. A call that began before that answer and
        # then failed (a connect begun while libvirtd was still starting, which waits out
        # connect_timeout) says nothing new: it must not put a host that answers since back
        # into its back-off (faults (a): creates 503 for seconds after libvirtd came back).
        self._answered_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, name: str, why: str, *, began: float | None = None) -> None:
        """The host did not answer a call (begun at `began`, by this clock; None: now)."""
        with self._lock:
            if began is not None and self._answered_at.get(name, float("-inf")) > began:
                return
            self._down[name] = (self.clock(), why)

    def down(self) -> list[str]:
        with self._lock:
            return list(self._down)

    def answered(self, name: str) -> None:
        # A dict store is atomic under the GIL: the common case (a host that is up) takes no lock.
        self._answered_at[name] = self.clock()
        if name in self._down:
            with self._lock:
                self._down.pop(name, None)

    def refusal(self, name: str) -> HostUnreachable | None:
        """The error for a call to a host in its back-off; None when it may be tried."""
        down = self._down.get(name)
        if down is None:
            return None
        since, why = down
        left = self.retry_seconds - (self.clock() - since)
        if left <= 0:
            return None
        return HostUnreachable(f"hypervisor host {name} is unreachable ({why}); next try in {left:.0f} s")

    def reachable(self, name: str) -> bool:
        return self.refusal(name) is None


class GuardedHypervisor(Hypervisor):
    """A host's Hypervisor behind its back-off (see the module docstring)."""

    def __init__(self, name: str, inner: Hypervisor, health: _Health):
        self.name, self.inner, self._health = name, inner, health


def _guarded(method: str):
    def call(self: GuardedHypervisor, *args, **kwargs):
        refusal = self._health.refusal(self.name)
        if refusal is not None:
            raise refusal
        began = self._health.clock()
        try:
            result = getattr(self.inner, method)(*args, **kwargs)
        except HostUnreachable as e:
            self._health.failed(self.name, e.message, began=began)
            raise
        self._health.answered(self.name)
        return result

    call.__name__ = method
    call.__doc__ = getattr(Hypervisor, method).__doc__
    return call


for _method in _METHODS:
    setattr(GuardedHypervisor, _method, _guarded(_method))


class HostPool:
    """The Hypervisor of each host, built by `build(spec)` on first use and kept."""

    def __init__(self, build: Callable[[HostSpec], Hypervisor], *, retry_seconds: float = 30,
                 clock: Callable[[], float] = time.monotonic):
        self._build = build
        self._health = _Health(retry_seconds, clock)
        self._built: dict[str, tuple[HostSpec, GuardedHypervisor]] = {}
        self._lock = threading.Lock()
        # Set once the config's own host is recorded in this process (controller/hosts/host_routing.py).
        self.config_host_recorded = False

    def hypervisor(self, spec: HostSpec) -> Hypervisor:
        """The host's Hypervisor; built again when its record's settings changed."""
        built = self._built.get(spec.name)
        if built is not None and built[0] == spec:
            return built[1]
        with self._lock:
            built = self._built.get(spec.name)
            if built is None or built[0] != spec:
                built = (spec, GuardedHypervisor(spec.name, self._build(spec), self._health))
                self._built[spec.name] = built
            return built[1]

    def built(self, name: str) -> Hypervisor | None:
        found = self._built.get(name)
        return found[1] if found else None

    def forget(self, name: str) -> None:
        with self._lock:
            self._built.pop(name, None)
        self._health.answered(name)

    def reachable(self, name: str) -> bool:
        """False while the host is in its back-off after failing to answer."""
        return self._health.reachable(name)

    def mark_unreachable(self, name: str, why: str) -> None:
        self._health.failed(name, why)

    def in_back_off(self) -> list[str]:
        """The hosts marked unreachable (their back-off may have run out)."""
        return self._health.down()

    def try_again(self, name: str) -> bool:
        """Ask a host marked unreachable once, now, whatever is left of its back-off (a
        bounded connect): one that answers, even with an error, takes calls again at once.
        The service's health refresher does this every round, so a host that comes back
        takes new work within seconds rather than after the rest of `retry_seconds`."""
        built = self._built.get(name)
        if built is None:
            return False  # never built here: nothing to ask (controller.hosts.host_routing.hypervisor_of_host builds it)
        try:
            built[1].inner.host_capacity()
        except HostUnreachable:
            return False  # still down; its back-off is left as it was
        except ControllerError:
            pass  # it answered
        self._health.answered(name)
        return True
