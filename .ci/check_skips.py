#!/usr/bin/env python3
"""Fail a CI run on any skipped test that is not on the reviewed allow-list.

Usage: check_skips.py PYTEST_LOG ALLOW_LIST

PYTEST_LOG is pytest's output with the short summary of skips (`-ra` or
`-rs`): lines `SKIPPED [N] path:line: reason`. ALLOW_LIST has one entry per
line, `path: reason` (no line number, so entries survive edits above the
skip); `#` starts a comment. Prints the allow-list and every skip seen, and
exits 1 when a skip is not on the list (0 otherwise).
"""

import re
import sys

_SKIPPED = re.compile(r"^SKIPPED \[(?P<count>\d+)\] (?P<path>[^:\s]+?)(?::\d+)?: (?P<reason>.*)$")


def read_allowed(path: str) -> set[tuple[str, str]]:
    allowed = set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            where, sep, reason = line.partition(": ")
            if not sep or not reason.strip():
                sys.exit(f"{path}:{number}: an entry is `path: reason`, not {line!r}")
            allowed.add((where.strip(), reason.strip()))
    return allowed


def read_skips(path: str) -> list[tuple[str, str, int]]:
    skips = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _SKIPPED.match(line.rstrip("\n"))
            if m:
                skips.append((m["path"], m["reason"].strip(), int(m["count"])))
    return skips


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    allowed = read_allowed(argv[2])
    skips = read_skips(argv[1])
    print(f"check_skips: {len(allowed)} allowed skip(s) in {argv[2]}:")
    for where, reason in sorted(allowed):
        print(f"  allowed  {where}: {reason}")
    unexpected = [(w, r, n) for w, r, n in skips if (w, r) not in allowed]
    for where, reason, count in skips:
        mark = "UNEXPECTED" if (where, reason) not in allowed else "ok"
        print(f"  {mark:<10} {count} x {where}: {reason}")
    if unexpected:
        print(f"check_skips: {sum(n for _, _, n in unexpected)} test(s) skipped without being on the "
              f"allow-list: a real-host proof did not run. Fix the machine, or review and add "
              f"the skip to {argv[2]}.", file=sys.stderr)
        return 1
    print(f"check_skips: {sum(n for _, _, n in skips)} skipped test(s), all allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
