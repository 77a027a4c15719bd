"""What `cloud` keeps and where it sends it, with no real service: a kept login belongs to its URL,
an ended login is not sent and says how to renew it, 429 and 503 are waited out within a bound and
never cost the kept token, and a bad URL is said in words (the user command, docs/client.md)."""

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.client import ApiError, Client, LoginEnded
from tests.fixtures.cloud import Cloud

USERID = "0b6a7c1e-4b5e-4a43-9a3e-2f0c5f1d9a01"
KEY = "ak_" + "1" * 32
SECRET = "kept-secret-never-elsewhere"
TOKEN = "kept-token-never-elsewhere"
FUTURE = "2999-01-01T00:00:00Z"
PAST = "2020-01-01T00:00:00Z"
PYTHON_NAMES = re.compile(r"Traceback|[A-Z][A-Za-z]*(Error|Exception)\b")


class Listener:
    """A TCP port that records every connection and byte it receives and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(0.5)
            try:
                self.received.append(conn.recv(65536))
            except OSError:
                pass
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


class Stub:
    """An HTTP service answering from a script: {(method, path): [(status, headers, body), ...]},
    the last answer repeating; records (method, path, headers, body) of every request."""

    def __init__(self, script: dict):
        self.script = {k: list(v) for k, v in script.items()}
        self.requests: list[tuple] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                stub.requests.append((self.command, path, dict(self.headers), body))
                answers = stub.script.get((self.command, path)) or [(404, {}, {"message": "no", "success": False})]
                status, headers, doc = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(doc).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815 (the base class's names)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def ok_images():
    return (200, {}, {"data": [], "msg": "", "success": True})


def token_answer(token="new-token"):
    return (200, {}, {"data": {"token": token, "expires_at": FUTURE, "userid": USERID}, "message": "",
                      "success": True, "version": "1"})


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "person")


def keep(cloud: Cloud, **login) -> bytes:
    cloud.file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    cloud.file.write_text(json.dumps(login))
    cloud.file.chmod(0o600)
    return cloud.file.read_bytes()


def full_login(url: str) -> dict:
    return {"url": url, "userid": USERID, "token": TOKEN, "expires_at": FUTURE, "source": "api_key",
            "api_key": KEY, "api_secret": SECRET}


@pytest.mark.parametrize("how", ["CC_URL", "--url"])
def test_a_listener_on_another_port_receives_nothing_kept(cloud, listener, how):
    keep(cloud, **full_login("http://127.0.0.1:9"))
    for command in (["server", "list"], ["whoami"], ["credentials", "show"], ["image", "list"]):
        if how == "CC_URL":
            message = cloud.error(*command, env={"CC_URL": listener.url})
        else:
            message = cloud.error("--url", listener.url, *command)
        assert message.startswith(f"not logged in to {listener.url}: the kept login is for http://127.0.0.1:9")
        assert "cloud login --url " + listener.url in message
    time.sleep(0.3)
    assert listener.connections == 0 and listener.received == []


def test_the_same_service_spelled_otherwise_is_still_the_kept_login(cloud):
    stub = Stub({("GET", "/v1/server-image"): [ok_images()]})
    try:
        port = stub.url.rsplit(":", 1)[1]
        keep(cloud, **full_login(stub.url))
        cloud.ok("image", "list", "--json", env={"CC_URL": f"HTTP://127.0.0.1:{port}/"})
        assert stub.requests[-1][2]["X-Auth-Token"] == TOKEN
    finally:
        stub.close()


def test_env_credentials_overriding_a_kept_login_are_named_once(cloud):
    stub = Stub({("POST", "/v1/auth/token"): [token_answer("env-token")],
                 ("GET", "/v1/server-image"): [ok_images()], ("GET", "/v1/server-flavor"): [ok_images()]})
    try:
        kept = keep(cloud, **full_login(stub.url))
        proc = cloud.run("image", "list", env={"CC_API_KEY": "ak_" + "2" * 32, "CC_API_SECRET": "env-secret"})
        assert proc.returncode == 0, proc.stderr
        notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
        assert notes == [f"note: CC_API_KEY and CC_API_SECRET from the environment are used, not the login kept "
                         f"in {cloud.file} ({KEY} at {stub.url})"]
        # The environment's credentials were used; nothing kept was sent, and the file is as it was.
        sent = [(m, p, h.get("X-Auth-Token"), b) for m, p, h, b in stub.requests]
        assert sent[0][:2] == ("POST", "/v1/auth/token") and b"env-secret" in sent[0][3]
        assert sent[1][2] == "env-token"
        assert all(SECRET.encode() not in b and TOKEN != t for _, _, t, b in sent)
        assert cloud.file.read_bytes() == kept
        # No kept login for this service: nothing overridden, nothing said.
        cloud.file.unlink()
        proc = cloud.run("image", "list", env={"CC_API_KEY": "ak_" + "2" * 32, "CC_API_SECRET": "env-secret",
                                               "CC_URL": stub.url})
        assert proc.returncode == 0 and "note:" not in proc.stderr
    finally:
        stub.close()


def test_an_expired_login_is_not_sent_and_says_when_it_ended_and_how_to_renew(cloud, listener):
    keep(cloud, url=listener.url, userid=USERID, token=TOKEN, expires_at=PAST, source="password",
         email="alice@example.org")
    message = cloud.error("server", "list")
    assert message == (f"your login to {listener.url} ended at {PAST} (its token expired): run "
                       f"`cloud login --url {listener.url} --email alice@example.org`")
    keep(cloud, url=listener.url, userid=USERID, token=TOKEN, expires_at=PAST, source="api_key", api_key=KEY)
    assert cloud.error("server", "list").endswith(f"run `cloud login --url {listener.url} --api-key {KEY}`")
    time.sleep(0.3)
    assert listener.connections == 0


def test_a_revoked_login_says_so_and_keeps_the_file(cloud):
    stub = Stub({("GET", "/v1/server-image"): [(401, {}, {"message": "invalid or expired token for this user",
                                                           "success": False, "version": "1"})]})
    try:
        kept = keep(cloud, url=stub.url, userid=USERID, token=TOKEN, expires_at=FUTURE, source="api_key",
                    api_key=KEY)
        message = cloud.error("image", "list")
        assert message.startswith(f"your login to {stub.url} was refused before its end at {FUTURE} (revoked")
        assert message.endswith(f"run `cloud login --url {stub.url} --api-key {KEY}`")
        assert cloud.file.read_bytes() == kept
    finally:
        stub.close()


def test_kept_credentials_that_are_refused_say_which_login_renews_them(cloud):
    refused = (401, {}, {"message": "invalid credentials", "success": False, "version": "1"})
    stub = Stub({("GET", "/v1/server-image"): [refused], ("POST", "/v1/auth/token"): [refused]})
    try:
        keep(cloud, **full_login(stub.url))
        message = cloud.error("image", "list")
        assert "could not be renewed" in message and "invalid credentials" in message
        assert message.endswith(f"run `cloud login --url {stub.url} --api-key {KEY} --keep`")
    finally:
        stub.close()


def test_503_and_429_with_retry_after_are_waited_out_and_never_cost_the_kept_token(cloud):
    busy = (503, {"Retry-After": "1"}, {"data": [], "msg": "too many requests at once", "success": False})
    stub = Stub({("GET", "/v1/server-image"): [busy, busy, ok_images()]})
    try:
        kept = keep(cloud, **full_login(stub.url))
        started = time.monotonic()
        assert cloud.ok("image", "list", "--json") == []
        assert time.monotonic() - started >= 2
        assert [p for _, p, _, _ in stub.requests] == ["/v1/server-image"] * 3
        assert all(h["X-Auth-Token"] == TOKEN for _, _, h, _ in stub.requests)
        assert cloud.file.read_bytes() == kept
    finally:
        stub.close()


def test_a_retry_after_beyond_the_bound_fails_at_once_and_keeps_the_token(cloud):
    busy = (503, {"Retry-After": "3600"}, {"data": [], "msg": "host operations waited too long", "success": False})
    stub = Stub({("GET", "/v1/server-image"): [busy]})
    try:
        kept = keep(cloud, **full_login(stub.url))
        started = time.monotonic()
        message = cloud.error("image", "list")
        assert time.monotonic() - started < 10
        assert message == "host operations waited too long (the service asks to retry in 3600 s)"
        assert len(stub.requests) == 1
        assert cloud.file.read_bytes() == kept
    finally:
        stub.close()


def test_a_busy_login_is_retried(cloud):
    slots = (429, {"Retry-After": "1"}, {"message": "too many logins at once from this address; try again shortly",
                                         "success": False, "version": "1"})
    stub = Stub({("POST", "/v1/auth/token"): [slots, token_answer("fresh")]})
    try:
        doc = cloud.ok("login", "--json", "--url", stub.url, "--email", "alice@example.org",
                       stdin="Alice-pass-2026\n")
        assert doc["userid"] == USERID
        kept = json.loads(cloud.file.read_text())
        assert kept["token"] == "fresh" and kept["email"] == "alice@example.org" and kept["source"] == "password"
        assert "Alice-pass-2026" not in cloud.file.read_text()
        # Two logins, the catalog of clusters (a cloud auth serving several names its default
        # cluster there), then the look-up of who logged in (neither of which this stand-in
        # answers: the login stands, at this URL, named by its id alone).
        assert [r[:2] for r in stub.requests] == [("POST", "/v1/auth/token")] * 2 + [
            ("GET", "/v1/auth/catalog"), ("GET", f"/v1/user/view/{USERID}")]
        assert "controller_url" not in kept
        assert (doc["email"], doc["username"]) == (None, None)
    finally:
        stub.close()


@pytest.mark.parametrize("url, says", [
    ("head-node:8080", "the URL needs http:// or https://"),
    ("ftp://head-node", "the URL needs http:// or https://"),
    ("http://", "the URL needs http:// or https://"),
    ("http://head-node:99999", "the URL's host or port is not valid"),
    ("http://user:pw@head-node", "must not hold a user or password"),
    ("http://no-such-host.invalid:8080", "the host name is not known"),
])
def test_bad_urls_say_what_is_wrong(cloud, url, says):
    for args, env in ((["image", "list"], {"CC_URL": url, "CC_API_KEY": KEY, "CC_API_SECRET": "s"}),
                      (["login", "--url", url, "--api-key", KEY], {})):
        proc = cloud.run(*args, env=env, stdin="secret\n")
        assert proc.returncode == 1, proc.stderr
        assert says in proc.stderr and not PYTHON_NAMES.search(proc.stderr), proc.stderr
        assert "pw@" not in proc.stderr


def test_connection_refused_is_said_in_words(cloud, listener):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    proc = cloud.run("image", "list", env={"CC_URL": f"http://127.0.0.1:{closed}", "CC_API_KEY": KEY,
                                           "CC_API_SECRET": "s"})
    assert proc.stderr.strip() == (f"error: cannot reach http://127.0.0.1:{closed}: connection refused "
                                   "(is the service running, and on this port?)")


def test_the_library_raises_login_ended_and_never_renews_on_a_wrong_proof():
    wrong = (401, {}, {"message": "wrong password or API secret", "success": False, "version": "1"})
    creds = (200, {}, {"data": {"userid": USERID, "api_key": KEY, "api_secret_set": True}, "message": "",
                       "success": True, "version": "1"})
    stub = Stub({("GET", "/v1/user/credentials"): [creds], ("POST", "/v1/user/rotate_api_secret"): [wrong],
                 ("POST", "/v1/auth/token"): [token_answer()]})
    try:
        client = Client(stub.url, token=TOKEN, userid=USERID, expires_at=FUTURE, api_key=KEY, api_secret=SECRET,
                        token_source="api_key")
        with pytest.raises(ApiError) as e:
            client.rotate_api_secret(password="not-it-1234567")
        assert e.value.status == 401 and e.value.message == "wrong password or API secret"
        assert not isinstance(e.value, LoginEnded)
        # One proof sent, no login to send it again with.
        assert [p for _, p, _, _ in stub.requests] == ["/v1/user/credentials", "/v1/user/rotate_api_secret"]
        ended = Client(stub.url, token=TOKEN, userid=USERID, expires_at=PAST)
        with pytest.raises(LoginEnded):
            ended.credentials()
        assert len(stub.requests) == 2
    finally:
        stub.close()


def test_wrong_environment_credentials_get_the_services_own_answer(cloud):
    refused = (401, {}, {"message": "invalid credentials", "success": False, "version": "1"})
    stub = Stub({("POST", "/v1/auth/token"): [refused]})
    try:
        message = cloud.error("image", "list", env={"CC_URL": stub.url, "CC_API_KEY": KEY, "CC_API_SECRET": "x"})
        assert message == "invalid credentials"
        assert not cloud.file.exists()
    finally:
        stub.close()
