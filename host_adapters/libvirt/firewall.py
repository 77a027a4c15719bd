"""The guests' NIC rules on a host (network/guest_firewall.py), as LibvirtHypervisor (driver.py)
keeps them: written before every start it makes, removed after a domain is removed, and
restored by the host check.

Each NIC's tap is named by the domain (`<target dev>`, guest_firewall.tap_name) and its
rules kept in the domain's metadata (xml.py: nic_rules_of), so a start or a restore reads
what to write from the host itself, whoever defined the domain.
"""

import contextlib
import logging
import threading
import time

from common.errors import ControllerError, HostError, HostUnavailable
from host_adapters.guests.guest import GuestSpec
from host_adapters.network.guest_firewall import TAP_PREFIX, GuestFirewall, NicRules, host_tag
from host_adapters.network.guest_firewall_choice import guest_firewall_for
from host_adapters.libvirt import test_driver
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt.connection import _libvirt
from host_adapters.libvirt.nic_filters import domain_rules, guest_rules

log = logging.getLogger(__name__)

# How often the host check writes the rules of every running domain again (also at once
# after each new connection: a libvirtd or host that restarted may have lost the table).
RESTORE_SECONDS = 60.0


class FirewallPart:
    """`firewall` writes the rules (default: the one for the URI, network/guest_firewall_choice.py);
    `tap_tag` is this host's part of its taps' names."""

    def _init_firewall(self, uri: str, firewall: GuestFirewall | None) -> None:
        self.firewall = firewall if firewall is not None else guest_firewall_for(uri)
        self.tap_tag = host_tag(uri)
        # Held by a restore and by a removal: a restore that read a domain's rules before its
        # removal must not write them back after it.
        self._rules_lock = threading.Lock()
        self._restored_on = None  # the connection the last restore ran on
        self._restored_at = 0.0
        # Taps whose rules a start of ours is writing: not yet claimed by a running domain,
        # and not for the restore to remove.
        self._pending_taps: set[str] = set()
        self._located: str | None = None  # the private network's bridge, told to the firewall

    def _locate(self, conn, net) -> None:
        """Tell the firewall the private network's bridge (network/nft_guest_firewall.py: where the
        rules go is where the guests' bridges are)."""
        if self._located is not None or test_driver.is_test_driver(conn):
            return
        try:
            name = net.bridgeName()
        except _libvirt().libvirtError:
            return  # not running: the next look-up tries again
        self.firewall.locate((name,))
        self._located = name

    @contextlib.contextmanager
    def _writing(self, rules: tuple[NicRules, ...]):
        """While a start of ours writes `rules` and starts their domain."""
        taps = {r.tap for r in rules}
        with self._rules_lock:
            self._pending_taps |= taps
        try:
            yield
        finally:
            with self._rules_lock:
                self._pending_taps -= taps

    def _check_taps(self, rules: tuple[NicRules, ...], what: str) -> None:
        """After a start: each NIC's tap is where its rules were written. A tap elsewhere would
        pass frames no rule sees: HostError, and the caller stops the domain."""
        taps = [r.tap for r in rules]
        missing = sorted(set(taps) - self.firewall.present(taps)) if taps else []
        if missing:
            raise HostError(f"{what}: the tap {', '.join(missing)} of its NICs is not on {self._firewall_where()}, "
                            "where its network rules were written; it was stopped")

    def _firewall_where(self) -> str:
        return getattr(self.firewall, "where", self.uri)

    def _guest_rules(self, guest: GuestSpec) -> tuple[NicRules, ...]:
        return guest_rules(guest, self.tap_tag)

    def _start_filtered(self, dom, what: str, start) -> None:
        """Write the rules of a defined domain's NICs, start it with `start(dom)`, and check its
        taps are where the rules went (stopped when they are not)."""
        rules = domain_rules(dom.XMLDesc(_libvirt().VIR_DOMAIN_XML_INACTIVE))
        with self._writing(rules):
            if rules:
                self.firewall.allow(rules)
            start(dom)
            self._stop_unless_taps(dom, rules, what)

    def _stop_unless_taps(self, dom, rules: tuple[NicRules, ...], what: str) -> None:
        try:
            self._check_taps(rules, what)
        except ControllerError:
            try:
                dom.destroy()
            except _libvirt().libvirtError:
                pass  # stopped meanwhile
            raise

    def _forget_rules(self, rules: tuple[NicRules, ...], what: str) -> None:
        """Remove the rules of a removed domain's NICs. A failure is logged, not raised: the
        domain is gone, and elements left behind match no tap (docs/scaling.md, "Guest
        network rules", says how to remove them)."""
        if not rules:
            return
        with self._rules_lock:
            try:
                self.firewall.forget(rules)
            except ControllerError as e:
                log.warning("%s: the network rules of its NICs (%s) were not removed from %s: %s", what,
                            ", ".join(r.tap for r in rules), self.uri, e.message)

    def _restore_rules(self, conn) -> None:
        """Write the rules of every running domain of ours again, after each new connection and
        every RESTORE_SECONDS, and remove the elements of this host's taps that no running
        domain claims (a removal that failed, a domain stopped outside the controller). Each
        running domain's rules come from its persistent definition, which set_guest changes (the
        live one keeps what it started with). Then every such tap must be where the rules are."""
        if test_driver.is_test_driver(conn):
            return  # its guests run nowhere
        if conn is self._restored_on and time.monotonic() - self._restored_at < RESTORE_SECONDS:
            return
        lv = _libvirt()
        ours = f"{TAP_PREFIX}{self.tap_tag}-"
        with self._rules_lock:
            # The table first, the domains second: elements a start outside the controller
            # (the hook) writes meanwhile are not in this listing, so never taken for stale
            # (libvirt lists a domain as active from before its hook's `prepare`).
            held = self.firewall.allowed()
            rules: list[NicRules] = []
            bridges: set[str] = set()
            for dom in conn.listAllDomains(lv.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                if not dom.name().startswith(self._names.prefix):
                    continue
                try:
                    rules += domain_rules(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))
                    bridges |= domain_xml.bridges_of(dom.XMLDesc(0))
                except lv.libvirtError:
                    continue  # gone meanwhile
            claimed = {r.tap for r in rules} | self._pending_taps
            stale = tuple(r for r in held if r.tap.startswith(ours) and r.tap not in claimed)
            # Also with none: the table is made, and a host without nft fails its check.
            self.firewall.replace(stale, tuple(rules))
            if self._located:
                bridges.add(self._located)
            self.firewall.seal(sorted(bridges))
            taps = [r.tap for r in rules]
            missing = set(taps) - self.firewall.present(taps)
        if missing:
            # A domain stopped meanwhile takes its tap with it: only a running one's counts.
            running = {r.tap for dom in conn.listAllDomains(lv.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
                       if dom.name().startswith(self._names.prefix)
                       for r in _rules_or_none(dom, lv)}
            missing &= running
        if missing:
            raise HostUnavailable(
                f"the guests' taps {', '.join(sorted(missing))} are not on {self._firewall_where()}, where "
                f"their network rules are written: those guests' frames pass unfiltered; see the "
                "\"Guest network rules\" runbook")
        if not self.firewall.hooked():
            raise HostUnavailable(
                f"{self._firewall_where()} does not run the libvirt hook that writes a guest's network rules "
                "in every start (guests started by virsh or at boot would pass unfiltered): run "
                "scripts/setup-host.sh on that host, then restart libvirtd there")
        self._restored_on, self._restored_at = conn, time.monotonic()


def _rules_or_none(dom, lv) -> tuple[NicRules, ...]:
    try:
        return domain_rules(dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))
    except lv.libvirtError:
        return ()
