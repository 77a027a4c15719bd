#!/usr/bin/env python3
"""Run the whole test suite in lanes, so that it takes the time of its longest lane and
not the sum of all (scripts/test.sh calls this).

Usage: test_lanes.py PYTHON [PYTEST_ARGS...]

A selection (a path or node id, `-m`, `-k`) or CC_TEST_LANES=0 runs one plain pytest with
the arguments as given: a developer's few tests need no lanes.

- First two lanes at once, one per core: the tests on fakes and scratch folders (not
  marked `integration`: no daemon) beside the tests against real daemons and kernel
  parts (marked `integration`, not `guest`). They share no daemon: each fixture starts
  its own, on a free port or socket and in a folder of its own.
- Then the tests that boot a real guest (marked `guest`), alone: a guest under software
  emulation needs most of a core for a minute, and its waits are bounded.

Every test runs in exactly one lane (the markers decide), so the lanes together are
the whole suite. The daemon lane and the guest lane print as they go; the fakes lane's
output is printed whole when it ends (two progress lines at once cannot be read).
pytest's own exit codes come back: the first lane's that is not 0, and 5 (a lane found
no test) counts as a failure, as a whole run with no test does.
"""

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LANES = (
    ("fakes", "not integration and not guest"),
    ("daemons", "integration and not guest"),
)
GUESTS = ("guests", "guest")


def selects(args: list[str]) -> bool:
    """True when the arguments choose tests themselves (then the lanes' markers would cut
    the selection): a path, a node id, a marker or keyword expression."""
    for arg in args:
        if arg.startswith(("-m", "-k")) or "::" in arg or arg == "tests" or arg.startswith(("tests/", "./tests")):
            return True
        if not arg.startswith("-") and os.path.exists(arg):
            return True
    return False


def _pytest(python: str, marks: str, args: list[str]) -> list[str]:
    return [python, "-m", "pytest", "-m", marks, *args]


def _run_quiet(argv: list[str], log: Path, result: dict, name: str) -> None:
    with open(log, "wb") as out:
        result[name] = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _run_live(argv: list[str]) -> int:
    return subprocess.call(argv, stdin=subprocess.DEVNULL)


def _say(text: str) -> None:
    print(f"test-lanes: {text}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    python, args = argv[1], argv[2:]
    if os.environ.get("CC_TEST_LANES") == "0" or selects(args):
        return _run_live([python, "-m", "pytest", *args])
    began = time.monotonic()
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="cc-test-lanes-") as tmp:
        (quiet_name, quiet_marks), (live_name, live_marks) = LANES
        log = Path(tmp) / f"{quiet_name}.log"
        _say(f"lane '{quiet_name}' ({quiet_marks}) runs beside lane '{live_name}' ({live_marks}); "
             f"its output follows when it ends")
        quiet = threading.Thread(target=_run_quiet, args=(_pytest(python, quiet_marks, args), log, codes, quiet_name))
        quiet.start()
        _say(f"lane '{live_name}' ({live_marks}):")
        codes[live_name] = _run_live(_pytest(python, live_marks, args))
        if quiet.is_alive():
            _say(f"lane '{live_name}' ended; waiting for lane '{quiet_name}'")
        quiet.join()
        _say(f"lane '{quiet_name}' ({quiet_marks}):")
        sys.stdout.flush()
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()
    guest_name, guest_marks = GUESTS
    _say(f"lane '{guest_name}' ({guest_marks}), alone:")
    codes[guest_name] = _run_live(_pytest(python, guest_marks, args))
    minutes = (time.monotonic() - began) / 60
    _say(", ".join(f"{name}: exit {code}" for name, code in codes.items()) + f"; {minutes:.1f} min in all")
    failed = [code for code in codes.values() if code != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
