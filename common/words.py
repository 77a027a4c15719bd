"""What people read in a refusal: the rule a name breaks said in words (never a regular
expression), and a value they sent echoed cut short.

Each rule here describes one pattern of the code (host_adapters/names.py, api/schemas.py, the
config): the pattern decides, these words explain. tests/api/test_plain_words.py checks that
every refusal of a name says its rule and no pattern.
"""

# At most this many characters of a value a client sent are echoed in a message.
SHOWN_CHARS = 64

# POSIX portable user and group names (host_adapters/names.py).
POSIX_NAME = "1 to 32 characters: lowercase letters, digits, - and _, starting with a letter or _"
GROUP_NAME_RULE = "Group names are " + POSIX_NAME
USERNAME_RULE = "Usernames are " + POSIX_NAME
# A guest's hostname: one DNS label (host_adapters/guests/guest.py).
HOSTNAME_RULE = ("Hostnames are 1 to 63 characters: lowercase letters, digits and -, starting and ending "
                 "with a letter or digit")
# A hypervisor host's name (controller/config.py HOST_NAME).
HOST_NAME_RULE = "Host names are 1 to 63 characters: lowercase letters, digits and -, starting with a letter or digit"
# Ids and names that become domain and volume names on a host (host_adapters/names.py).
ID_RULE = "1 to 64 characters: letters, digits, ., - and _, starting with a letter or digit"
VOLUME_NAME_RULE = ("Base image volume names are 1 to 128 characters: letters, digits, ., - and _, starting "
                    "with a letter or digit")
PREFIX_RULE = ("Domain prefixes are 1 to 32 characters: letters, digits, ., - and _, starting with a letter "
               "or digit")
MAC_RULE = "MAC addresses are 52:54:00 and three more pairs of lowercase hexadecimal digits, joined by colons"
# A request id a client may send (controller/audit/request_ids.py).
REQUEST_ID_RULE = "Request ids are 1 to 64 characters: letters, digits, ., - and _"


def shown(value: object) -> str:
    """`value` as text, cut to SHOWN_CHARS characters (then "…")."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


def quoted(value: object) -> str:
    """shown(value) in quotes, control characters escaped (repr)."""
    return repr(shown(value))
