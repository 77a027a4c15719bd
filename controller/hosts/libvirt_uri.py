"""What a libvirt connection URI leaves open: a transport or parameter that neither encrypts
nor authenticates the hypervisor host.

Whoever can read or change the traffic of a libvirt connection runs the host's hypervisor:
it carries the domain definitions (which file each guest boots and which homes it mounts).
`cloud-agent host add` refuses such a URI unless the admin says --insecure, and `check`
warns about every recorded host and the config's own [libvirt] uri.

The rules follow libvirt's remote driver (its "Connection URIs" page): transports are named
after "+" in the scheme, parameter names compare case-insensitively, values are
percent-decoded and a boolean is set by any number but 0. The query is split at "&" and
";" alike, and a parameter given twice counts if any of its values is unsafe, so this reads
a URI at least as unsafe as libvirt does.
"""

import re
from urllib.parse import unquote

# A transport that encrypts nothing, unless SASL is required (below).
_PLAIN = {"tcp"}
# A transport that runs a command the service knows nothing about.
_EXTERNAL = {"ext"}
_SSH = {"ssh", "libssh", "libssh2"}
_ZERO = re.compile(r"[ \t\n\v\f\r]*[+-]?0+")  # 0 as C's strtol reads a whole value


def _params(query: str) -> list[tuple[str, str]]:
    out = []
    for part in re.split(r"[&;]", query):
        name, _, value = part.partition("=")
        out.append((unquote(name).strip().lower(), unquote(value)))
    return out


def _set(value: str) -> bool:
    """A libvirt boolean parameter: any number but 0 sets it; libvirt refuses other text,
    and here other text counts as set (the safe reading)."""
    return not _ZERO.fullmatch(value)


def _weak_tls(priority: str) -> bool:
    """A GnuTLS priority string that adds a null cipher, an anonymous key exchange, SSL 3.0
    or a relaxed certificate check ("-" and "!" remove an item)."""
    for item in priority.upper().split(":"):
        if item[:1] in ("-", "!"):
            continue
        name = item.lstrip("+")
        if name in ("NULL", "MAC-NULL", "VERS-SSL3.0") or name.startswith(("ANON-", "%VERIFY_ALLOW_",
                                                                             "%VERIFY_DISABLE_")):
            return True
    return False


def transport_risks(uri: str) -> list[str]:
    """Why the connection this URI opens is not encrypted and authenticated; [] when it is
    (a local socket, ssh with host keys checked, TLS with the certificate checked, tcp with
    SASL required)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        # A libvirt alias (libvirt.conf uri_aliases), or something libvirt will refuse:
        # what is behind an alias cannot be read here.
        return [f"{uri!r} is not a URI (a libvirt alias?), so its transport cannot be checked"]
    transport = scheme.partition("+")[2].lower()
    server = rest.partition("/")[0].rpartition("@")[2]
    if not transport:
        transport = "tls" if server else "unix"  # as libvirt picks
    values: dict[str, list[str]] = {}
    for name, value in _params(rest.partition("?")[2].partition("#")[0]):
        values.setdefault(name, []).append(value)
    risks = []
    if transport in _PLAIN:
        auth = [v.strip().lower() for v in values.get("auth", [])]
        # Over a plain transport libvirt's client insists on a SASL security layer (encryption
        # of at least 56 bits); without auth=sasl it takes whatever the daemon offers, "none" too.
        if not auth or not all(a == "sasl" or a.startswith("sasl.") for a in auth):
            risks.append("the tcp transport is neither encrypted nor authenticated unless SASL is required "
                         "(auth=sasl); use qemu+ssh:// or qemu+tls://")
    if transport in _EXTERNAL:
        risks.append("the ext transport runs an external command whose encryption cannot be checked")
    if any(_set(v) for v in values.get("no_verify", [])):
        if transport in _SSH:
            risks.append("no_verify accepts an ssh host key never seen before")
        elif transport == "tls":
            risks.append("no_verify skips the check of the server's TLS certificate")
    for value in values.get("known_hosts_verify", []):
        if transport in _SSH and value.strip().lower() in ("auto", "ignore"):
            risks.append(f"known_hosts_verify={value.strip().lower()} accepts an ssh host key never seen before")
    for value in values.get("tls_priority", []):
        if transport == "tls" and _weak_tls(value):
            risks.append(f"tls_priority {value!r} allows an unencrypted, anonymous or unverified TLS session")
    return risks


def host_warnings(ctx) -> list[str]:
    """One line per risk of the config's [libvirt] uri and of every recorded host (`check`)."""
    import sqlite3

    from controller.errors import ControllerError

    uris = {"[libvirt] uri": ctx.config.libvirt.uri}
    try:
        rows = ctx.store.list_hosts()
    except (ControllerError, sqlite3.Error):
        rows = []  # no database to read: the database check says why
    for row in rows:
        if row["uri"] not in uris.values():
            uris[f"host {row['name']}"] = row["uri"]
    return [f"{where} {uri}: {risk}" for where, uri in uris.items() for risk in transport_risks(uri)]
