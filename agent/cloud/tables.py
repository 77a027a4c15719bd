"""Text for people, in one style for `cloud` and `cloud-agent`: aligned tables with a header
line, `name: value` fields, and every value made safe for a terminal first.

Names, messages and guest consoles are written by other people (a user names a volume, a
guest writes its console): an ESC there starts a terminal control sequence (OSC 52 sets
the clipboard, others retitle the window or hide text), and a bidirectional override
makes a line read otherwise than it is. So every human output shows such characters as
visible escapes (`\\x1b`, `\\u202e`); `--json` keeps the exact values.
"""

import unicodedata
from collections.abc import Callable, Iterable

# Bidirectional embeddings, overrides, isolates and marks (Unicode's Bidi_Control).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep: str = "") -> str:
    """`text` with control characters (C0, DEL, C1), bidi controls and line or paragraph
    separators shown as escapes; characters in `keep` (e.g. newline and tab) stay."""
    if text.isprintable() and not any(c in _BIDI for c in text):
        return text  # the common case, at C speed
    return "".join(c if c in keep or not (c in _BIDI or unicodedata.category(c) in ("Cc", "Zl", "Zp"))
                   else _shown(c) for c in text)


def console_text(text: str) -> str:
    """A guest's console for a terminal: its lines and tabs, nothing that drives the terminal
    (a carriage return ending a line is dropped; any other one is shown)."""
    return printable(text.replace("\r\n", "\n"), keep="\n\t")


def cell(value) -> str:
    return "-" if value is None or value == "" else printable(str(value))


def yes_no(value) -> str:
    return "yes" if value else "no"


def table(rows: Iterable, columns: list[tuple[str, Callable]]) -> str:
    """Aligned columns with a header line; an empty list says so."""
    cells = [[h for h, _ in columns]]
    for row in rows:
        cells.append([cell(get(row)) for _, get in columns])
    if len(cells) == 1:
        return "(none)"
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def fields(pairs: list[tuple[str, object]]) -> str:
    """One object as `name: value` lines."""
    width = max(len(k) for k, _ in pairs)
    shown = []
    for k, v in pairs:
        if isinstance(v, (list, tuple)):
            v = ", ".join(printable(str(x)) for x in v) or "-"
        shown.append(f"{k + ':':<{width + 1}} {cell(v)}")
    return "\n".join(shown)
