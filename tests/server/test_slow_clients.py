"""Slow and idle clients against the real `cloud-agent serve` (issue 16, finding 1).

Connections that send nothing, or half a request, must not use up the server's
connection slots or delay anyone else; idle ones are closed after
[server] channel_timeout_seconds, and one whose request keeps trickling in after
[server] request_timeout_seconds.
"""

import configparser
import http.client
import socket
import time

import pytest

from tests.agent.test_agent_controller import Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.agent.test_audit import token
from tests.fixtures.server import Server

pytestmark = [pytest.mark.integration]

HELD = 200
GETS = 100


def set_config(sandbox: Sandbox, section: str, **keys) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(sandbox.config)
    if not parser.has_section(section):
        parser.add_section(section)
    for key, value in keys.items():
        parser[section][key] = str(value)
    with open(sandbox.config, "w") as f:
        parser.write(f)


def hold(port: int, kind: str) -> socket.socket:
    """A connection that sends nothing (idle), half a request line and headers, or headers
    and half a body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if kind == "half-headers":
        s.sendall(b"GET /v1/server-flavor HTTP/1.1\r\nHost: x\r\nX-Auth-To")
    elif kind == "half-body":
        s.sendall(b"POST /v1/auth/token HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"api_key\": ")
    return s


def timed_call(port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None,
               ) -> tuple[float, int, bytes]:
    """One request on a connection of its own, given 1 s in all: (seconds, status, body);
    status 0 when it got no answer in time."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
    except OSError as e:  # socket.timeout included
        return time.monotonic() - started, 0, repr(e).encode()
    finally:
        conn.close()
    return time.monotonic() - started, r.status, data


def closed_by_server(s: socket.socket, within: float) -> bool:
    """Whether the server closes s within `within` seconds (EOF or reset)."""
    s.settimeout(within)
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_held_connections_do_not_delay_authenticated_reads(sandbox, tmp_path):
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
    server = Server(sandbox, tmp_path / "serve.log")
    held = []
    try:
        headers, _ = token(server, {"api_key": sandbox.admin["api_key"], "api_secret": sandbox.admin["api_secret"]})
        kinds = ("idle", "half-headers", "half-body")
        held = [hold(server.port, kinds[i % len(kinds)]) for i in range(HELD)]
        slow = []
        for _ in range(GETS):
            elapsed, status, body = timed_call(server.port, "GET", "/v1/server-flavor", headers)
            assert status == 200, body
            assert flavor["id"] in body.decode()
            if elapsed >= 1.0:
                slow.append(elapsed)
        assert slow == [], f"{len(slow)} of {GETS} reads took 1 s or more"
        # The held connections are still open: none was dropped to make room.
        for s in held[:10]:
            assert not closed_by_server(s, 0.01)
    finally:
        for s in held:
            s.close()
        server.stop()


def test_idle_and_trickling_connections_are_closed_after_their_timeouts(sandbox, tmp_path):
    set_config(sandbox, "server", channel_timeout_seconds=2, request_timeout_seconds=3, cleanup_interval_seconds=1)
    server = Server(sandbox, tmp_path / "serve.log")
    try:
        idle = hold(server.port, "idle")
        half = hold(server.port, "half-headers")
        # A request that trickles in, one byte at a time, never idle for long.
        trickle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        started = time.monotonic()
        closed_at = None
        for byte in b"GET /v1/server-flavor HTTP/1.1\r\nHost: x\r\n" + b"X" * 200:
            try:
                trickle.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic() - started
                break
            if closed_by_server(trickle, 0.25):
                closed_at = time.monotonic() - started
                break
        assert closed_at is not None, "a request trickling in for 50 s was never closed"
        assert 3 <= closed_at < 3 + 1 + 2, closed_at  # request_timeout + cleanup_interval + slack
        # Silent ones went after channel_timeout.
        assert closed_by_server(idle, 1) and closed_by_server(half, 1)
        # Anyone else is served as before; headers over [server] max_header_bytes are refused.
        status, _ = server.call("GET", "/healthz")
        assert status == 200
        _, status, _ = timed_call(server.port, "GET", "/healthz", headers={"X-Padding": "x" * 40_000})
        assert status == 431
    finally:
        server.stop()
