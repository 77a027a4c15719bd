"""The guests' NIC rules written by the host itself, whoever starts a domain: a libvirt
`qemu` hook and a unit that loads the base table at boot, before libvirt starts.

- At boot, UNIT runs `cloud-guest-rules base` before libvirtd, virtqemud and
  libvirt-guests: the table (nft_ruleset.base) with no elements, so a tap named cc-*
  passes nothing until its NIC's elements are written (fail closed), whatever starts a
  domain first.
- libvirt runs every executable of /etc/libvirt/hooks/qemu.d/ at each stage of a domain's
  life, with the domain's XML on stdin; HOOK_PATH hands three stages to
  `cloud-guest-rules libvirt-hook` (hook_script):
  - `prepare` (before QEMU runs and before the taps exist): the domain's NIC elements,
    read from its own metadata exactly as the controller reads them (domain_rules), in
    one transaction with the table itself. A failure exits 1, which aborts the start with
    our message in libvirt's error: no start path runs a guest unfiltered.
  - `start` (the taps exist, each on its bridge): every bridge of the domain's cc-* taps
    stops learning MACs from link-local frames (network/bridge_ports.py says why).
  - `release` (the domain has stopped, its taps are gone): its elements are removed.
  A domain without our metadata (`cc:nic-rules`) is left alone.

The controller still writes the rules before the starts it makes (libvirt/firewall.py): a
second line, and what covers a host where the hook is not installed yet.

A hook runs as a child of libvirtd, in libvirtd's own network namespace (so `nft` runs as
it is), while libvirtd holds the domain: it must never call libvirt, which would deadlock,
and every command it runs has a timeout.
"""

import json
import shlex
import xml.etree.ElementTree as ET

from common.errors import CommandError, ControllerError, HostError, InvalidInput
from host_adapters import subp
from host_adapters.network import bridge_ports, nft_ruleset
from host_adapters.network.guest_firewall import HOOK_PATH as _HOOK_PATH
from host_adapters.network.guest_firewall import is_tap
from host_adapters.libvirt import xml as domain_xml
from host_adapters.libvirt.nic_filters import domain_rules

# Where scripts/setup-host.sh installs hook_script (defined beside GuestFirewall.hooked(),
# which looks for it).
HOOK_PATH = _HOOK_PATH
UNIT = "cloud-controller-guest-rules.service"
# The stages the hook acts at; libvirt's others (migrate, restore, started, stopped, ...) are no-ops.
STAGES = ("prepare", "start", "release")

NFT_TIMEOUT = 10.0  # one transaction: milliseconds; a hung nft must not hold a start for ever
IP_TIMEOUT = 5.0


def is_ours(xml: str) -> bool:
    """Whether a domain document has NIC rules of ours in its metadata."""
    return domain_xml.NIC_RULES_NS in xml and bool(domain_xml.nic_rules_of(xml))


def domain_taps(xml: str) -> tuple[str, ...]:
    """The domain's taps named cc-* (with or without rules: each one's bridge is sealed)."""
    return tuple(dict.fromkeys(n.target_dev for n in domain_xml.interfaces_of(xml)
                               if n.target_dev and is_tap(n.target_dev)))


def load_base() -> None:
    """The table, its sets and chains, with the elements it already holds (none at boot)."""
    _nft("load the guests' network table", "\n".join(nft_ruleset.base()) + "\n")


def prepare(xml: str) -> None:
    """Write the domain's NIC elements, and the table with them."""
    _nft("write its NICs' network rules", nft_ruleset.batch(add=domain_rules(xml)))


def release(xml: str) -> None:
    """Remove the domain's NIC elements (those already gone are no error)."""
    _nft("remove its NICs' network rules", nft_ruleset.batch(remove=domain_rules(xml)))


def seal_bridges(xml: str) -> None:
    """Stop the bridges of the domain's taps learning from link-local frames."""
    bridges = dict.fromkeys(bridge_of(tap) for tap in domain_taps(xml))
    for bridge in bridges:
        _run(f"seal bridge {bridge}", bridge_ports.seal_argv(bridge), timeout=IP_TIMEOUT)


def bridge_of(tap: str) -> str:
    """The bridge a tap is a port of. A tap on no bridge is an error: the table filters
    bridge ports only, so its frames would meet no rule."""
    if not is_tap(tap):
        raise InvalidInput(f"not a guest tap name: {tap!r}")
    done = _run(f"read tap {tap}", ["ip", "-j", "link", "show", "dev", tap], timeout=IP_TIMEOUT)
    try:
        master = json.loads(done.stdout)[0].get("master")
    except (ValueError, LookupError, TypeError, AttributeError):
        raise HostError(f"ip listed tap {tap} in a form this version does not read") from None
    if not master:
        raise HostError(f"tap {tap} is on no bridge: its network rules would not apply")
    return bridge_ports.check_bridge_name(master)


def on_libvirt(name: str, stage: str, xml: str) -> None:
    """What the hook does for libvirt's `stage` of domain `name`, given its XML."""
    if stage not in STAGES:
        return
    try:
        if not is_ours(xml):
            return
        if stage == "prepare":
            prepare(xml)
        elif stage == "start":
            seal_bridges(xml)
        else:
            release(xml)
    except ControllerError as e:
        raise type(e)(f"domain {name}: {e.message}") from None
    except ET.ParseError as e:
        raise InvalidInput(f"domain {name}: its XML does not parse: {e}") from None


def hook_script(program: str) -> str:
    """The /bin/sh script installed at HOOK_PATH. At `prepare` and `release` it runs `program`
    (this checkout's cloud-guest-rules), which writes or removes the domain's elements. At
    `start` it seals the bridges of the domain's taps itself, with `ip` alone: libvirt runs
    that stage of one start after another (measured: a Python program there halved the pace
    of a burst of creates), and a tap's bridge needs no parsing but its name. Every start of
    every domain on the machine runs it, so others' domains cost a `case` or a grep and, were
    `program` gone, a grep: only a domain with rules of ours to write is refused then."""
    if not program.startswith("/") or "\n" in program:
        raise InvalidInput(f"not an absolute path: {program!r}")
    quoted, mark = shlex.quote(program), shlex.quote(domain_xml.NIC_RULES_NS)
    return f"""#!/bin/sh
# The guests' NIC rules at each start and stop of a domain of the cloud controller
# (installed by its scripts/setup-host.sh). libvirt passes: NAME STAGE SUBSTAGE EXTRA, and
# the domain's XML on stdin; a non-zero exit at prepare or start aborts the start.
case "$2" in
  prepare|release) ;;
  start)
    # Each bridge holding one of the domain's taps (cc-, hex digits and dashes: nothing else
    # is matched) learns no MAC address from link-local frames; a tap on no bridge aborts.
    # (libvirt quotes attributes with ', ElementTree with ": either is taken).
    for tap in $(grep -oE "<target dev=[\\"']cc-[0-9a-f-]+" | sed 's/.*dev=.//'); do
      bridge=$(ip -o link show dev "$tap" | sed -n 's/.* master \\([^ ]*\\) .*/\\1/p')
      if [ -z "$bridge" ]; then
        echo "cloud-controller hook: tap $tap is on no bridge: its network rules would not apply" >&2
        exit 1
      fi
      ip link set dev "$bridge" type bridge no_linklocal_learn 1 || exit 1
    done
    exit 0 ;;
  *) exit 0 ;;
esac
if [ -x {quoted} ]; then
  exec {quoted} libvirt-hook "$@"
fi
if grep -q -F {mark}; then
  echo "cloud-controller hook: "{quoted}" is missing; run scripts/setup-host.sh again" >&2
  exit 1
fi
exit 0
"""


def _nft(what: str, text: str) -> None:
    _run(what, ["nft", "-f", "-"], timeout=NFT_TIMEOUT, input=text)


def _run(what: str, argv: list[str], *, timeout: float, input: str | None = None):
    try:
        return subp.run(argv, timeout=timeout, input=input)
    except CommandError as e:
        raise HostError(f"cannot {what}: {argv[0]}: {_reason(e.stderr)}") from None
    except ControllerError as e:
        raise HostError(f"cannot {what}: {e.message}") from None


def _reason(stderr: str) -> str:
    """The line of a command's stderr that says what went wrong (nft follows its "Error:"
    line with the offending rule and a row of carets)."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    for line in lines:
        if "Error:" in line:
            return line[line.index("Error:"):]
    return lines[0] if lines else "no output"
