"""`cloud-agent serve` under systemd's protocol: readiness over NOTIFY_SOCKET, clean stop on SIGTERM."""

import os
import signal
import socket
import subprocess
import time

from tests.fixtures.agent import AGENT
from tests.fixtures.server import free_port


def test_serve_notifies_readiness_and_stops_on_sigterm(tmp_path):
    config = tmp_path / "controller.ini"
    subprocess.run([str(AGENT), "--config", str(config), "init", "--sandbox", str(tmp_path / "state")],
                   check=True, capture_output=True)
    notify_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(30)
    port = free_port()
    proc = subprocess.Popen(
        [str(AGENT), "--config", str(config), "serve", "--port", str(port)],
        env=dict(os.environ, NOTIFY_SOCKET=notify_path),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        assert listener.recv(256) == b"READY=1"
        # Ready means listening: a connection succeeds at once.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()
        assert listener.recv(256) == b"STOPPING=1"
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.1)
    else:
        raise AssertionError("the port still accepts connections after the server stopped")
