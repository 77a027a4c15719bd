"""The Linux bridges that hold guests' taps: what a bridge learns from the frames a guest sends.

A bridge hands frames to the IEEE reserved group addresses (01:80:c2:00:00:00 to 0f: STP,
slow protocols, LLDP, ...) to the host without running the bridge family's prerouting hook,
and yet learns their source MAC on the port they came in by. The guests' NIC rules
(nft_ruleset.py) also sit on the input hook, which most of them pass before that learning,
but STP frames (with STP on) and LLDP frames meet no hook at all. A guest sending such a
frame with another guest's MAC (or the upstream router's) would move that MAC's forwarding
entry to its own port: the table still gives it none of that traffic (unicast reaches a
guest for its own MAC only), but the owner of the MAC loses it. `no_linklocal_learn 1`
stops the learning from those frames, whatever the table says; every bridge with a guest
tap has it on (set by the libvirt hook at each start, libvirt/guest_rules_hook.py, and by the
controller; the host check fails where it is off).

Only argv and the reading of `ip -j -d link show` live here: the channel that runs them
(this machine, a namespace, ssh) is the caller's.
"""

import json
import re

from common.errors import HostError, InvalidInput

# Linux interface names: 1 to 15 characters, no "/", ":" or white space; none starts with "-"
# here, so a name is never read as an option.
_IFNAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}")


def check_bridge_name(name: str) -> str:
    if not isinstance(name, str) or not _IFNAME.fullmatch(name):
        raise InvalidInput(f"not a bridge name: {name!r}")
    return name


def seal_argv(bridge: str) -> list[str]:
    """Stop `bridge` learning source MACs from link-local frames."""
    return ["ip", "link", "set", "dev", check_bridge_name(bridge), "type", "bridge", "no_linklocal_learn", "1"]


def show_argv(bridge: str) -> list[str]:
    return ["ip", "-j", "-d", "link", "show", "dev", check_bridge_name(bridge)]


def learns_link_local(listing: str) -> bool:
    """Whether the bridge of a `show_argv` listing learns from link-local frames."""
    try:
        [link] = json.loads(listing)
        info = link["linkinfo"]
        if info.get("info_kind") != "bridge":
            raise HostError(f"{link.get('ifname', '?')} is not a bridge")
        # A kernel or iproute2 too old to say counts as learning: the check then fails.
        return not info["info_data"].get("no_linklocal_learn", 0)
    except (ValueError, LookupError, TypeError, AttributeError):
        raise HostError("ip listed a bridge in a form this version does not read") from None
