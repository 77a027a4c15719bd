"""Parts of the client library and the `cloud` command that need no service: the console
(whose server side docs/api.md describes), readiness probes, errors of the transport."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.cloud.server_commands import _new_part
from agent.cloud.waiting import ssh_answers
from common.client import ApiError, Client, Unreachable

SID = "0b6a7c1e-4b5e-4a43-9a3e-2f0c5f1d9a01"


class _Console(BaseHTTPRequestHandler):
    """Answers GET /v1/server-instance/<SID>/console as docs/api.md says; 404 else."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (the base class's name)
        _Console.seen.append(self.path)
        if self.path.startswith(f"/v1/server-instance/{SID}/console"):
            status, body = 200, {"data": [{"console": "cloud-init finished\n", "ready": True}], "msg": "",
                                 "success": True}
        else:
            status, body = 404, {"data": [], "msg": f"server-instance {self.path} not found", "success": False}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def console_service():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Console)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Console.seen.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_console_asks_for_bytes_and_reads_text_and_ready(console_service):
    client = Client(console_service, token="t", userid="u")
    got = client.console(SID, size=4096)
    assert got.text == "cloud-init finished\n" and got.ready is True
    assert got.raw == {"console": "cloud-init finished\n", "ready": True}
    assert _Console.seen == [f"/v1/server-instance/{SID}/console?bytes=4096"]
    with pytest.raises(ApiError) as e:
        client.console("../../v1/limits")
    assert e.value.status == 404 and "not found" in e.value.message
    assert _Console.seen[-1].startswith("/v1/server-instance/..%2F..%2Fv1%2Flimits/console")  # one path segment


def test_no_service_is_unreachable_naming_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}", token="t", userid="u", timeout=5)
    with pytest.raises(Unreachable) as e:
        client.list_images()
    # Said in words, never as a Python exception's name.
    assert e.value.message == (f"cannot reach http://127.0.0.1:{port}: connection refused "
                               "(is the service running, and on this port?)")


def test_ssh_probe_tells_a_banner_from_a_refusal():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def greet():
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        t = threading.Thread(target=greet)
        t.start()
        assert ssh_answers("127.0.0.1", port) is True
        t.join(5)
    assert ssh_answers("127.0.0.1", port) is False  # nothing listens now: refused, reachable


def test_follow_prints_only_what_is_new():
    assert _new_part("a\nb\n", "a\nb\nc\n") == "c\n"
    # Both are the console's last bytes of one size: the window slid by what came since.
    before = "".join(f"line {i}\n" for i in range(100))
    after = (before + "login:\n")[-len(before):]
    assert _new_part(before, after) == "login:\n"
    assert _new_part("old run\n", "fresh start\n") == "fresh start\n"
