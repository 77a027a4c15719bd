"""What trips a person who is not a cloud expert at `cloud` (issue 41, docs/client.md): an email
typed where the API key is asked, the portal's URL given for the API's, -f and -c on either side
of the command name, ssh that waits for nothing, the sandbox where no guest runs, and
credentials sent over plain HTTP across the network.

The real `cloud` in a subprocess (a terminal through pexpect where one matters), against the
sandbox service (tests/client/test_cloud_command.py's) or a stand-in API on 127.0.0.1. Nothing
is sent anywhere else: the one host that is not loopback is a name under .invalid that a
stand-in on 127.0.0.1 answers as the HTTP proxy, and ssh is a stand-in on PATH."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pexpect
import pytest
import requests

from agent.cloud.waiting import SANDBOX_CONSOLE
from common.client import Client
from tests.client.test_cloud_command import PASSWORD, alice, svc  # noqa: F401 - fixtures
from tests.fixtures.cloud import CLOUD, Cloud

USERID = "0b6a7c1e-4b5e-4a43-9a3e-2f0c5f1d9a01"
KEY = "ak_" + "1" * 32
SECRET = "stand-in-secret-never-shown"
FUTURE = "2999-01-01T00:00:00Z"
SERVER = {"id": "5d1b0c3e-0000-4000-8000-000000000001", "cloudauth-id": USERID, "users": [], "server-image": "i",
          "server-flavor": "f", "creation-date": "2026-11-27T00:00:00Z", "status": "running",
          "hostname": "vm-5d1b0c3e", "private-ip": "10.213.0.9"}
USER = {"id": USERID, "email": "bob@example.org", "name": "Bob", "active": 1, "owner_userid": None,
        "system_accounts": [{"id": 1, "username": "bob", "uuid": "6f1c2a3b-0000-4000-8000-000000000002",
                             "cloud_controller_id": 1}]}
HTML = "<!doctype html>\n<html><head><title>Log in</title></head><body>the portal</body></html>\n"


def ok(data) -> tuple[int, dict]:
    return 200, {"data": data, "message": "", "success": True, "version": "1"}


class Api:
    """A stand-in API on 127.0.0.1: {(method, path): (status, document)} (a str document is a web
    page, answered as text/html; `default` answers every other path). It records each request:
    method, the request target (absolute when it was sent as a proxy's), Host and body. It also
    serves as an HTTP proxy: a request for http://NAME/PATH is answered as PATH."""

    def __init__(self, script: dict, default=(404, {"msg": "no such resource", "success": False})):
        self.script, self.default = script, default
        self.requests: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = urlsplit(self.path).path
                api.requests.append({"method": self.command, "target": self.path, "path": path,
                                     "host": self.headers.get("Host"), "body": body})
                status, doc = api.script.get((self.command, path), api.default)
                page = isinstance(doc, str)
                data = doc.encode() if page else json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8" if page else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 (the base class's names)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def guest_api(console: str) -> dict:
    """One server, its owner bob (system account bob), and its console."""
    return {("POST", "/v1/auth/token"): ok({"token": "t0k", "expires_at": FUTURE, "userid": USERID}),
            ("GET", "/v1/server-instance"): ok([SERVER]),
            ("GET", f"/v1/user/view/{USERID}"): ok({"user": USER}),
            ("GET", f"/v1/server-instance/{SERVER['id']}/console"): ok([{"console": console, "ready": True}]),
            ("GET", "/v1/server-image"): ok([])}


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "person")


def fake_ssh(tmp_path) -> tuple[dict, object]:
    """An `ssh` first on PATH that records its arguments (one line) and connects nowhere."""
    folder = tmp_path / "bin"
    folder.mkdir()
    said = tmp_path / "ssh-args"
    (folder / "ssh").write_text(f'#!/bin/sh\necho "ssh $*" >> {said}\necho "ssh $*"\n')
    (folder / "ssh").chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}, said


# -- 1. an email at the API-key prompt ---------------------------------------------------
@pytest.mark.integration
@pytest.mark.real_commands
def test_an_email_typed_where_the_api_key_is_asked_logs_in_with_the_password(svc, cloud):
    email = svc.users["alice"]["email"]
    child = pexpect.spawn(str(CLOUD), ["login", "--url", svc.base], env=cloud.env, timeout=20, encoding="utf-8",
                          dimensions=(24, 200))
    try:
        child.expect("API key")
        child.sendline(email)
        child.expect("Password: ")
        child.sendline(PASSWORD)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0 and f"logged in to {svc.base} as {email}" in child.before, child.before
    assert PASSWORD not in child.before  # never echoed
    kept = json.loads(cloud.file.read_text())
    assert (kept["source"], kept["email"]) == ("password", email) and "api_key" not in kept
    # An email given to --api-key is a usage error, before anything is asked or sent.
    api = Api({})
    try:
        proc = cloud.run("login", "--url", api.url, "--api-key", email)
        assert proc.returncode == 2 and "--api-key was given an email: log in with `cloud login --email EMAIL`" \
            in proc.stderr and api.requests == []
    finally:
        api.close()


# -- 2. the portal's URL -----------------------------------------------------------------
@pytest.mark.parametrize("path", ["/portal", "/portal/", "/portal/login", "/portal/credentials"])
def test_the_portals_url_is_answered_with_the_apis_and_nothing_is_sent(cloud, path):
    api = Api({}, default=(200, HTML))
    try:
        for args in (["login", "--url", api.url + path, "--email", "bob@example.org"],
                     ["--url", api.url + path, "server", "list"]):
            proc = cloud.run(*args, stdin=PASSWORD + "\n",
                             env={"CC_API_KEY": KEY, "CC_API_SECRET": SECRET} if "login" not in args else None)
            assert proc.returncode == 1 and proc.stdout == "", proc
            assert proc.stderr.strip() == f"error: that is the portal; the API is at {api.url}"
        assert api.requests == [] and not cloud.file.exists()
    finally:
        api.close()


@pytest.mark.integration
@pytest.mark.real_commands
def test_the_real_portals_url_is_refused_before_the_password_is_asked(svc, cloud):
    child = pexpect.spawn(str(CLOUD), ["login", "--url", svc.base + "/portal/"], env=cloud.env, timeout=20,
                          encoding="utf-8", dimensions=(24, 200))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1 and "API key" not in child.before
    assert child.before.strip() == f"error: that is the portal; the API is at {svc.base}"


def test_a_web_page_answered_at_the_apis_first_call_is_said_so(cloud):
    api = Api({}, default=(200, HTML))
    try:
        message = cloud.error("login", "--url", api.url + "/cloud", "--email", "bob@example.org",
                              stdin=PASSWORD + "\n")
        assert message == (f"{api.url}/cloud answers with a web page, not the API: that is the portal or another "
                           f"web site; is the API at {api.url}?")
        message = cloud.error("login", "--url", api.url, "--email", "bob@example.org", stdin=PASSWORD + "\n")
        assert message.startswith(f"{api.url} answers with a web page, not the API: that is the portal or another "
                                  "web site; give the API's URL")
        # One call each, to the URL given: nothing to the guessed one.
        assert [r["path"] for r in api.requests] == ["/cloud/v1/auth/token", "/v1/auth/token"]
        assert not cloud.file.exists()
    finally:
        api.close()


# -- 3. -f and -c before or after the command name ------------------------------------------
@pytest.mark.integration
@pytest.mark.real_commands
def test_format_and_columns_go_before_or_after_the_command_name(alice):
    after = alice.ok("flavor", "list", "-f", "value", "-c", "name")
    assert sorted(after.split()) == ["big", "small"]
    assert alice.ok("-f", "value", "-c", "name", "flavor", "list") == after
    assert alice.ok("--format", "csv", "--column", "name", "--column", "vcpu", "flavor", "list").startswith(
        "name,vcpu\n")
    assert json.loads(alice.ok("-f", "json", "flavor", "show", "small"))["name"] == "small"
    # After the name wins over before it.
    assert alice.ok("-f", "json", "flavor", "show", "small", "-f", "value", "-c", "vcpu").strip() == "1"
    # A command that prints no document takes neither, on either side, and its help names neither.
    proc = alice.run("-f", "json", "server", "ssh", "vm-x")
    assert proc.returncode == 2 and "-f/--format and -c/--column do not apply to `cloud server ssh`" in proc.stderr
    for path, has in ((["server", "ssh"], False), (["completion"], False), (["flavor", "list"], True),
                      (["logout"], True)):
        shown = alice.ok(*path, "--help")
        assert ("-f, --format" in shown and "-c, --column" in shown) == has, path
    assert "-f, --format" in alice.ok("--help") and "-c, --column" in alice.ok("--help")


# -- 4. ssh with a connect timeout -----------------------------------------------------------
def test_server_ssh_runs_ssh_with_a_connect_timeout(cloud, tmp_path):
    api = Api(guest_api("[    0.000000] Linux version 6.1\n"))  # a real guest's console
    path, said = fake_ssh(tmp_path)
    env = {"CC_URL": api.url, "CC_API_KEY": KEY, "CC_API_SECRET": SECRET, **path}
    try:
        out = cloud.ok("server", "ssh", SERVER["hostname"], "--", "id", "-u", env=env)
        assert out.strip() == "ssh -o ConnectTimeout=10 bob@10.213.0.9 id -u"
        assert cloud.ok("--json", "server", "ssh", SERVER["id"][:8], "--print", env=env) == {
            "argv": ["ssh", "-o", "ConnectTimeout=10", "bob@10.213.0.9"]}
        assert said.read_text().splitlines() == ["ssh -o ConnectTimeout=10 bob@10.213.0.9 id -u"]
    finally:
        api.close()


# -- 5. the sandbox runs no guest ---------------------------------------------------------------
def test_a_sandbox_console_means_nothing_is_run_or_sent(cloud, tmp_path):
    api = Api(guest_api(SANDBOX_CONSOLE + " ...\n"))
    path, said = fake_ssh(tmp_path)
    env = {"CC_URL": api.url, "CC_API_KEY": KEY, "CC_API_SECRET": SECRET, **path}
    try:
        message = cloud.error("--json", "server", "ssh", SERVER["hostname"], "--", "id", env=env)
        assert message == "the sandbox runs no guest: nothing to connect to at 10.213.0.9"
        assert not said.exists()
    finally:
        api.close()


@pytest.mark.integration
@pytest.mark.real_commands
def test_in_the_sandbox_ssh_and_create_ssh_send_nothing_to_the_guest(svc, alice, tmp_path):
    path, said = fake_ssh(tmp_path)
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    others = []
    try:
        started = time.monotonic()
        assert alice.error("server", "ssh", made["hostname"], env=path) == (
            f"the sandbox runs no guest: nothing to connect to at {made['private-ip']}")
        proc = alice.run("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--ssh",
                         "--timeout", "600", env=path)
        doc = json.loads(proc.stdout)
        others.append(doc["id"])
        assert proc.returncode == 1 and doc["status"] == "running", proc
        assert doc["error"].startswith("the sandbox runs no guest: nothing to connect to at ")
        assert proc.stderr.strip().splitlines()[-1] == "error: " + doc["error"]
        assert time.monotonic() - started < 60 and not said.exists()
    finally:
        for sid in [made["id"], *others]:
            svc.api("alice", "DELETE", f"/v1/server-instance/{sid}")


# -- 6. credentials over plain HTTP ------------------------------------------------------------
def test_which_hosts_are_loopback():
    from common.client.urls import is_loopback, plain_http_host

    for host in ("localhost", "LOCALHOST.", "head.localhost", "127.0.0.1", "127.0.0.2", "127.255.0.9", "::1",
                 "[::1]", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("head-node", "localhost.example.org", "10.0.0.1", "128.0.0.1", "::2", "", "example.org"):
        assert not is_loopback(host), host
    assert plain_http_host("http://head-node:8080") == "head-node"
    assert plain_http_host("http://[fe80::1]:8080") == "fe80::1"
    for url in ("https://head-node:8080", "http://127.0.0.1:8080", "http://localhost", "http://[::1]:80"):
        assert plain_http_host(url) is None, url
    # The library tells its caller before each request that carries a token or a secret there.
    for url, told in (("http://head-node.invalid:8080", ["head-node.invalid"]), ("http://127.0.0.1:9", []),
                      ("https://head-node.invalid", [])):
        said, session = [], Recorder()
        client = Client(url, token="t0k", userid=USERID, expires_at=FUTURE, controller_url=url, session=session,
                        on_plain_http=said.append)
        assert client.list_images() == [] and session.sent == [url + "/v1/server-image"]
        assert said == told, url


class Recorder:
    """A requests.Session stand-in that answers every request with an empty list: nothing is sent."""

    def __init__(self):
        self.sent = []

    def request(self, method, url, **kw):
        self.sent.append(url)
        resp = requests.Response()
        resp.status_code, resp._content = 200, json.dumps(ok([])[1]).encode()
        resp.headers["Content-Type"] = "application/json"
        return resp


def test_plain_http_to_another_host_warns_once_and_loopback_stays_silent(cloud):
    api = Api(guest_api(""))
    # head-node.invalid resolves nowhere: the stand-in on 127.0.0.1 is asked as the HTTP proxy.
    far = "http://head-node.invalid:8080"
    proxied = {"http_proxy": api.url, "HTTP_PROXY": api.url, "no_proxy": "", "NO_PROXY": ""}
    warning = "warning: sending credentials over plain HTTP to head-node.invalid; use https://"
    try:
        proc = cloud.run("image", "list", env={**proxied, "CC_URL": far, "CC_API_KEY": KEY, "CC_API_SECRET": SECRET})
        assert proc.returncode == 0, proc
        assert proc.stderr.splitlines() == [warning]  # once, for the login and the call after it
        assert [(r["target"], r["host"]) for r in api.requests] == [
            (far + "/v1/auth/token", "head-node.invalid:8080"), (far + "/v1/server-image", "head-node.invalid:8080")]
        # cloud login warns before the password is typed, and not again when it is sent.
        proc = cloud.run("login", "--url", far, "--email", "bob@example.org", stdin=PASSWORD + "\n", env=proxied)
        assert proc.returncode == 0 and proc.stderr.splitlines() == [warning], proc
        assert PASSWORD not in proc.stderr + proc.stdout
        # Loopback: the same calls say nothing.
        api.requests.clear()
        for url in (api.url, f"http://localhost:{api.port}"):
            proc = cloud.run("image", "list", env={"CC_URL": url, "CC_API_KEY": KEY, "CC_API_SECRET": SECRET})
            assert proc.returncode == 0 and proc.stderr == "", proc
            proc = cloud.run("login", "--url", url, "--email", "bob@example.org", stdin=PASSWORD + "\n")
            assert proc.returncode == 0 and proc.stderr == "", proc
        assert len(api.requests) >= 4
    finally:
        api.close()
