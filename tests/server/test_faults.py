"""Faults survived, measured (issue 16): a real `cloud-agent serve` under a write mix while
one part it depends on fails.

Sixteen clients, each its own user with a system account, run a bounded mix on
loopback (each call waits at most CLIENT_TIMEOUT): groups made and deleted,
volumes made and deleted, instances made, powered off and on and deleted (a
small flavor on a blank image: QEMU starts, no guest boots), reads. The
clients whose calls need the part that fails ask only those calls, throughout:
two superusers deactivate and reactivate a user in (b), two owners power an
instance on the doomed host in (c). A prober asks `/healthz` four times a
second. The hypervisor hosts are libvirtds this session started
(tests/fixtures/remote_libvirtd.py: restartable without forgetting anything),
never the shared one another session may stop at any time. Meanwhile one of:

(a) libvirtd (the config's own host) stops and starts again;
(b) slapd stops and starts again (`[directory] backend = ldap`, a slapd of the
    test's own, stopped and started by its PID);
(c) one of two hypervisor hosts dies for good (SIGKILL, not started again);
    afterwards the admin runs `host evacuate remote --host-is-down`, then
    `host remove remote`;
(d) the server is SIGKILLed and started again on the same database and port.

Each scenario asserts: no 500; no request outlives its client timeout;
`/healthz` answers within 1 s throughout (outside (d)'s own down time); what
does not need the failed part keeps succeeding; what does answers 503 while
it is down, and succeeds again once it is back, without a restart of the
service; and afterwards `cloud-agent reconcile --json` finds no drift. (a) and
(d) run `reconcile --fix` first, and say what it fixed: a create that libvirtd's
stop cut short could not remove what it had made on a host that did not
answer, and a SIGKILL cuts creates and deletes short; either way the row keeps
its intent (hidden from clients) and reconcile finishes or undoes it (the
crash-consistency design, docs/decisions.md). The figures of each scenario
are printed (`pytest -s`) and written to `faults.json` in the session's
temporary folder; docs/threat-model.md ("Faults survived") holds a run's.
"""

import functools
import http.client
import json
import os
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.storage import images
from controller.errors import ControllerError
from tests.fixtures.api import config_values_for, enable, make_caller, new_context
from tests.fixtures.concurrency import Loops
from tests.fixtures.libvirtd import cleanup_hypervisor
from tests.fixtures.slapd import ROOT_DN, SUFFIX
from tests.fixtures.agent import run_agent
from tests.fixtures.server import Http, free_port, start_server, stop_server

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

CLIENTS = 16
SUPERUSERS = (1, 2)  # these clients also (de)activate a user of their own: an LDAP write
# Clients 0, 4, 8 and 12 make, power and delete instances (each create starts a QEMU: on
# two cores, more would measure the machine); the others make and delete volumes.
INSTANCE_EVERY = 4
CLIENT_TIMEOUT = 30.0  # seconds a client waits for any answer
HEALTH_LIMIT = 1.0  # /healthz answers within this, throughout
HEALTH_EVERY = 0.25
BEFORE, DURING, AFTER = 4.0, 12.0, 10.0  # seconds of mix before, during and after a fault
RETRY_SECONDS = 2  # [hosts] retry_seconds: how soon a host that came back is tried again
# A part that came back is asked again at the next call after its back-off; calls that
# began after this long must all succeed again.
RECOVERY_GRACE = RETRY_SECONDS + 3.0


# -- one request's record ---------------------------------------------------------------------
@dataclass
class Call:
    client: int
    op: str
    needs: bool  # whether it needs the part that fails
    started: float
    ended: float
    status: object  # an HTTP status, "down" (no connection: d's down time) or "timeout"
    body: object = None
    # A delete asked again because the last one got no answer: a 404 says that one was done.
    repeated_delete: bool = False

    @property
    def ok(self) -> bool:
        if self.repeated_delete and self.status == 404:
            return True
        return isinstance(self.status, int) and 200 <= self.status < 300


@dataclass
class Probe:
    started: float
    latency: float
    status: object


@dataclass
class Run:
    """What one scenario's mix and prober saw, and when the fault began and ended."""

    calls: list[Call] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    fault_start: float = 0.0
    fault_end: float = 0.0
    # When restore() returned: the part answers again (a libvirtd's start takes seconds,
    # its QEMU probe included). The recovery grace counts from here, not from fault_end.
    back_at: float = 0.0
    down: tuple[float, float] | None = None  # (d): from the kill until the new server answered
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- the deployment ---------------------------------------------------------------------------
@dataclass
class Client:
    index: int
    username: str
    headers: dict
    spare: str | None = None  # the user a superuser client (de)activates
    instance: str | None = None  # the instance it is cycling, while it exists
    volume: str | None = None  # its volume, made and deleted by clients without instances
    standing: str | None = None  # (c): an instance of its own on the host that dies
    # Its last delete (of its instance or volume) got no answer: the server may have done it
    # and died before answering (a SIGKILL), so it asks for that delete again first.
    delete_unanswered: bool = False


class Deployment:
    """One config and database served by `cloud-agent serve`, with its catalog and clients."""

    def __init__(self, tmp_path: Path, values: dict):
        self.tmp = tmp_path
        self.config_path = tmp_path / "controller.ini"
        self.ctx = new_context(values, path=self.config_path, real_adapters=True)
        self.store = self.ctx.store
        self.db = self.ctx.config.database_path
        self.log = tmp_path / "serve.log"
        self.proc = None
        self.http: Http | None = None
        self.port = free_port()

    def agent(self, *args: str, check: bool = True) -> tuple[int, dict]:
        done = run_agent("--config", str(self.config_path), "--json", *args, timeout=120)
        if check:
            assert done.returncode == 0, done.stderr
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}

    def add_remote_host(self, remote) -> None:
        """`host add` over qemu+tcp (loopback only); an agent that asks for --insecure gets it."""
        argv = ["host", "add", "remote", "--uri", remote.uri, "--storage-pool", remote.pool,
                "--network", remote.network]
        code, out = self.agent(*argv, "--insecure", check=False)
        if code != 0 and "no such option" in json.dumps(out).lower():
            code, out = self.agent(*argv, check=False)
        assert code == 0 and out["reachable"] is True, out

    def catalog(self) -> None:
        self.image = images.add_image(self.ctx, name="Blank", os_name="debian", os_major="12", os_minor="0",
                                      min_disk=1, min_ram=64)["id"]
        self.flavor = images.add_flavor(self.ctx, name="mini", memory=128, disk=1, vcpu=1)["id"]

    def make_clients(self, prefix: str) -> list[Client]:
        clients = []
        for i in range(CLIENTS):
            roles = ("superuser",) if i in SUPERUSERS else ()
            caller = make_caller(self.ctx, f"{prefix}{i}@example.org", roles=roles)
            username = f"{prefix}{i}"
            enable(self.ctx, caller, username=username)
            client = Client(index=i, username=username, headers=caller.headers)
            if i in SUPERUSERS:
                spare = make_caller(self.ctx, f"{prefix}spare{i}@example.org")
                enable(self.ctx, spare, username=f"{prefix}s{i}")
                client.spare = spare.id
            clients.append(client)
        return clients

    def serve(self, prefix: str, *, second_host=None) -> list[Client]:
        """A scenario's starting point: the catalog, the clients (named `prefix`), `second_host`
        added as "remote" when given, the server started and the clients' volumes made."""
        self.catalog()
        clients = self.make_clients(prefix)
        if second_host is not None:
            self.add_remote_host(second_host)
        self.start()
        give_volumes(self, clients)
        return clients

    def start(self) -> None:
        self.proc, self.http = start_server(self.config_path, self.log, port=self.port)

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)

    def host_of(self, instance_id: str) -> str | None:
        # Read-only, beside the server (WAL): which host the create placed it on.
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10) as conn:
            row = conn.execute("SELECT host FROM instances WHERE id = ?", (instance_id,)).fetchone()
        return row[0] if row else None

    def close(self, hosts=("default", "remote")) -> None:
        """Stop the server, remove every domain and base disk of this deployment's prefix
        from the hosts that answer, close the database."""
        from controller.hosts.host_routing import hypervisor_of_host

        self.stop()
        for name in hosts:
            try:
                cleanup_hypervisor(hypervisor_of_host(self.ctx, name))
            except ControllerError:
                pass
        self.store.close()


def base_values(tmp_path, guest_virt, sysroot, remote, network) -> dict:
    # The config's own host is a libvirtd of this session's own (never the shared one, which
    # another session may stop or restart at any time), on the shared one's NAT bridge.
    # Homes in a plain folder (quota backend none): a libvirtd another test session
    # started keeps the mounts of its start, so it cannot share homes from a filesystem
    # this session mounted later (virtiofs would find no export directory).
    home_root = tmp_path / "homes"
    home_root.mkdir(mode=0o755)
    values = config_values_for(tmp_path / "state")
    values["controller"]["profile"] = "production"
    values["libvirt"].update(uri=remote.uri, storage_pool=remote.pool, domain_prefix=f"ft{uuid.uuid4().hex[:6]}-",
                             virt_type=guest_virt.virt_type, cpu_mode=guest_virt.cpu_mode)
    values["network"].update(name=remote.network, subnet=network.subnet)
    values["volumes"].update(home_root=home_root, quota_backend="none")
    values["unix"]["root"] = sysroot
    values["hosts"] = {"retry_seconds": RETRY_SECONDS, "connect_timeout_seconds": 5}
    # The clients' guests are blank disks, which never answer the power button: a clean
    # reboot or power-off would wait the whole timeout out each time. These scenarios are
    # about faults, not shutdowns (tests/instances/test_power_tasks.py has those): pull the
    # plug at once, as before power tasks were clean.
    values["guest"] = dict(values.get("guest", {}), shutdown_timeout_seconds=0)
    values["capacity"] = {"cpu_allocation_ratio": "64", "ram_allocation_ratio": "1.0",
                          "reserved_host_memory_mb": "0"}
    values["limits"] = {"instances": -1, "vcpus": -1, "memory_mb": -1, "groups": -1, "managed_users": -1}
    (tmp_path / "state").mkdir(exist_ok=True)
    return values


# -- the mix ----------------------------------------------------------------------------------
class Mix(Loops):
    """CLIENTS threads running their loops until stopped, and the /healthz prober."""

    def __init__(self, deployment: Deployment, clients: list[Client], run: Run, *, needs, ldap_writes=False):
        self.d, self.clients, self.run = deployment, clients, run
        self.needs = needs  # needs(op, client, instance_id) -> bool
        self.ldap_writes = ldap_writes
        super().__init__([functools.partial(self._client, c) for c in clients] + [self._prober],
                         join_seconds=CLIENT_TIMEOUT + 10)

    def call(self, client: Client, op: str, method: str, path: str, body=None, *, instance=None,
             repeated_delete: bool = False) -> Call:
        began = time.monotonic()
        try:
            status, _, answer = self.d.http.call(method, path, body, headers=client.headers, timeout=CLIENT_TIMEOUT)
        except TimeoutError:
            status, answer = "timeout", None
        except (OSError, http.client.HTTPException) as e:  # URLError, a reset: nothing answered
            reason = getattr(e, "reason", e)
            status, answer = ("timeout" if isinstance(reason, TimeoutError) else "down"), str(e)
        except ValueError as e:  # a 2xx whose body is not JSON
            status, answer = "not JSON", str(e)
        call = Call(client=client.index, op=op, needs=self.needs(op, client, instance), started=began,
                    ended=time.monotonic(), status=status, body=answer, repeated_delete=repeated_delete)
        with self.run.lock:
            self.run.calls.append(call)
        if status == "down":
            self.stopping.wait(0.2)  # (d): the server is not there; a client tries again shortly
        return call

    def _client(self, c: Client) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            # The clients whose calls need the failed part ask nothing else, so that they
            # are asked throughout however slow the rest is.
            if c.spare and self.ldap_writes:
                for active in (0, 1):
                    self.call(c, "user-active", "POST", f"/v1/user/update/{c.spare}", {"active": active})
                continue
            if c.standing:
                for what in ("power-off", "power-on"):
                    self.call(c, "power", "PUT", f"/v1/server-instance/{c.standing}", {"task": {"what": what}},
                              instance=c.standing)
                self.stopping.wait(0.2)
                continue
            self.call(c, "read", "GET", "/v1/server-flavor")
            g = self.call(c, "group-create", "POST", "/v1/group",
                          {"group-name": f"{c.username}g{n}", "group-members": [c.username]})
            if g.ok:
                self.call(c, "group-delete", "DELETE", f"/v1/group/{g.body['data'][0]['group-id']}")
            if c.index % INSTANCE_EVERY == 0:
                self._instance_cycle(c)
            else:
                self._volume_cycle(c)
            self.call(c, "list", "GET", "/v1/server-instance")
            self.stopping.wait(0.2)

    def _delete(self, c: Client, op: str, path: str, *, instance=None) -> bool:
        """Ask for a delete; True when it was done. A client that got no answer asks again, as
        any client would: the server may have deleted it and died before answering, so a 404
        to the repeated delete means done, and the resource is used no more meanwhile."""
        call = self.call(c, op, "DELETE", path, instance=instance, repeated_delete=c.delete_unanswered)
        c.delete_unanswered = call.status in ("down", "timeout") or (c.delete_unanswered and not call.ok)
        return call.ok

    def _instance_cycle(self, c: Client) -> None:
        if c.instance is not None and c.delete_unanswered:
            if self._delete(c, "instance-delete", f"/v1/server-instance/{c.instance}", instance=c.instance):
                c.instance = None
            return
        if c.instance is None:
            made = self.call(c, "instance-create", "POST", "/v1/server-instance",
                             {"server-image": self.d.image, "server-flavor": self.d.flavor})
            if not made.ok:
                return
            c.instance = made.body["data"][0]["id"]
        for what in ("power-off", "power-on"):
            if not self.call(c, "power", "PUT", f"/v1/server-instance/{c.instance}", {"task": {"what": what}},
                              instance=c.instance).ok:
                return  # tried again next round (its host may be down)
        if self._delete(c, "instance-delete", f"/v1/server-instance/{c.instance}", instance=c.instance):
            c.instance = None

    def _volume_cycle(self, c: Client) -> None:
        if c.volume is None:
            made = self.call(c, "volume-create", "POST", "/v1/storage-volume",
                             {"volume-size": 1, "volume-type": {"visibility": "cluster"}})
            if not made.ok:
                return
            c.volume = made.body["data"][0]["volume-id"]
        if self._delete(c, "volume-delete", f"/v1/storage-volume/{c.volume}"):
            c.volume = None

    def _prober(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                status, _, _ = self.d.http.call("GET", "/healthz", timeout=HEALTH_LIMIT * 5)
            except TimeoutError:
                status = "timeout"
            except (OSError, http.client.HTTPException) as e:
                status = "timeout" if isinstance(getattr(e, "reason", e), TimeoutError) else "down"
            latency = time.monotonic() - began
            with self.run.lock:
                self.run.probes.append(Probe(started=began, latency=latency, status=status))
            self.stopping.wait(max(0.0, HEALTH_EVERY - latency))


def give_volumes(d: Deployment, clients: list[Client], every: int = INSTANCE_EVERY) -> None:
    """Clients that cycle instances hold a volume throughout (a create needs one)."""
    for c in clients:
        if c.index % every == 0:
            status, _, body = d.http.call("POST", "/v1/storage-volume",
                                          {"volume-size": 1, "volume-type": {"visibility": "cluster"}},
                                          headers=c.headers, timeout=CLIENT_TIMEOUT)
            assert status == 201, body


def run_mix(d: Deployment, clients, *, needs, fault, restore, ldap_writes=False, during=DURING) -> Run:
    """BEFORE seconds of mix, fault(), `during` seconds, restore() (None: the part stays dead),
    AFTER seconds; returns what was seen."""
    run = Run()
    with Mix(d, clients, run, needs=needs, ldap_writes=ldap_writes):
        time.sleep(BEFORE)
        run.fault_start = time.monotonic()
        fault(run)
        time.sleep(during)
        run.fault_end = time.monotonic()
        if restore is not None:
            restore(run)
        run.back_at = time.monotonic()
        time.sleep(AFTER)
    return run


# -- what a run must show ---------------------------------------------------------------------
def _short(call: Call) -> str:
    body = call.body
    msg = body.get("msg") or body.get("message") if isinstance(body, dict) else body
    return f"{call.op} -> {call.status} after {call.ended - call.started:.1f} s ({str(msg)[:160]})"


def figures(name: str, run: Run, reconciled: str) -> dict:
    statuses = Counter(c.status for c in run.calls)
    ok = sum(n for s, n in statuses.items() if isinstance(s, int) and 200 <= s < 300)
    probes = [p for p in run.probes if not _in_down(run, p.started, p.started + p.latency)]
    back = [c.ended - run.fault_end for c in run.calls if c.needs and c.ok and c.started >= run.fault_end]
    return {
        "scenario": name,
        "requests": len(run.calls),
        "2xx": ok,
        "503": statuses.get(503, 0),
        "other": {str(s): n for s, n in sorted(statuses.items(), key=str)
                  if not (isinstance(s, int) and (200 <= s < 300 or s == 503))},
        "max_latency_s": round(max((c.ended - c.started for c in run.calls), default=0), 2),
        "healthz_max_latency_s": round(max((p.latency for p in probes), default=0), 3),
        "healthz_probes": len(probes),
        "recovery_s": round(min(back), 1) if back else None,
        "restart_s": round(run.back_at - run.fault_end, 1) if run.back_at else None,
        "reconcile": reconciled,
    }


def _in_down(run: Run, began: float, ended: float) -> bool:
    return run.down is not None and began < run.down[1] and ended > run.down[0]


def problems(run: Run, *, restored: bool, part: str) -> list[str]:
    """Every way the run broke the issue's requirements, as lines (empty: it held)."""
    out = []
    for c in run.calls:
        if isinstance(c.status, int) and c.status >= 500 and c.status != 503:
            out.append(f"{c.status} (no 5xx but 503 allowed): {_short(c)}")
        if c.status == "timeout":
            out.append(f"hung past its {CLIENT_TIMEOUT:g} s timeout: {_short(c)}")
        if c.status == "down" and not _in_down(run, c.started, c.ended):
            out.append(f"no answer outside the server's own down time: {_short(c)}")
    for p in run.probes:
        if _in_down(run, p.started, p.started + p.latency):
            continue
        if p.status == "timeout" or p.latency > HEALTH_LIMIT:
            out.append(f"/healthz took {p.latency:.2f} s ({p.status}) at {p.started - run.fault_start:+.1f} s "
                       "from the fault")
    for c in run.calls:
        if c.needs or c.ok or _in_down(run, c.started, c.ended):
            continue
        if c.status == 503 and c.started < run.fault_start < c.ended:
            # In flight when the part failed, so it may have been using it: a create that had
            # begun its spawn on the host as it died answers 503 (what it made there may
            # remain, so it is not placed again; reconcile removes it).
            continue
        out.append(f"does not need {part}, yet failed at {c.started - run.fault_start:+.1f} s: {_short(c)}")
    during = [c for c in run.calls if c.needs and c.started >= run.fault_start + 1 and c.ended <= run.fault_end]
    if run.down is None and not during:
        out.append(f"nothing that needs {part} was answered while it was down")
    for c in during:
        if c.status != 503 and not _in_down(run, c.started, c.ended):
            out.append(f"needs {part} while it is down, so 503 expected: {_short(c)}")
    if restored:
        after = [c for c in run.calls if c.needs and c.started >= max(run.fault_end, run.back_at) + RECOVERY_GRACE]
        if not after:
            out.append(f"nothing that needs {part} was asked after it came back")
        out += [f"needs {part}, which is back, yet failed: {_short(c)}" for c in after if not c.ok]
    return out


def reconciled(d: Deployment, *, fix_first: str | None = None) -> tuple[str, list]:
    """Run `cloud-agent reconcile` (after `--fix` when fix_first says why); (summary, drift left)."""
    summary = ""
    if fix_first:
        _, out = d.agent("reconcile", "--fix", check=False)
        fixed = Counter(i["kind"] for i in out.get("drift", []) if i["fixed"])
        summary = "fixed " + (", ".join(f"{n} {k}" for k, n in sorted(fixed.items())) or "nothing") + "; then "
    code, out = d.agent("reconcile", check=False)
    drift = out.get("drift", [out])
    summary += "no drift" if code == 0 and not drift else f"{len(drift)} drift: " + ", ".join(
        sorted({f"{i.get('kind')} {i.get('target')}" for i in drift}))
    return summary, drift


def report(tmp_path_factory, name: str, run: Run, summary: str) -> dict:
    row = figures(name, run, summary)
    print(f"\nfaults: {json.dumps(row)}")
    path = tmp_path_factory.getbasetemp() / "faults.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*(r for r in rows if r["scenario"] != name), row], indent=1))
    return row


def verdict(tmp_path_factory, name: str, run: Run, summary: str, drift: list, found: list[str]) -> None:
    """Print and keep the figures, then fail on anything the run broke (all of it, in one message)."""
    report(tmp_path_factory, name, run, summary)
    lines = found + [f"drift after the run: {i.get('kind')} {i.get('target')}: {i.get('detail')}" for i in drift]
    for line in lines:
        print(f"faults: {name}: {line}")
    assert not lines, f"{len(lines)} problems:\n" + "\n".join(lines[:40])


def _instance_ops(op: str) -> bool:
    return op in ("instance-create", "instance-delete", "power")


# -- the scenarios ----------------------------------------------------------------------------
def test_libvirtd_stops_and_starts_again(tmp_path, tmp_path_factory, remote_libvirtd, libvirt_private_network,
                                         guest_virt, sysroot):
    """(a): the config's own host is a libvirtd of this session's own, stopped and started."""
    values = base_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network)
    d = Deployment(tmp_path, values)
    try:
        clients = d.serve("fa")
        run = run_mix(d, clients, needs=lambda op, c, i: _instance_ops(op),
                      fault=lambda run: remote_libvirtd.stop(), restore=lambda run: remote_libvirtd.start())
        # --fix first: a create cut short when libvirtd stopped could not remove what it had
        # made there; its row keeps the intent "creating" and --fix removes both once it answers.
        summary, drift = reconciled(d, fix_first="creates cut short by the stop")
        verdict(tmp_path_factory, "libvirtd stopped and started", run, summary, drift,
                problems(run, restored=True, part="libvirt"))
    finally:
        if not _answers(remote_libvirtd.uri):
            remote_libvirtd.start()
        d.close()


def test_slapd_stops_and_starts_again(tmp_path, tmp_path_factory, private_slapd, remote_libvirtd,
                                      libvirt_private_network, guest_virt, sysroot):
    """(b): accounts in LDAP; the directory's slapd is stopped and started by its PID."""
    values = base_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network)
    values["directory"] = {"backend": "ldap", "uri": private_slapd.uri, "base_dn": SUFFIX, "bind_dn": ROOT_DN,
                           "bind_password_file": str(private_slapd.password_file), "uid_min": 42000,
                           "uid_max": 42999}
    d = Deployment(tmp_path, values)
    try:
        clients = d.serve("fb")
        # With LDAP accounts the API's groups are directory entries too ([groups] backend follows).
        run = run_mix(d, clients, needs=lambda op, c, i: op in ("user-active", "group-create", "group-delete"),
                      ldap_writes=True,
                      fault=lambda run: private_slapd.stop(), restore=lambda run: _restart_slapd(private_slapd))
        summary, drift = reconciled(d)
        verdict(tmp_path_factory, "slapd stopped and started", run, summary, drift,
                problems(run, restored=True, part="the directory"))
    finally:
        d.close(("default",))


def _restart_slapd(server) -> None:
    port = server.port
    server.start()
    # The config names the port: a server that had to move to another is another deployment.
    assert server.port == port, "slapd came back on another port"


def test_one_of_two_hosts_dies_for_good(tmp_path, tmp_path_factory, remote_libvirtd, another_remote_libvirtd,
                                        libvirt_private_network, guest_virt, sysroot):
    """(c): two hosts, libvirtds of this session's own; the second is SIGKILLed and stays dead. Instances on it are 503;
    everything else, creates included (placed on the host that lives), keeps succeeding."""
    values = base_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network)
    d = Deployment(tmp_path, values)
    try:
        clients = d.serve("fc", second_host=another_remote_libvirtd)
        # Two clients hold an instance on the host that will die (made while the default
        # host is disabled) and power it off and on throughout.
        d.agent("host", "disable", "default")
        for c in clients[2:8:4]:
            give_volumes(d, [c], every=1)
            status, _, body = d.http.call("POST", "/v1/server-instance",
                                          {"server-image": d.image, "server-flavor": d.flavor},
                                          headers=c.headers, timeout=CLIENT_TIMEOUT)
            assert status == 201, body
            c.standing = body["data"][0]["id"]
            assert d.host_of(c.standing) == "remote"
        d.agent("host", "enable", "default")
        on_remote: set[str] = {c.standing for c in clients if c.standing}

        def needs(op, c, instance):
            # Only what runs on the dead host needs it; a create is placed on a host that answers.
            if instance is None or op == "instance-create":
                return False
            if instance not in on_remote and d.host_of(instance) == "remote":
                on_remote.add(instance)
            return instance in on_remote

        run = run_mix(d, clients, needs=needs, fault=lambda run: another_remote_libvirtd.kill(),
                      restore=None)
        # The admin's answer to a host lost for good (docs/scaling.md): it is fenced (here it
        # stays killed), its instances are rebuilt on the host that lives, and it is forgotten.
        code, evacuated = d.agent("host", "evacuate", "remote", "--host-is-down", check=False)
        assert code == 0 and evacuated["failed"] == [], evacuated
        rebuilt = {r["id"] for r in evacuated["rebuilt"]}
        standing = {c.standing for c in clients if c.standing}
        assert standing <= rebuilt and {r["to"] for r in evacuated["rebuilt"]} == {"default"}, evacuated
        assert all(d.host_of(i) == "default" for i in standing)
        d.agent("host", "remove", "remote")
        summary, drift = reconciled(d)
        summary = f"evacuated {len(rebuilt)} instance(s), host removed; {summary}"
        verdict(tmp_path_factory, "one of two hosts dies for good", run, summary, drift,
                problems(run, restored=False, part="the dead host"))
    finally:
        if not _answers(another_remote_libvirtd.uri):
            another_remote_libvirtd.start()  # to remove what this test left there
        d.close()


def test_the_server_is_killed_and_started_again(tmp_path, tmp_path_factory, remote_libvirtd,
                                                libvirt_private_network, guest_virt, sysroot):
    """(d): SIGKILL to `cloud-agent serve` mid-mix; a new one on the same database and port."""
    values = base_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network)
    d = Deployment(tmp_path, values)
    down_for = 3.0

    def kill(run):
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(timeout=10)
        run.down = (run.fault_start, float("inf"))
        time.sleep(down_for)
        d.start()
        run.down = (run.fault_start, time.monotonic())

    try:
        clients = d.serve("fd")
        run = run_mix(d, clients, needs=lambda op, c, i: True, fault=kill, restore=None, during=0)
        # Calls that began after the new server answered (plus the back-off) all succeed.
        run.fault_end = run.down[1]
        # --fix first: the SIGKILL cut creates (and deletes) short; their rows carry the
        # intent reconcile finishes or undoes (nothing a client was told exists goes).
        summary, drift = reconciled(d, fix_first="a SIGKILL mid-create leaves rows with an intent")
        verdict(tmp_path_factory, "server SIGKILLed and started again", run, summary, drift,
                problems(run, restored=True, part="the server"))
    finally:
        d.close(("default",))


def _answers(uri: str) -> bool:
    from tests.fixtures.libvirtd import _libvirt_answers

    return _libvirt_answers(uri)


class _Crash(BaseException):
    """The `cloud-agent host drain` process dying mid-way."""


def test_a_drain_cut_short_whose_target_dies_then_the_runbook(tmp_path, remote_libvirtd, another_remote_libvirtd,
                                                              libvirt_private_network, guest_virt, sysroot):
    """(e), issue 27: a drain of the config's host moves an instance to the second host and
    dies just after the commit (the second host's copy is the instance now; the first still
    holds its own disk, shut off); then the second host dies for good. The runbook (evacuate
    the dead host, `reconcile --fix`, `host remove`) leaves the instance on its own disk on
    the first host, running once, and reconcile finds nothing. The server serves throughout."""
    from controller.maintenance import drain
    from controller.hosts.host_routing import hypervisor_of_host

    values = base_values(tmp_path, guest_virt, sysroot, remote_libvirtd, libvirt_private_network)
    values["hosts"]["shutdown_wait_seconds"] = 1  # a blank disk boots nothing that would answer ACPI
    d = Deployment(tmp_path, values)
    try:
        d.catalog()
        [owner] = d.make_clients("fe")[:1]
        d.add_remote_host(another_remote_libvirtd)
        d.start()
        give_volumes(d, [owner], every=1)
        d.agent("host", "disable", "remote")
        status, _, body = d.http.call("POST", "/v1/server-instance", {"server-image": d.image,
                                      "server-flavor": d.flavor}, headers=owner.headers, timeout=CLIENT_TIMEOUT)
        assert status == 201, body
        moving = body["data"][0]["id"]
        assert d.host_of(moving) == "default"
        d.agent("host", "enable", "remote")
        source = hypervisor_of_host(d.ctx, "default")
        disk_before = source.describe(moving).disk_path
        real = d.store.commit_move

        def crash(instance_id):
            real(instance_id)
            raise _Crash()

        d.store.commit_move = crash
        with pytest.raises(_Crash):
            drain.drain(d.ctx, "default")  # this process is the agent here; the server runs on
        d.store.commit_move = real
        assert d.host_of(moving) == "remote" and source.describe(moving).disk_path == disk_before
        another_remote_libvirtd.kill()  # the target dies for good (fenced: it stays killed)
        # The runbook.
        code, evacuated = d.agent("host", "evacuate", "remote", "--host-is-down", check=False)
        assert code == 0 and evacuated == {"host": "remote", "rebuilt": [], "failed": [],
                                           "kept": [{"id": moving, "to": "default"}]}, evacuated
        d.agent("reconcile", "--fix", check=False)
        d.agent("host", "remove", "remote")
        summary, drift = reconciled(d)
        assert drift == [], summary
        # Its own disk (never rebuilt from the image), running once, on the host its row names.
        info = source.describe(moving)
        assert d.host_of(moving) == "default" and info.disk_path == disk_before and info.status == "running"
        status, _, body = d.http.call("GET", f"/v1/server-instance/{moving}", headers=owner.headers,
                                      timeout=CLIENT_TIMEOUT)
        assert status == 200 and body["data"][0]["status"] == "running", body
        status, _, body = d.http.call("PUT", f"/v1/server-instance/{moving}", {"task": {"what": "power-off"}},
                                      headers=owner.headers, timeout=CLIENT_TIMEOUT)
        assert status == 200, body  # not 409 forever
    finally:
        if not _answers(another_remote_libvirtd.uri):
            another_remote_libvirtd.start()  # to remove what this test left there
        d.close()
