"""Strict validation of names that reach a host command or a path.

`groupadd` itself accepts names such as `bad;name`, so every name is checked
here before any command runs.
"""

import re

from common.errors import InvalidInput

# POSIX portable user and group names, as CONTRACT.md section 5 fixes them.
_POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def check_group_name(name: object) -> str:
    if not isinstance(name, str) or not _POSIX_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid group name {name!r}: must match ^[a-z_][a-z0-9_-]{{0,31}}$"
        )
    return name


def check_username(name: object) -> str:
    if not isinstance(name, str) or not _POSIX_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid username {name!r}: must match ^[a-z_][a-z0-9_-]{{0,31}}$"
        )
    return name
