"""A hypervisor host is managed only over an encrypted, authenticated transport unless the
admin says --insecure (issue 16, finding 15): `host add` refuses qemu+tcp:// without SASL,
no_verify=1 and the like, warns on stderr when told --insecure, and `check` warns about the
config's [libvirt] uri and every recorded host."""

import json
import sqlite3

import pytest

from controller.hosts import host_records
from controller.errors import InvalidInput
from controller.hosts.libvirt_uri import transport_risks
from tests.agent.test_agent_controller import Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)

SAFE = [
    "qemu:///system",
    "qemu+unix:///system",
    "qemu:///system?no_verify=1",  # a local socket: nothing to verify
    "test:///default",
    "qemu+ssh://root@node01/system",
    "qemu+ssh://root@node01/system?no_tty=1&keyfile=/root/.ssh/cc",
    "qemu+ssh://node01/system?no_verify=0",
    "qemu+libssh://node01/system?known_hosts_verify=normal",
    "qemu+libssh2://node01/system?known_hosts=/root/.ssh/known_hosts",
    "qemu://node01/system",  # TLS is libvirt's default for a remote host
    "qemu+tls://node01/system?pkipath=/etc/pki/cc&no_verify=+0",
    "qemu+tls://node01/system?tls_priority=NORMAL:-VERS-SSL3.0",
    "qemu+tcp://node01/system?auth=sasl",
    "QEMU+TCP://node01/system?AUTH=sasl.gssapi",
]

UNSAFE = [
    ("qemu+tcp://node01/system", "tcp transport"),
    ("qemu+tcp://127.0.0.1:16509/system", "tcp transport"),
    ("qemu+TCP://node01/system", "tcp transport"),
    ("qemu+tcp://node01/system?auth=none", "tcp transport"),
    ("qemu+tcp://node01/system?auth=sasl&auth=none", "tcp transport"),
    ("qemu+tls://node01/system?no_verify=1", "TLS certificate"),
    ("qemu://node01/system?no_verify=1", "TLS certificate"),
    ("qemu://node01/system?NO_VERIFY=%31", "TLS certificate"),
    ("qemu+tls://node01/system?no_verify=-1", "TLS certificate"),
    ("qemu+tls://node01/system?no_verify=yes", "TLS certificate"),
    ("qemu+tls://node01/system?a=1;no_verify=1", "TLS certificate"),
    ("qemu+tls://node01/system?no_verify=0&no_verify=1", "TLS certificate"),
    ("qemu+ssh://root@node01/system?no_verify=1", "ssh host key"),
    ("qemu+libssh://node01/system?known_hosts_verify=ignore", "ssh host key"),
    ("qemu+libssh2://node01/system?known_hosts_verify=auto", "ssh host key"),
    ("qemu+ext:///system?command=/usr/local/bin/tunnel", "ext transport"),
    ("qemu+tls://node01/system?tls_priority=NORMAL:%2BANON-ECDH", "tls_priority"),
    ("qemu+tls://node01/system?tls_priority=NORMAL:+NULL", "tls_priority"),
    ("qemu+tls://node01/system?tls_priority=NORMAL:%25VERIFY_ALLOW_BROKEN", "tls_priority"),
    ("node01", "alias"),
]


@pytest.mark.parametrize("uri", SAFE)
def test_encrypted_and_authenticated_transports_pass(uri):
    assert transport_risks(uri) == []


@pytest.mark.parametrize("uri, word", UNSAFE)
def test_unencrypted_or_unverified_transports_are_named(uri, word):
    risks = transport_risks(uri)
    assert risks and any(word in r for r in risks), risks


def test_a_long_boolean_is_not_read_with_int():
    assert transport_risks("qemu+tls://node01/system?no_verify=" + "1" * 5000)
    assert transport_risks("qemu+tls://node01/system?no_verify=" + "0" * 5000) == []


@pytest.mark.parametrize("uri, word", UNSAFE[:1] + UNSAFE[5:6] + UNSAFE[12:13])
def test_the_service_refuses_an_unsafe_host_without_insecure(cctx, adapters, uri, word):
    adapters.fake_hosts.add("node-a")  # a host that answers at this URI
    with pytest.raises(InvalidInput, match=word) as raised:
        host_records.add_host(cctx, name="node-a", uri=uri)
    assert "--insecure" in raised.value.message
    assert [h["name"] for h in cctx.store.list_hosts()] == ["default"]  # the config's own only
    # Told so, it connects (the fake host answers) and records the host.
    added = host_records.add_host(cctx, name="node-a", uri=uri, insecure=True)
    assert added["name"] == "node-a" and cctx.store.get_host("node-a")["uri"] == uri


# -- the agent ---------------------------------------------------------------------------------
def host_rows(sandbox) -> list[str]:
    return [r["name"] for r in sandbox.rows("SELECT name FROM hosts ORDER BY name")]


@pytest.mark.parametrize("uri, word", [
    ("qemu+tcp://127.0.0.1:1/system", "tcp transport"),
    ("qemu+tls://127.0.0.1:1/system?no_verify=1", "TLS certificate"),
    ("qemu+ssh://root@127.0.0.1:1/system?no_verify=1", "ssh host key"),
])
def test_host_add_refuses_without_insecure_and_warns_with_it(sandbox, uri, word):
    before = host_rows(sandbox)
    proc = sandbox.run("host", "add", "node-x", "--uri", uri)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: host node-x not added: ") and word in proc.stderr
    assert "--insecure" in proc.stderr and "warning" not in proc.stderr
    assert host_rows(sandbox) == before
    # With --insecure the URI is tried (nothing answers on port 1), after a warning on stderr.
    proc = sandbox.run("--json", "host", "add", "node-x", "--uri", uri, "--insecure")
    assert proc.returncode == 1
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: host node-x: ")]
    assert len(warnings) == 1 and word in warnings[0], proc.stderr
    assert "not added" in json.loads(proc.stdout)["error"] and word not in json.loads(proc.stdout)["error"]
    assert host_rows(sandbox) == before


def test_check_warns_about_unsafe_hosts_and_the_configs_uri(sandbox):
    proc = sandbox.run("--json", "check")
    assert proc.stderr == "" and "warnings" not in json.loads(proc.stdout)
    db = sqlite3.connect(sandbox.db_path)
    with db:
        db.execute("INSERT INTO hosts (name, uri, storage_pool, network, created_at_utc, updated_at_utc) "
                   "VALUES ('plain', 'qemu+tcp://127.0.0.1:1/system', 'p', 'n', 'x', 'x')")
    db.close()
    proc = sandbox.run("--json", "check")
    doc = json.loads(proc.stdout)
    tcp = transport_risks("qemu+tcp://127.0.0.1:1/system")[0]
    assert doc["warnings"] == [f"host plain qemu+tcp://127.0.0.1:1/system: {tcp}"]
    assert proc.stderr == f"warning: {doc['warnings'][0]}\n"
    # The config's own [libvirt] uri too: here an ssh URI that accepts unknown host keys.
    text = open(sandbox.config).read()
    assert "uri = test:///default\n" in text
    with open(sandbox.config, "w") as f:
        f.write(text.replace("uri = test:///default\n", "uri = qemu+ssh://127.0.0.1:1/system?no_verify=1\n"))
    proc = sandbox.run("--json", "check")
    assert json.loads(proc.stdout)["warnings"] == [
        "[libvirt] uri qemu+ssh://127.0.0.1:1/system?no_verify=1: no_verify accepts an ssh host key never seen before",
        f"host plain qemu+tcp://127.0.0.1:1/system: {tcp}"]
    assert proc.stderr.count("warning: ") == 2
