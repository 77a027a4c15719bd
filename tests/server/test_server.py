"""The real server: `cloud-agent serve` on waitress over loopback HTTP, driven as the README does."""

import configparser
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

AGENT = Path(sys.executable).parent / "cloud-agent"
ALICE_PASSWORD = "Alice-pass-2026"


def agent(*args: str) -> dict:
    proc = subprocess.run([str(AGENT), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Http:
    def __init__(self, base: str):
        self.base = base

    def call(self, method: str, path: str, body: dict | bytes | None = None, *, headers=None, timeout: float = 10):
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        sent = {"Content-Type": "application/json"} if data is not None else {}
        sent.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, dict(resp.headers), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, dict(e.headers), json.loads(raw) if raw.startswith(b"{") else raw


@pytest.fixture
def sandbox(tmp_path):
    """A sandbox config written by `cloud-agent init --sandbox` and its first superuser."""
    assert AGENT.is_file(), f"{AGENT} is missing: run scripts/setup-host.sh"
    config = tmp_path / "controller.ini"
    assert agent("--config", str(config), "--json", "init", "--sandbox", str(tmp_path / "state")) == {
        "config": str(config.resolve())
    }
    admin = agent("--config", str(config), "--json", "user", "create-superuser",
                  "--email", "admin@example.org", "--password", "Admin-pass-2026")
    return config, admin


def start_server(config: Path, log_path: Path, *, port: int | None = None) -> tuple[subprocess.Popen, Http]:
    """`cloud-agent serve` on 127.0.0.1 (a free port, or `port`), once /healthz answers 200;
    its output is appended to log_path."""
    port = port or free_port()
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [str(AGENT), "--config", str(config), "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    http = Http(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(f"cloud-agent serve exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            status, _, body = http.call("GET", "/healthz")
            if status == 200:
                assert body == {"status": "ok"}
                return proc, http
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            stop_server(proc)
            pytest.fail(f"/healthz did not answer 200 within 30 s:\n{log_path.read_text()}")
        time.sleep(0.1)


def stop_server(proc: subprocess.Popen) -> int:
    """Stop the server this test started, by its PID: SIGINT first (a clean stop), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def readme_walk_through(http: Http, admin: dict) -> None:
    # A token from the admin's API key and secret.
    status, _, body = http.call("POST", "/v1/auth/token",
                                {"api_key": admin["api_key"], "api_secret": admin["api_secret"]})
    assert status == 200, body
    assert body["success"] is True and body["version"] == "1" and body["data"]["userid"] == admin["userid"]
    auth = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}

    # A managed user owned by the admin.
    status, _, body = http.call("POST", "/v1/user/create", {
        "email": "alice@example.org", "password": ALICE_PASSWORD, "owner_userid": admin["userid"],
    }, headers=auth)
    assert status == 200, body
    alice_id = body["data"]["userid"]

    # Everyone the admin may see.
    status, _, body = http.call("GET", "/v1/user/list", headers=auth)
    assert status == 200, body
    assert body["data"]["total"] == 2 == len(body["data"]["users"])
    by_email = {u["email"]: u for u in body["data"]["users"]}
    assert by_email["alice@example.org"]["id"] == alice_id
    assert by_email["alice@example.org"]["owner_userid"] == admin["userid"]
    assert by_email["admin@example.org"]["num_owned_accounts"] == 1
    assert by_email["admin@example.org"]["roles"] == ["superuser"]

    # alice logs in with her password and sees herself only, without superuser fields.
    status, _, body = http.call("POST", "/v1/auth/token", {"email": "alice@example.org", "password": ALICE_PASSWORD})
    assert status == 200, body
    alice = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": alice_id}
    status, _, body = http.call("POST", "/v1/user/list", {}, headers=alice)
    assert status == 200
    assert [u["email"] for u in body["data"]["users"]] == ["alice@example.org"]
    assert "api_key" not in body["data"]["users"][0]

    # Errors over the wire keep the envelope and the right status.
    status, _, body = http.call("GET", "/v1/user/list")
    assert (status, body["success"]) == (401, False)
    status, headers, body = http.call("GET", "/v1/user/create", headers=auth)
    assert status == 405 and "POST" in headers["Allow"] and body["success"] is False
    status, _, body = http.call("POST", "/v1/user/list", b"x" * (1024 * 1024 + 1), headers=auth)
    assert status == 413 and body == {"message": "request body over 1048576 bytes", "success": False, "version": "1"}
    status, _, body = http.call("POST", "/v1/user/create", b"{", headers=auth)
    assert status == 400 and body["success"] is False

    status, _, doc = http.call("GET", "/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    assert "/v1/user/create" in doc["paths"]


def set_interfaces(config: Path, interfaces: str) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    parser["server"]["interfaces"] = interfaces
    with open(config, "w") as f:
        parser.write(f)


def test_user_interface_alone_over_http(sandbox, tmp_path):
    """A deployment may run the user interface as its own service."""
    config, admin = sandbox
    set_interfaces(config, "user")
    proc, http = start_server(config, tmp_path / "serve.log")
    try:
        readme_walk_through(http, admin)
        # Only the user interface is served.
        status, _, _ = http.call("GET", "/v1/server-flavor", headers={"X-Auth-Token": "x"})
        assert status == 404
    finally:
        code = stop_server(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()
    assert "serving on http://127.0.0.1:" in (tmp_path / "serve.log").read_text()


def test_sandbox_server_over_http(sandbox, tmp_path):
    """The sandbox config as `init --sandbox` writes it: both interfaces on one server."""
    config, admin = sandbox
    proc, http = start_server(config, tmp_path / "serve.log")
    try:
        readme_walk_through(http, admin)
        status, _, token = http.call("POST", "/v1/auth/token",
                                     {"api_key": admin["api_key"], "api_secret": admin["api_secret"]})
        auth = {"X-Auth-Token": token["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}
        status, _, body = http.call("GET", "/v1/server-flavor", headers=auth)
        assert status == 200 and body == {"data": [], "msg": "", "success": True}
    finally:
        code = stop_server(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()
