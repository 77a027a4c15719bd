"""The service URL a client talks to: checked before any connection, compared with the URL a kept
login was made for, and what went wrong on the way to it said in words, never as a Python
exception's name."""

import errno
import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from common.client.errors import ClientError

_DEFAULT_PORTS = {"http": 80, "https": 443}


def check_url(url: str) -> str:
    """The URL without trailing slashes; ClientError saying what is wrong with it otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise ClientError("no service URL")
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ClientError(f"the URL's host or port is not valid: {url}") from None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.netloc:
        raise ClientError(f"the URL needs http:// or https:// (e.g. http://head-node:8080): {url}")
    if not parts.hostname:
        raise ClientError(f"the URL names no host: {url}")
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL end up in shell history and process lists.
        raise ClientError(f"the URL must not hold a user or password: {parts.scheme}://{parts.hostname}")
    if port == 0:
        raise ClientError(f"the URL's port is not valid: {url}")
    if parts.query or parts.fragment:
        raise ClientError(f"the URL must be the service's base URL, without ? or #: {url}")
    api = api_of_portal(url)
    if api:
        # The portal's pages are for a web browser; nothing is sent there, nor to the API's URL
        # guessed from it: the person says which service they mean.
        raise ClientError(f"that is the portal; the API is at {api}")
    return url.rstrip("/")


# The service's pages for a web browser (api/portal/guard.py PREFIX): never the API's base URL.
PORTAL_PATH = "/portal"


def api_of_portal(url: str) -> str | None:
    """The API's URL (the same scheme, host and port) when `url` is the portal's: its path is
    /portal or under it. None for any other URL."""
    parts = urlsplit(url.strip())
    if parts.path == PORTAL_PATH or parts.path.startswith(PORTAL_PATH + "/"):
        return origin_of(url.strip())
    return None


def origin_of(url: str) -> str:
    """SCHEME://HOST[:PORT] of a URL (never a user or password it may hold)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine's loopback: localhost (and names under
    .localhost), 127.0.0.0/8, ::1. A name is not resolved: any other name may be anywhere."""
    host = (host or "").strip().lower().rstrip(".").strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def plain_http_host(url: str) -> str | None:
    """The host when `url` is plain http:// to a host that is not loopback (what is sent there
    can be read on the way), else None."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http" or is_loopback(parts.hostname or ""):
        return None
    return parts.hostname or None


def service_of(url: str) -> tuple[str, str, int, str]:
    """What names one service: scheme, host, port (the default one filled in) and path, compared
    without case where case does not matter, so http://Head:80/ is http://head."""
    parts = urlsplit(check_url(url))
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS[scheme], parts.path.rstrip("/")


def same_service(a: str, b: str) -> bool:
    try:
        return service_of(a) == service_of(b)
    except ClientError:
        return False


def _causes(error: BaseException):
    """The error and every error behind it (requests wraps urllib3, which wraps the socket's)."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__, getattr(e, "reason", None)])
        todo.extend(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))


_BY_ERRNO = {
    errno.ECONNREFUSED: "connection refused (is the service running, and on this port?)",
    errno.EHOSTUNREACH: "no route to the host",
    errno.ENETUNREACH: "the network is unreachable",
    errno.ECONNRESET: "the connection was reset",
    errno.ETIMEDOUT: "the connection timed out",
    errno.EADDRNOTAVAIL: "the address is not available",
}


def describe(error: BaseException) -> str:
    """Why a request got no answer, in words."""
    for e in _causes(error):
        if isinstance(e, socket.gaierror):
            return "the host name is not known"
        if isinstance(e, ssl.SSLCertVerificationError):
            return "its TLS certificate is not trusted"
        if isinstance(e, ssl.SSLError):
            return "the TLS handshake failed (is it plain http://?)"
        if isinstance(e, OSError) and e.errno in _BY_ERRNO:
            return _BY_ERRNO[e.errno]
    text = " ".join(str(e) for e in _causes(error)).lower()
    for clue, words in (("name or service not known", "the host name is not known"),
                        ("failed to resolve", "the host name is not known"),
                        ("nodename nor servname", "the host name is not known"),
                        ("connection refused", _BY_ERRNO[errno.ECONNREFUSED]),
                        ("remotedisconnected", "the service closed the connection without answering"),
                        ("connection aborted", "the service closed the connection without answering"),
                        ("certificate", "its TLS certificate is not trusted"),
                        ("ssl", "the TLS handshake failed (is it plain http://?)")):
        if clue in text:
            return words
    return "the connection failed"
