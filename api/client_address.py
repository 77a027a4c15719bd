"""The client address a request came from, as one source of password logins (issue 16, finding 3).

It is waitress's REMOTE_ADDR: behind a reverse proxy that is the proxy's
address, so every client through it is one source. When `[server]
trusted_proxies` lists the proxy, the rightmost X-Forwarded-For hop that is
not itself a trusted proxy is the client (each proxy appends the address it
saw; hops left of that one are whatever the client wrote). An IPv6 client is
its /64: one host commonly holds a whole /64, so its single addresses would
be as many sources as it likes.
"""

import ipaddress

_IPV6_SOURCE_PREFIX = 64


def client_address(req, trusted: tuple) -> str:
    remote = _parse(req.remote_addr)
    if remote is None:
        return req.remote_addr or ""
    if trusted and _within(remote, trusted):
        hops = (req.get_header("X-Forwarded-For") or "").split(",")
        for hop in reversed(hops):
            address = _parse(hop.strip())
            if address is None:
                break  # a malformed hop: nothing left of it can be trusted; the proxy is the source
            if not _within(address, trusted):
                return _source(address)
    return _source(remote)


def _parse(text: str | None):
    try:
        address = ipaddress.ip_address(text or "")
    except ValueError:
        return None
    # An IPv4 client on a dual-stack socket is the IPv4 address it is.
    return address.ipv4_mapped or address if address.version == 6 else address


def _within(address, networks: tuple) -> bool:
    return any(address in network for network in networks if network.version == address.version)


def _source(address) -> str:
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/{_IPV6_SOURCE_PREFIX}", strict=False))
    return str(address)
