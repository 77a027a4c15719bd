#!/usr/bin/env python3
"""Print, at the end of a CI run, the ten slowest tests and the run's total time.

Usage: slowest.py PYTEST_LOG SECONDS

PYTEST_LOG is pytest's output with `--durations=N` (lines `12.34s call     tests/x.py::test_y`);
SECONDS is how long the whole test command took (installs included). The durations of one
test's setup, call and teardown are added up, so a test whose fixture boots a guest counts
with it.
"""

import re
import sys
from collections import defaultdict

_DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S+)")


def slowest(lines, n: int = 10) -> list[tuple[float, str]]:
    totals: dict[str, float] = defaultdict(float)
    for line in lines:
        found = _DURATION.match(line.strip())
        if found:
            totals[found["test"]] += float(found["seconds"])
    return sorted(((s, t) for t, s in totals.items()), reverse=True)[:n]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        rows = slowest(f)
    seconds = float(sys.argv[2])
    print("ci: the ten slowest tests (setup, call and teardown added up):")
    for s, test in rows:
        print(f"ci: {s:8.1f} s  {test}")
    print(f"ci: the test command took {seconds / 60:.1f} min ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
