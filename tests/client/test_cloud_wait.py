"""`--wait` (agent/cloud/waiting.py, issue 25): done when SSH answers AND the console says the
guest is ready, so the `ssh` line printed works at once (a first boot's last stages may still
restart sshd after it first answers); `ready` alone where the address is not reachable; SSH
alone where there is no console to ask."""

from types import SimpleNamespace

import pytest

from agent.cloud import waiting
from common.client import ApiError, ClientError

SERVER = {"id": "5d1b0c3e-0000-4000-8000-000000000001", "cloudauth-id": "u", "users": [], "server-image": "i",
          "server-flavor": "f", "creation-date": "2026-11-27T00:00:00Z", "status": "running",
          "hostname": "vm-5d1b0c3e", "private-ip": "10.213.0.9"}


class Guest:
    """A client whose guest answers SSH and says ready as the test scripts it, poll by poll."""

    def __init__(self, *, ssh: list, ready: list):
        self.ssh, self.ready, self.polls = list(ssh), list(ready), 0

    def get_server(self, server_id):
        from common.client import Server

        self.polls += 1
        return Server.from_api(SERVER)

    def console(self, server_id, size):
        if size == waiting.SANDBOX_PROBE_BYTES:
            return SimpleNamespace(ready=False, text="[    0.000000] Linux version 6.1\n")  # a real guest's console
        ready = self.ready.pop(0) if len(self.ready) > 1 else self.ready[0]
        if isinstance(ready, Exception):
            raise ready
        return SimpleNamespace(ready=ready, text="")

    def answers(self, address, port=22):
        return self.ssh.pop(0) if len(self.ssh) > 1 else self.ssh[0]


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(waiting.time, "sleep", lambda s: None)


def wait(monkeypatch, guest, timeout=60.0):
    monkeypatch.setattr(waiting, "ssh_answers", guest.answers)
    said = []
    server = waiting.wait_for_guest(guest, waiting.Server.from_api(SERVER), timeout=timeout, progress=said.append)
    return server, said


def test_ssh_answering_before_ready_is_not_done_yet(monkeypatch):
    guest = Guest(ssh=[False, True], ready=[False, False, True])
    server, said = wait(monkeypatch, guest)
    assert server.id == SERVER["id"]
    assert guest.polls == 4  # no SSH; SSH but not ready (twice); both
    assert any("SSH answers; finishing its boot setup" in s for s in said)


def test_not_reachable_from_here_is_done_when_ready(monkeypatch):
    guest = Guest(ssh=[None], ready=[False, True])
    _, said = wait(monkeypatch, guest)
    assert guest.polls == 2 and "the console says the guest is ready" in said[-1]


@pytest.mark.parametrize("status", [404, 405, 503])
def test_without_a_console_ssh_alone(monkeypatch, status):
    guest = Guest(ssh=[True], ready=[ApiError(status, "no console")])
    wait(monkeypatch, guest)
    assert guest.polls == 1


def test_never_ready_fails_when_the_timeout_ends(monkeypatch):
    ticks = iter(range(0, 1000, 1))
    monkeypatch.setattr(waiting.time, "monotonic", lambda: float(next(ticks)))
    guest = Guest(ssh=[True], ready=[False])
    with pytest.raises(ClientError, match="did not take SSH logins within 10 s .*console not ready"):
        wait(monkeypatch, guest, timeout=10)
