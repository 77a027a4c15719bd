"""Value rules shared by the API and the agent: emails, passwords, UUIDs, id lookups."""

import re
import string
import uuid
from collections.abc import Callable
from typing import TypeVar

from common.words import quoted, shown
from controller.errors import InvalidInput, NotFound

T = TypeVar("T")

# Deliberately plain: one @, a dot-atom local part (no leading, trailing or double
# dot), no spaces, a dotted domain. Full RFC 5322 is not what an admin means by
# "a valid address".
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_EMAIL = re.compile("^" + _ATEXT + r"(?:\." + _ATEXT + ")*@" + _LABEL + r"(?:\." + _LABEL + ")+$")

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

PASSWORD_MIN = 14
PASSWORD_MAX = 24

# Bounds of free-text fields, in characters: a value over one is refused (400)
# before anything is stored. RFC 5321 allows 254 characters in an address.
EMAIL_MAX = 254
NAME_MAX = 255  # user, image and flavor names; volume-name
SHORT_TEXT_MAX = 64  # registration_source; an image's operating-system strings
USERNAME_MAX = 32  # system usernames (the POSIX portable rule)


def check_length(field: str, value: object, maximum: int) -> object:
    """InvalidInput naming the field when a string is longer than maximum characters."""
    if isinstance(value, str) and len(value) > maximum:
        raise InvalidInput(f"{field} is too long: at most {maximum} characters, got {len(value)}")
    return value


# A name is shown on people's terminals and pages: a control character (ESC starts a
# terminal sequence: OSC 52 writes the clipboard) or a bidirectional override (text
# that reads otherwise than it is) has no place in one.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def check_name(field: str, value: object, maximum: int = NAME_MAX) -> object:
    """check_length, and InvalidInput naming the field for a control or bidi character."""
    check_length(field, value, maximum)
    if isinstance(value, str) and any(ord(c) < 32 or 127 <= ord(c) < 160 or c in _BIDI for c in value):
        raise InvalidInput(f"{field} must not contain control characters")
    return value


def check_email(value: object) -> str:
    check_length("email", value, EMAIL_MAX)
    if not isinstance(value, str) or not _EMAIL.fullmatch(value) or len(value.rsplit("@", 1)[0]) > 64:
        raise InvalidInput(f"email is not a valid address: {quoted(value)}")
    return value


# Told to a person before a password is asked for.
PASSWORD_RULE = (f"A password is {PASSWORD_MIN} to {PASSWORD_MAX} characters long and mixes at least two of: "
                 "letters, digits, punctuation.")


def check_password(value: object) -> str:
    """14 to 24 characters from at least two of: letters, digits, punctuation."""
    if not isinstance(value, str):
        raise InvalidInput("password must be a string")
    if not PASSWORD_MIN <= len(value) <= PASSWORD_MAX:
        raise InvalidInput(f"password must be {PASSWORD_MIN} to {PASSWORD_MAX} characters long")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInput("password must not contain control characters")
    classes = (
        any(c.isalpha() for c in value),
        any(c.isdigit() for c in value),
        any(c in string.punctuation or not (c.isalnum() or c.isspace()) for c in value),
    )
    if sum(classes) < 2:
        raise InvalidInput("password must mix at least two of: letters, digits, punctuation")
    return value


def as_uuid(value: object) -> str | None:
    """The canonical (lower-case) form of a UUID in its usual 36-character spelling, else None.

    UUIDs compare case-insensitively (RFC 4122), and ids are stored lower-case, so
    every id a client sends goes through here before a lookup.
    """
    # A pattern, not uuid.UUID(): every authenticated request parses one or two ids, and
    # the round trip through UUID cost 8 % of a GET's time under load.
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        return None
    return value.lower()


# A number a client (or an admin) sends is ASCII digits: str.isdigit() and int() also take
# other scripts' digits ("\u0661" is 1 to int(), "\u00b9" passes isdigit() and then fails
# int()), and int() refuses a string of over 4,300 digits with a ValueError. The length is
# bounded before int() sees the text; 19 digits reach SQLite's 64-bit INTEGER.
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def as_decimal(value: object) -> int | None:
    """The integer an ASCII decimal string spells (an optional minus, at most 19 digits,
    within SQLite's 64-bit INTEGER), else None."""
    if not isinstance(value, str) or len(value) > 20 or not _DECIMAL.fullmatch(value):
        return None
    number = int(value)
    return number if INT64_MIN <= number <= INT64_MAX else None


def new_id() -> str:
    return str(uuid.uuid4())


def find_or_404(kind: str, given: object, fetch: Callable[[str], T | None],
                *, parse: Callable[[object], str | None] = as_uuid) -> T:
    """The one "parse the id, fetch, 404" of every resource.

    `given` is the id as the client (or admin) sent it: it is parsed (by
    default into a lower-case UUID), `fetch` gets the parsed form, and a
    malformed id or a missing (or invisible) row is NotFound naming `given`
    as sent, never the parsed form, which is None for a malformed id.
    """
    parsed = parse(given)
    found = fetch(parsed) if parsed is not None else None
    if found is None:
        # The id as sent, cut short: enough of it to recognise it.
        raise NotFound(f"{kind} {shown(given)} not found")
    return found
