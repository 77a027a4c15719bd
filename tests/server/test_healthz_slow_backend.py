"""GET /healthz while a backend hangs (issue 16, finding 2), on the real `cloud-agent serve`.

The LDAP server is a private slapd stopped with SIGSTOP: the kernel still accepts
connections and nothing ever answers. Probes answer from the last result within 1 s
and name the failed check; they hold no thread, so a token request is served at
once; when slapd runs again /healthz turns 200 without a restart.
"""

import json
import os
import signal
import time

import pytest

from tests.agent.test_agent_controller import Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.fixtures.concurrency import Loops
from tests.fixtures.server import Server
from tests.server.test_slow_clients import set_config, timed_call

pytestmark = [pytest.mark.integration]

PROBES = 8


def ldap_sandbox(sandbox: Sandbox, slapd) -> Sandbox:
    server = slapd.server
    set_config(sandbox, "directory", backend="ldap", uri=server.uri, base_dn=server.base_dn,
               bind_dn=server.bind_dn, bind_password_file=server.password_file)
    set_config(sandbox, "health", refresh_seconds=1, check_timeout_seconds=1)
    return sandbox


class Probes(Loops):
    """PROBES threads asking /healthz in a loop; every answer's time, status and body."""

    def __init__(self, port: int):
        self.port = port
        self.answers: list[tuple[float, int, bytes]] = []
        super().__init__([self._run] * PROBES, join_seconds=10)

    def _run(self):
        while not self.stopping.is_set():
            self.answers.append(timed_call(self.port, "GET", "/healthz"))


def wait_for_health(port: int, status: int, within: float) -> dict:
    deadline = time.monotonic() + within
    while True:
        elapsed, got, body = timed_call(port, "GET", "/healthz")
        if got == status:
            return json.loads(body)
        assert time.monotonic() < deadline, f"/healthz never answered {status}; last {got} {body!r}"
        time.sleep(0.1)


def test_a_hung_ldap_server_neither_stalls_the_api_nor_healthz(sandbox, private_slapd, tmp_path):
    server = Server(ldap_sandbox(sandbox, private_slapd), tmp_path / "serve.log")
    login = json.dumps({"api_key": sandbox.admin["api_key"], "api_secret": sandbox.admin["api_secret"]}).encode()
    slapd_pid = private_slapd.proc.pid
    try:
        os.kill(slapd_pid, signal.SIGSTOP)
        with Probes(server.port) as probes:
            # The API's groups live in the directory too ([groups] backend follows it).
            assert wait_for_health(server.port, 503, within=15) == {
                "status": "unavailable", "failed": [{"check": "directory"}, {"check": "system_root"}]}
            # The probes keep asking while the check hangs; a login is served meanwhile.
            for _ in range(5):
                elapsed, status, body = timed_call(server.port, "POST", "/v1/auth/token", body=login)
                assert status == 200, body
                assert json.loads(body)["data"]["token"]
                assert elapsed < 1.0, f"a token request took {elapsed:.1f} s"
                time.sleep(0.5)
            os.kill(slapd_pid, signal.SIGCONT)
            assert wait_for_health(server.port, 200, within=30) == {"status": "ok"}
        assert len(probes.answers) >= PROBES
        late = [(round(e, 2), s) for e, s, _ in probes.answers if e >= 1.0 or s not in (200, 503)]
        assert late == [], f"{len(late)} of {len(probes.answers)} probes took 1 s or more, or got no answer"
        assert {json.loads(b)["status"] for _, s, b in probes.answers if s == 503} == {"unavailable"}
    finally:
        os.kill(slapd_pid, signal.SIGCONT)
        log = server.stop()
    # The operator's log says which check and why, once per change.
    assert "health check directory failed: timed out after 1 s" in log


def test_the_agent_check_gives_a_hung_check_its_bound(sandbox, private_slapd):
    ldap_sandbox(sandbox, private_slapd)
    os.kill(private_slapd.proc.pid, signal.SIGSTOP)
    try:
        # The LDAP adapter alone would wait [directory] timeout (10 s) per call, twice.
        proc = sandbox.run("--json", "check", timeout=30)
    finally:
        os.kill(private_slapd.proc.pid, signal.SIGCONT)
    assert proc.returncode == 1, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    for name in ("directory", "system_root"):  # the groups live in the directory too
        assert checks[name] == {"name": name, "ok": False, "detail": "timed out after 1 s"}
    assert all(c["ok"] for name, c in checks.items() if name not in ("directory", "system_root"))
