"""libvirt's test driver served by a libvirtd (`test+unix://...`), as the benchmark runs it.

The driver is the sandbox's: no volume streams, no guest, state in memory. But
it lives in the daemon, not in the server, and the daemon drops it when its
last client goes: the server still rebuilds every domain at start, and
statuses come over the remote connection's lifecycle events.
"""

import json
import time
import urllib.request

import pytest

from controller.config import config_from_dict, sandbox_values
from host_adapters import factory
from host_adapters.libvirt.volume_io import InProcessVolumeIO, StreamVolumeIO
from tests.fixtures.agent import agent_ok
from tests.fixtures.libvirtd import cleanup_hypervisor, remove_network, unique_prefix
from tests.fixtures.server import free_port, start_server
from tests.store.test_scale_load import _token



def _config(tmp_path, uri):
    values = sandbox_values(str(tmp_path))
    values["libvirt"]["uri"] = uri
    return config_from_dict(values)


@pytest.mark.parametrize("uri,test_driver", [
    ("test:///default", True),
    ("test+unix:///default?socket=/run/x/libvirt-sock", True),
    ("test+tcp://127.0.0.1/default", True),
    ("qemu:///system", False),
    ("qemu+tcp://node1/system", False),
    ("testing:///x", False),
])
def test_a_test_driver_uri_is_known_by_its_scheme(uri, test_driver):
    assert factory.is_test_driver(uri) is test_driver


def test_a_test_driver_behind_a_daemon_is_still_the_sandbox_but_may_hang(tmp_path):
    served = "test+unix:///default?socket=/run/x/libvirt-sock"
    adapters = factory.build_adapters(_config(tmp_path, served))
    hv = adapters.hypervisor
    # No streams, nothing kept between connections, nothing booted: as in-process.
    assert adapters.hypervisor_in_process
    assert isinstance(hv._io, InProcessVolumeIO) and hv._stand_in and hv._lean
    # But a daemon can stop answering: its connect is bounded like any host's.
    assert hv.connect_timeout and hv.connect_timeout > 0
    in_process = factory.build_adapters(_config(tmp_path, "test:///default"))
    assert in_process.hypervisor_in_process and in_process.hypervisor.connect_timeout is None
    real = factory.build_hypervisor(_config(tmp_path, "qemu+tcp://node1/system"))
    assert isinstance(real._io, StreamVolumeIO) and not real._stand_in and not real._lean


@pytest.fixture
def served_hypervisor(test_driver_daemon, tmp_path):
    import libvirt

    anchor = libvirt.open(test_driver_daemon.uri)  # keeps the daemon's test driver state across reconnects
    prefix = unique_prefix()
    values = sandbox_values(str(tmp_path))
    values["libvirt"].update(uri=test_driver_daemon.uri, domain_prefix=prefix)
    values["network"]["name"] = f"{prefix}net"
    hv = factory.build_hypervisor(config_from_dict(values))
    hv.ensure_network()
    yield hv
    cleanup_hypervisor(hv)
    remove_network(anchor, hv.network)
    anchor.close()


def _guest(hv, index):
    from host_adapters.guests.guest import GuestSpec, Nic

    return GuestSpec(hostname=f"served{index}", users=(), groups=(),
                     nics=(Nic(mac="52:54:00:bb:00:%02x" % index, address=f"10.213.8.{index + 2}", prefix=16,
                               gateway="10.213.0.1", network=hv.network),))


def test_statuses_over_the_daemon_are_kept_current_by_its_events(served_hypervisor, test_driver_daemon,
                                                                  monkeypatch):
    import libvirt

    hv = served_hypervisor
    hv.check()  # the driver is known as the test driver over the remote connection too
    base = hv.create_base_image("servedimg", size_gb=1)  # a blank stand-in: no streams
    a, b = "0f000000-0000-4000-8000-00000000000a", "0f000000-0000-4000-8000-00000000000b"
    for i, iid in enumerate((a, b)):
        hv.spawn(iid, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, i))
    other = libvirt.open(test_driver_daemon.uri)
    # The domain is lean (no disk device) and its seed is readable back (kept by the adapter).
    assert "<disk" not in other.lookupByName(hv._names.domain(a)).XMLDesc(0)
    assert hv.describe(a).seed is not None and hv.describe(a).status == "running"
    assert hv.statuses()[a] == "running"
    reads = []
    monkeypatch.setattr(hv, "_read_statuses", lambda: reads.append(1) or {})
    # Changed by another client of the daemon: the event reaches the adapter.
    other.lookupByName(hv._names.domain(a)).destroy()
    deadline = time.monotonic() + 5
    while hv.statuses().get(a) != "shutoff" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hv.statuses()[a] == "shutoff" and hv.status(a) == "shutoff"
    other.lookupByName(hv._names.domain(a)).create()
    while hv.statuses().get(a) != "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hv.statuses()[a] == "running"
    hv.power_off(b)
    assert hv.statuses()[b] == "shutoff"
    assert reads == []
    other.close()


def test_a_get_and_a_list_ask_the_host_nothing_until_the_connection_closes(test_driver_daemon, tmp_path,
                                                                           monkeypatch):
    """Nor isAlive(): a list made it while holding its host's sync lock, and the lists of the
    host queued behind its GIL hand-over (docs/performance.md, 2026-11-28)."""
    from controller.errors import HostError

    values = sandbox_values(str(tmp_path))
    values["libvirt"].update(uri=test_driver_daemon.uri, domain_prefix=unique_prefix())
    hv = factory.build_hypervisor(config_from_dict(values))
    hv.ensure_network()
    base = hv.create_base_image("closeimg", size_gb=1)
    a = "0f000000-0000-4000-8000-0000000000c1"
    hv.spawn(a, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, 9))
    assert hv.statuses()[a] == "running"
    mark, _, _ = hv.status_changes(None)
    checks = []
    real_connection = hv._connection
    monkeypatch.setattr(hv, "_connection", lambda: checks.append(1) or real_connection())
    assert [hv.status(a) for _ in range(5)] == ["running"] * 5
    assert hv.status_changes(mark) == (mark, {}, False)  # what a list asks
    assert hv.statuses() == {a: "running"}
    assert checks == []  # not even isAlive(): the connection's close callback watches it
    test_driver_daemon.stop()  # the host goes away: its close callback marks the statuses stale
    deadline = time.monotonic() + 10
    while not hv._live.closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hv._live.closed
    with pytest.raises(HostError):
        hv.status(a)  # asked again, and the host does not answer: never the stale "running"
    with pytest.raises(HostError):
        hv.status_changes(mark)  # nor to a list
    assert checks


def test_a_get_before_any_list_takes_the_statuses_from_events_not_from_calls(served_hypervisor, test_driver_daemon,
                                                                               tmp_path, monkeypatch):
    """A host that served no list yet (only GETs and creates, as during a burst of creates):
    status() sets up the event-kept statuses rather than asking the host for the domain, and
    a change made by another client still shows at once through its event."""
    import libvirt

    hv = served_hypervisor
    base = hv.create_base_image("getimg", size_gb=1)
    a = "0f000000-0000-4000-8000-0000000000d1"
    hv.spawn(a, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, 11))
    # A second adapter on the same host (another server process): it never listed.
    values = sandbox_values(str(tmp_path / "second"))
    values["libvirt"].update(uri=test_driver_daemon.uri, domain_prefix=hv._names.prefix)
    fresh = factory.build_hypervisor(config_from_dict(values))
    lookups = []
    real_domain = fresh._domain
    monkeypatch.setattr(fresh, "_domain", lambda conn, i: lookups.append(i) or real_domain(conn, i))
    assert [fresh.status(a) for _ in range(3)] == ["running"] * 3
    assert lookups == []  # no per-domain look-up: the statuses come from one read, then events
    other = libvirt.open(test_driver_daemon.uri)
    try:
        other.lookupByName(hv._names.domain(a)).destroy()
        deadline = time.monotonic() + 5
        while fresh.status(a) != "shutoff" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fresh.status(a) == "shutoff" and lookups == []
    finally:
        other.close()


def _call(port, method, path, token, userid, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"X-Auth-Token": token, "X-Auth-Cloudauth-Id": userid,
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.real_commands
def test_the_server_rebuilds_the_daemons_domains_at_every_start(tmp_path, test_driver_daemon):
    import libvirt

    state, config = tmp_path / "state", tmp_path / "state" / "controller.ini"
    agent_ok(config, "init", "--sandbox", str(state))
    config.write_text(config.read_text().replace("uri = test:///default", f"uri = {test_driver_daemon.uri}"))
    admin = agent_ok(config, "user", "create-superuser", "--email", "admin@example.org", "--password-file", "-",
                     input="Admin-pass-2026-x\n")
    loaded = agent_ok(config, "sandbox", "load", "--users", "12", "--owners", "2", "--managed-per-owner", "2",
                      "--instances", "6", "--owner-instances", "2", "--groups", "2", "--members-per-group", "2",
                      timeout=300)
    assert loaded["instances"] == 6

    def domains():
        conn = libvirt.open(test_driver_daemon.uri)
        try:
            return sorted(d.name() for d in conn.listAllDomains(0) if d.name().startswith("cc-"))
        finally:
            conn.close()

    for start in (1, 2):
        port = free_port()
        server, _ = start_server(config, tmp_path / f"serve{start}.log", port=port, timeout=120)
        try:
            token = _token(port, admin)
            listed = _call(port, "GET", "/v1/server-instance", token, admin["userid"])["data"]
            assert len(listed) == 6 and {i["status"] for i in listed} == {"running"}
            assert len(domains()) == 6  # in the daemon, seen by any of its clients
            one = listed[0]["id"]
            # Over the remote connection the adapter's own change and the lists agree.
            _call(port, "PUT", f"/v1/server-instance/{one}", token, admin["userid"], {"task": {"what": "power-off"}})
            statuses = {i["id"]: i["status"] for i in _call(port, "GET", "/v1/server-instance", token,
                                                              admin["userid"])["data"]}
            assert statuses[one] == "shutoff"
            _call(port, "PUT", f"/v1/server-instance/{one}", token, admin["userid"], {"task": {"what": "power-on"}})
        finally:
            server.terminate()
            server.wait(timeout=30)
        log_text = (tmp_path / f"serve{start}.log").read_text()
        assert log_text.count("fixed domain-missing") == 6 and "sandbox reconcile: left" not in log_text
        # The server was the daemon's last client: the test driver forgot every domain
        # (once the daemon has seen the connection go).
        deadline = time.monotonic() + 10
        while domains() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert domains() == []


def test_a_pool_too_long_for_the_remote_protocol_still_lists_the_domains(monkeypatch):
    """A remote connection lists at most 16,384 volumes of a pool (10,000 instances have
    20,000): that refusal is an answer, not a lost connection to reopen."""
    import libvirt

    from host_adapters.libvirt.connection import _connection_lost
    from host_adapters.libvirt.driver import LibvirtHypervisor

    class TooMany(libvirt.libvirtError):
        def __init__(self):
            Exception.__init__(self, "too many")

        def get_error_code(self):
            return libvirt.VIR_ERR_INTERNAL_ERROR

        def get_error_domain(self):
            return libvirt.VIR_FROM_RPC

        def get_error_message(self):
            return "internal error: Too many storage_vols '20001' for limit '16384'"

    class Named:
        def __init__(self, name):
            self._name = name

        def name(self):
            return self._name

    hv = LibvirtHypervisor("test+unix:///default?socket=/nowhere", storage_pool="default-pool")
    iid = "0f000000-0000-4000-8000-0000000000aa"

    class Pool:
        def listAllVolumes(self, _flags):
            raise TooMany()

    class Conn:
        def listAllDomains(self, _flags):
            return [Named(hv._names.domain(iid)), Named("someone-else")]

    opened = []
    monkeypatch.setattr(hv, "_connection", lambda: opened.append(1) or Conn())
    monkeypatch.setattr(hv, "_pool", lambda conn: Pool())
    assert not _connection_lost(TooMany())
    assert hv.list_instances() == [iid]
    assert opened == [1]  # not reopened
