"""What may be shown of text a guest wrote (its serial console): attacker-controlled, so besides
the template's escaping every control character but newline and tab goes, with the terminal
escape sequences they start, and the characters that reorder text on screen (bidi controls)."""

import re

# CSI (ESC [ ... final byte) and OSC (ESC ] ... BEL or ESC \) sequences, then any other ESC pair.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
# C0 but \t and \n, DEL, C1, and the bidi embedding, override and isolate controls.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def console_text(text: str) -> str:
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub("", _ESCAPES.sub("", text))
