"""libvirt's test driver served by a private libvirtd, for the benchmark.

`test:///default` lives in the process that opens it: in the sandbox the server
would hold every domain, volume and network of the test driver in its own
memory, which a head node's controller never does (there they live in
libvirtd). So the benchmark runs the test driver in a libvirtd of its own: it
loads no driver module (LIBVIRT_DRIVER_DIR names an empty folder; the test
driver is built into the daemon), listens only on unix sockets in its state
folder, root-only (0700), and is reached as `test+unix:///default?socket=...`.

The daemon keeps the test driver's state only while it has a client: the
server's connection, opened at its start (which rebuilds the domains), keeps it.
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

# sun_path holds 108 bytes with its terminating NUL.
_MAX_SOCKET_PATH = 107


class PrivateLibvirtd:
    """A libvirtd serving the test driver on a unix socket under `folder`.

    start() returns once the socket accepts connections; stop() ends the daemon
    by its PID (TERM, then KILL) and is safe to call more than once."""

    def __init__(self, folder: Path, *, binary: str | None = None):
        self.folder = Path(folder).resolve()
        self.binary = binary or shutil.which("libvirtd") or "/usr/sbin/libvirtd"
        self.socket = self.folder / "run" / "libvirt-sock"
        self.log = self.folder / "libvirtd.log"
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"test+unix:///default?socket={quote(str(self.socket), safe='/')}"

    def start(self, timeout: float = 30) -> "PrivateLibvirtd":
        if not Path(self.binary).is_file():
            raise RuntimeError(f"{self.binary} is missing: run scripts/setup-host.sh (libvirt-daemon-system)")
        run, drivers = self.folder / "run", self.folder / "no-drivers"
        # The admin socket is the longest name the daemon makes there.
        if len(str(run / "libvirt-admin-sock")) > _MAX_SOCKET_PATH:
            raise RuntimeError(f"state folder {self.folder} is too long a path for a unix socket")
        for d in (run, drivers):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(run, 0o700)
        conf = self.folder / "libvirtd.conf"
        conf.write_text(
            f'unix_sock_dir = "{run}"\n'
            'unix_sock_ro_perms = "0700"\n'
            'unix_sock_rw_perms = "0700"\n'
            'unix_sock_admin_perms = "0700"\n'
            'auth_unix_rw = "none"\n'
            'auth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{self.log}"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBVIRT_")}
        env["LIBVIRT_DRIVER_DIR"] = str(drivers)
        with open(self.folder / "libvirtd.out", "w") as out:
            self.proc = subprocess.Popen(
                [self.binary, "--config", str(conf), "--pid-file", str(run / "libvirtd.pid")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)  # a Ctrl-C of the benchmark reaches it through stop() only
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = (self.folder / "libvirtd.out").read_text()[-2000:]
                self.proc = None
                raise RuntimeError(f"libvirtd exited at start:\n{text}")
            if self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"libvirtd did not open {self.socket} within {timeout:g} s")

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.socket))
            except OSError:
                return False
        return True

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=15)


def stop_process(proc: subprocess.Popen | None, *, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; nothing if it is not running."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
