"""GuestFirewall in memory: the fake for tests, and the rules of libvirt's test driver (the
sandbox), whose guests run nowhere."""

import threading
from collections.abc import Sequence

from host_adapters.network.guest_firewall import GuestFirewall, NicRules


class FakeGuestFirewall(GuestFirewall):
    """The rules in a set. `fail` makes every call raise it; `calls` records each call.
    Every tap is present but those in `missing_taps`; `sealed` holds the bridges sealed;
    `hook` says whether the host runs the libvirt hook."""

    def __init__(self):
        self.rules: set[NicRules] = set()
        self.missing_taps: set[str] = set()
        self.sealed: set[str] = set()
        self.hook = True
        self.bridges: tuple[str, ...] = ()
        self.fail: Exception | None = None
        self.calls: list[tuple[str, tuple[NicRules, ...]]] = []
        self._lock = threading.Lock()

    def _check(self, verb: str, nics) -> None:
        self.calls.append((verb, tuple(nics)))
        if self.fail is not None:
            raise self.fail

    def allow(self, nics: tuple[NicRules, ...]) -> None:
        with self._lock:
            self._check("allow", nics)
            self.rules |= set(nics)

    def forget(self, nics: tuple[NicRules, ...]) -> None:
        with self._lock:
            self._check("forget", nics)
            self.rules -= set(nics)

    def replace(self, old: tuple[NicRules, ...], new: tuple[NicRules, ...]) -> None:
        with self._lock:
            self._check("replace", new)
            self.rules = (self.rules - set(old)) | set(new)

    def allowed(self) -> set[NicRules]:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            return set(self.rules)

    def present(self, taps: Sequence[str]) -> set[str]:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            return set(taps) - self.missing_taps

    def seal(self, bridges: Sequence[str]) -> None:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            self.sealed |= set(bridges)

    def hooked(self) -> bool:
        return self.hook

    def locate(self, bridges: Sequence[str]) -> None:
        self.bridges = tuple(bridges)
