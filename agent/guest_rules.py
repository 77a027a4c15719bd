"""cloud-guest-rules: the guests' NIC rules on this host without the controller
(host_adapters/libvirt/guest_rules_hook.py says when each part runs).

  cloud-guest-rules base
      load the guests' table with no elements: taps named cc-* pass nothing (at boot)
  cloud-guest-rules libvirt-hook NAME STAGE SUBSTAGE EXTRA < DOMAIN.xml
      libvirt's qemu hook: write (prepare) or remove (release) a domain's NIC rules, seal
      its bridges (start)

Errors: one line on stderr, exit 1 (which aborts a domain's start at prepare and start).

No click and no project module before a domain is known to be ours: libvirt runs the hook
at every start of every domain on the machine, and others' domains must cost little and
never fail because of this program.
"""

import os
import sys

USAGE = "usage: cloud-guest-rules base | cloud-guest-rules libvirt-hook NAME STAGE SUBSTAGE EXTRA < DOMAIN.xml"
# host_adapters.libvirt.xml.NIC_RULES_NS (a test keeps them equal): a document without it
# has no rules of ours.
NIC_RULES_NS = "urn:cloud-controller:nic-rules:1"
STAGES = ("prepare", "start", "release")
# libvirt passes its own PATH; where there is none, the one nft and ip are found in.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(sys.argv[1:] if argv is None else argv, sys.stdin))


def run(args: list[str], stdin) -> int:
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if args[:1] == ["base"] and len(args) == 1:
        return _act(lambda hook: hook.load_base())
    if args[:1] == ["libvirt-hook"] and len(args) == 5:
        name, stage = args[1], args[2]
        if stage not in STAGES:
            return 0
        try:
            xml = stdin.read()
        except (OSError, UnicodeDecodeError) as e:
            return _fail(f"domain {name}: cannot read its XML from stdin: {e}")
        if NIC_RULES_NS not in xml:
            return 0
        return _act(lambda hook: hook.on_libvirt(name, stage, xml))
    print(USAGE, file=sys.stderr)
    return 1


def _act(step) -> int:
    os.environ["PATH"] = os.environ.get("PATH") or DEFAULT_PATH
    try:
        import xml.etree.ElementTree as ET

        from common.errors import ControllerError
        from host_adapters.libvirt import guest_rules_hook
    except Exception as e:  # an installation broken for our domains: say so, refuse
        return _fail(f"cannot load its modules: {type(e).__name__}: {e}")
    try:
        step(guest_rules_hook)
    except ControllerError as e:
        return _fail(e.message)
    except ET.ParseError as e:
        return _fail(f"the domain's XML does not parse: {e}")
    except Exception as e:  # still one line: libvirt shows stderr in its error
        return _fail(f"unexpected error: {type(e).__name__}: {e}")
    return 0


def _fail(message: str) -> int:
    print("cloud-guest-rules: " + " ".join(message.split()), file=sys.stderr)
    return 1
