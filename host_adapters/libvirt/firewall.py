"""The guests' NIC rules on a host (guest_firewall.py), as LibvirtHypervisor (driver.py)
keeps them: written before every start it makes, removed after a domain is removed, and
restored by the host check.

Each NIC's tap is named by the domain (`<target dev>`, guest_firewall.tap_name) and its
rules kept in the domain's metadata (xml.py: nic_rules_of), so a start or a restore reads
what to write from the host itself, whoever defined the domain.
"""

import logging
import threading
import time

from common.errors import ControllerError
from host_adapters.guest import GuestSpec
from host_adapters.guest_firewall import GuestFirewall, NicRules, host_tag, is_tap
from host_adapters.guest_firewall_choice import guest_firewall_for
from host_adapters.libvirt import test_driver
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt.connection import _libvirt
from host_adapters.libvirt.nic_filters import guest_rules, rules_of

log = logging.getLogger(__name__)

# How often the host check writes the rules of every running domain again (also at once
# after each new connection: a libvirtd or host that restarted may have lost the table).
RESTORE_SECONDS = 60.0


def domain_rules(xml: str) -> tuple[NicRules, ...]:
    """The NicRules of a domain's NICs that have a tap of ours and rules in its metadata (a
    domain of an earlier version has neither: libvirt's nwfilter filters it)."""
    kept = domain_xml.nic_rules_of(xml)
    found = []
    for nic in domain_xml.interfaces_of(xml):
        ref = kept.get(nic.mac)
        if ref is not None and nic.target_dev and is_tap(nic.target_dev):
            rules = rules_of(nic.target_dev, nic.mac, ref)
            if rules is not None:
                found.append(rules)
    return tuple(found)


class FirewallPart:
    """`firewall` writes the rules (default: the one for the URI, guest_firewall_choice.py);
    `tap_tag` is this host's part of its taps' names."""

    def _init_firewall(self, uri: str, firewall: GuestFirewall | None) -> None:
        self.firewall = firewall if firewall is not None else guest_firewall_for(uri)
        self.tap_tag = host_tag(uri)
        # Held by a restore and by a removal: a restore that read a domain's rules before its
        # removal must not write them back after it.
        self._rules_lock = threading.Lock()
        self._restored_on = None  # the connection the last restore ran on
        self._restored_at = 0.0

    def _guest_rules(self, guest: GuestSpec) -> tuple[NicRules, ...]:
        return guest_rules(guest, self.tap_tag)

    def _allow_domain(self, dom) -> None:
        """Write the rules of a defined domain's NICs, before it starts."""
        rules = domain_rules(dom.XMLDesc(_libvirt().VIR_DOMAIN_XML_INACTIVE))
        if rules:
            self.firewall.allow(rules)

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
        every RESTORE_SECONDS. Only adds: what a removal missed stays (see _forget_rules)."""
        if test_driver.is_test_driver(conn):
            return  # its guests run nowhere
        if conn is self._restored_on and time.monotonic() - self._restored_at < RESTORE_SECONDS:
            return
        lv = _libvirt()
        with self._rules_lock:
            rules: list[NicRules] = []
            for dom in conn.listAllDomains(lv.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                if not dom.name().startswith(self._names.prefix):
                    continue
                try:
                    rules += domain_rules(dom.XMLDesc(0))
                except lv.libvirtError:
                    continue  # gone meanwhile
            # Also with none: the table is made, and a host without nft fails its check.
            self.firewall.allow(tuple(rules))
        self._restored_on, self._restored_at = conn, time.monotonic()
