"""`--wait`: from a created (or restarted) server to a guest that takes SSH logins.

Bounded by --timeout. Done when port 22 at the server's address answers with
an SSH banner AND the guest's console says its boot setup has finished
(`ready`: cloud-init's last stage has run, so nothing of the first boot
restarts sshd after the `ssh` line is printed); where the client cannot reach
that address (no route, or the connection times out, as from a laptop outside
the cluster), when `ready` alone. A refused connection means the address is
reachable and sshd is not up yet: keep waiting for SSH itself. Where the
service or host has no console (404, 405, 503), SSH alone.
"""

import errno
import socket
import time
from collections.abc import Callable

from common.client import ApiError, Client, ClientError, Server

POLL_SECONDS = 2.0
_CONNECT_SECONDS = 3.0
FAILED = ("error", "crashed")


def ssh_answers(address: str, port: int = 22) -> bool | None:
    """True: an SSH banner came; False: reachable but no SSH yet; None: not reachable from here."""
    try:
        with socket.create_connection((address, port), timeout=_CONNECT_SECONDS) as s:
            s.settimeout(_CONNECT_SECONDS)
            return s.recv(4).startswith(b"SSH-")
    except ConnectionRefusedError:
        return False
    except (socket.timeout, TimeoutError):
        return None
    except OSError as e:
        return None if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL) else False


def console_ready(client: Client, server_id: str) -> bool | None:
    """The console's `ready`; None where there is no console to ask (rely on SSH then)."""
    try:
        return client.console(server_id, size=1).ready
    except ApiError as e:
        if e.status in (404, 405, 503):  # no console (yet) on this service or host: rely on SSH
            return None
        raise


# The first words of the console of a guest on libvirt's test driver (the sandbox), where
# no guest boots: waiting for SSH there would only run into the timeout.
SANDBOX_CONSOLE = "cloud-controller sandbox:"


class NoGuestHere(Exception):
    """The server runs on the sandbox's test driver: it is `running`, and no guest boots."""

    def __init__(self, server: Server):
        super().__init__("sandbox")
        self.server = server


class WaitTimeout(ClientError):
    """--wait's bound ended: the message, and the server's id and last status (for --json)."""

    def __init__(self, message: str, server: Server):
        super().__init__(message)
        self.server = server


# The start of a console is enough to tell the sandbox's note from a guest's output.
SANDBOX_PROBE_BYTES = 256


def on_sandbox(client: Client, server_id: str) -> bool:
    """Whether the server runs on the sandbox's test driver (its console says so): no guest
    there boots or answers at its address."""
    try:
        return client.console(server_id, size=SANDBOX_PROBE_BYTES).text.startswith(SANDBOX_CONSOLE)
    except ApiError:
        return False


def wait_for_guest(client: Client, server: Server, *, timeout: float,
                   progress: Callable[[str], None]) -> Server:
    started = time.monotonic()
    deadline = started + timeout
    said = None
    asked_sandbox = False
    while True:
        server = client.get_server(server.id)
        address = server.private_ip
        if server.status in FAILED:
            raise ClientError(f"server {server.id} is in status {server.status}")
        if server.status == "running" and not asked_sandbox:
            asked_sandbox = True  # once: a real guest's console never starts so
            if on_sandbox(client, server.id):
                raise NoGuestHere(server)
        if server.status == "running" and address:
            reach = ssh_answers(address)
            ready = console_ready(client, server.id) if reach is not False else False
            if reach and ready is not False:
                return server
            if reach is None and ready:
                progress(f"{address} is not reachable from here; the console says the guest is ready")
                return server
            if reach:
                state = "SSH answers; finishing its boot setup (console not ready yet)"
            elif reach is False:
                state = "booting: no SSH answer yet"
            else:
                state = f"booting ({address} not reachable from here)"
        else:
            state = server.status
        if state != said:
            progress(f"waiting for {server.hostname or server.id}: {state} ({time.monotonic() - started:.0f} s)")
            said = state
        if time.monotonic() + POLL_SECONDS > deadline:
            raise WaitTimeout(f"server {server.id} did not take SSH logins within {timeout:g} s "
                              f"(last: {state}); see `cloud server console {server.hostname or server.id}`", server)
        time.sleep(POLL_SECONDS)
