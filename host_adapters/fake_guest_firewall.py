"""GuestFirewall in memory: the fake for tests, and the rules of libvirt's test driver (the
sandbox), whose guests run nowhere."""

import threading

from host_adapters.guest_firewall import GuestFirewall, NicRules


class FakeGuestFirewall(GuestFirewall):
    """The rules in a set. `fail` makes every call raise it; `calls` records each call."""

    def __init__(self):
        self.rules: set[NicRules] = set()
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
