"""LdapDirectory: unit tests against a recording stand-in for python-ldap, and
integration tests against a private slapd (tests/fixtures/slapd.py)."""

import os
import signal
import socket
import threading
import time

import ldap
import pytest

from controller.errors import Conflict, HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.accounts import ldap_directory
from host_adapters.accounts.directory import Directory, PosixAccount
from host_adapters.accounts.ldap_directory import LdapDirectory, ldap_directory_from_config, read_bind_password

from tests.fixtures.interfaces import assert_offers_the_interface
from tests.users.test_local_directory import DirectoryContract

UID_MIN = 20000


def make(server, base_dn=None, **kwargs) -> LdapDirectory:
    args = dict(uri=server.uri, base_dn=base_dn or server.base_dn, bind_dn=server.bind_dn,
                bind_password=server.password, uid_min=UID_MIN, uid_max=UID_MIN + 99, timeout=5)
    args.update(kwargs)
    return LdapDirectory(**args)


@pytest.fixture
def directory(ldap_tree):
    d = make(ldap_tree.server, ldap_tree.base_dn)
    yield d
    d._drop()


def as_admin(server):
    """A connection bound as the tree's admin: what an admin (or another tool) writes by hand."""
    conn = ldap.initialize(server.uri)
    conn.simple_bind_s(server.bind_dn, server.password)
    return conn


def add_group_by_hand(ldap_tree, name: str, gid: int, members=()) -> str:
    """A posixGroup made without the directory; its DN."""
    dn = f"cn={name},ou=groups,{ldap_tree.base_dn}"
    entry = [("objectClass", [b"posixGroup"]), ("cn", [name.encode()]), ("gidNumber", [str(gid).encode()])]
    if members:
        entry.append(("memberUid", [m.encode() for m in members]))
    conn = as_admin(ldap_tree.server)
    try:
        conn.add_s(dn, entry)
    finally:
        conn.unbind_s()
    return dn


def ldapsearch(server, base, flt, *attrs) -> dict[str, dict[str, list[str]]]:
    """Entries by DN, as the ldapsearch command sees them."""
    out = subp.run(["ldapsearch", "-x", "-LLL", "-o", "ldif-wrap=no", "-H", server.uri, "-D", server.bind_dn,
                    "-y", server.password_file, "-b", base, flt, *attrs], timeout=30).stdout
    entries: dict[str, dict[str, list[str]]] = {}
    for block in out.strip().split("\n\n"):
        if not block.strip():
            continue
        lines = block.splitlines()
        dn = lines[0].split(": ", 1)[1]
        attributes: dict[str, list[str]] = {}
        for line in lines[1:]:
            key, value = line.split(": ", 1)
            attributes.setdefault(key, []).append(value)
        entries[dn] = attributes
    return entries


# -- interface and configuration ---------------------------------------------------


def test_public_methods_match_the_interface():
    assert_offers_the_interface(LdapDirectory, Directory)


def test_read_bind_password_strips_one_trailing_newline(tmp_path):
    f = tmp_path / "pw"
    f.write_text("s3cret \n\n")
    assert read_bind_password(str(f)) == "s3cret \n"
    f.write_text("s3cret\r\n")
    assert read_bind_password(str(f)) == "s3cret"


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_read_bind_password_missing_or_empty(tmp_path, content):
    f = tmp_path / "pw"
    if content is not None:
        f.write_text(content)
    with pytest.raises(HostUnavailable, match="bind password file"):
        read_bind_password(str(f))


def test_from_config_maps_every_key(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    d = ldap_directory_from_config({
        "backend": "ldap", "uri": "ldap://ldap.example.org/", "base_dn": "dc=example,dc=org",
        "bind_dn": "cn=cc,dc=example,dc=org", "bind_password_file": str(pw), "people_ou": "ou=users",
        "groups_ou": "ou=posixgroups", "uid_min": "5000", "uid_max": "5999", "default_shell": "/bin/zsh",
        "tls_ca_file": "/etc/ssl/ca.pem", "starttls": "yes", "timeout": "3",
    })
    assert (d._uri, d._base_dn, d._bind_dn, d._bind_password) == (
        "ldap://ldap.example.org/", "dc=example,dc=org", "cn=cc,dc=example,dc=org", "secret")
    assert (d._people_dn, d._groups_dn) == ("ou=users,dc=example,dc=org", "ou=posixgroups,dc=example,dc=org")
    assert (d._uid_min, d._uid_max, d._shell) == (5000, 5999, "/bin/zsh")
    assert (d._tls_ca_file, d._starttls, d._timeout) == ("/etc/ssl/ca.pem", True, 3.0)
    assert "secret" not in repr(d)


def test_from_config_defaults(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("secret")
    d = ldap_directory_from_config({"uri": "ldap://h/", "base_dn": "dc=x", "bind_dn": "cn=a,dc=x",
                                    "bind_password_file": str(pw)})
    assert (d._people_dn, d._groups_dn) == ("ou=people,dc=x", "ou=groups,dc=x")
    assert (d._uid_min, d._uid_max) == (10000, 60000)
    assert (d._shell, d._tls_ca_file, d._starttls, d._timeout) == ("/bin/bash", None, False, 10.0)


@pytest.mark.parametrize("change, match", [
    ({"uri": ""}, "uri is required"),
    ({"bind_password_file": ""}, "bind_password_file is required"),
    ({"uid_min": "ten"}, "uid_min must be an integer"),
    ({"uid_min": "600", "uid_max": "500"}, "uid range"),
    ({"starttls": "maybe"}, "starttls"),
    ({"base_dn": "not a dn"}, "base_dn"),
    ({"uri": "ldaps://h/", "starttls": "yes"}, "ldaps"),
    ({"default_shell": "bash"}, "shell"),
])
def test_from_config_refuses_bad_values(tmp_path, change, match):
    pw = tmp_path / "pw"
    pw.write_text("secret")
    section = {"uri": "ldap://h/", "base_dn": "dc=x", "bind_dn": "cn=a,dc=x", "bind_password_file": str(pw)}
    section.update(change)
    with pytest.raises(InvalidInput, match=match):
        ldap_directory_from_config(section)


# -- the connection, with a stand-in for python-ldap ------------------------------------


class FakeConn:
    """Records what LdapDirectory does to a connection; `fail` holds errors to raise in order."""

    def __init__(self, log, fail):
        self.log, self.fail = log, fail
        self.timeout = -1

    def _step(self, *call):
        self.log.append(call)
        if self.fail:
            raise self.fail.pop(0)

    def set_option(self, option, value):
        self.log.append(("set_option", option, value))

    def start_tls_s(self):
        self._step("start_tls_s")

    def simple_bind_s(self, dn, password):
        self._step("simple_bind_s", dn)

    def search_ext(self, base, scope, flt, attrs, serverctrls=()):
        self._step("search_ext", base, flt)
        return 1

    def result3(self, msgid, timeout=-1):
        return 101, [], 1, []

    def unbind_s(self):
        self.log.append(("unbind_s",))


@pytest.fixture
def fake_ldap(monkeypatch):
    calls: list[tuple] = []
    fail: list[Exception] = []
    connections: list[FakeConn] = []

    def initialize(uri):
        calls.append(("initialize", uri))
        connections.append(FakeConn(calls, fail))
        return connections[-1]

    monkeypatch.setattr(ldap, "initialize", initialize)
    return calls, fail, connections


def _fake_directory(**kwargs) -> LdapDirectory:
    args = dict(uri="ldap://ldap.test/", base_dn="dc=x", bind_dn="cn=a,dc=x", bind_password="pw")
    args.update(kwargs)
    return LdapDirectory(**args)


def test_tls_options_come_before_a_new_context_and_starttls_before_bind(fake_ldap):
    calls, _, _ = fake_ldap
    _fake_directory(tls_ca_file="/etc/ca.pem", starttls=True, timeout=7).check()
    names = [c[0] if c[0] != "set_option" else c[1] for c in calls]
    assert ("set_option", ldap.OPT_X_TLS_CACERTFILE, "/etc/ca.pem") in calls
    assert ("set_option", ldap.OPT_X_TLS_REQUIRE_CERT, ldap.OPT_X_TLS_DEMAND) in calls
    assert ("set_option", ldap.OPT_NETWORK_TIMEOUT, 7) in calls
    assert names.index(ldap.OPT_X_TLS_CACERTFILE) < names.index(ldap.OPT_X_TLS_NEWCTX)
    assert names.index(ldap.OPT_X_TLS_NEWCTX) < names.index("start_tls_s")
    assert names.index("start_tls_s") < names.index("simple_bind_s") < names.index("search_ext")


def test_no_tls_options_unless_configured(fake_ldap):
    calls, _, _ = fake_ldap
    _fake_directory().check()
    assert not [c for c in calls if c[0] == "start_tls_s" or c[1:2] == (ldap.OPT_X_TLS_NEWCTX,)]


def test_a_lost_connection_is_retried_once_on_a_new_one(fake_ldap):
    calls, fail, connections = fake_ldap
    d = _fake_directory()
    d.check()
    fail.append(ldap.SERVER_DOWN({"desc": "Can't contact LDAP server"}))
    assert d.get_account("alice") is None
    assert len(connections) == 2 and ("unbind_s",) in calls


def test_a_second_loss_is_host_unavailable(fake_ldap):
    _, fail, connections = fake_ldap
    fail += [ldap.SERVER_DOWN({"desc": "Can't contact LDAP server"})] * 2
    with pytest.raises(HostUnavailable, match=r"ldap://ldap.test/ unavailable.*Can't contact"):
        _fake_directory().get_account("alice")
    assert len(connections) == 2


def test_refused_credentials_are_not_retried_and_not_shown(fake_ldap):
    _, fail, connections = fake_ldap
    fail.append(ldap.INVALID_CREDENTIALS({"desc": "Invalid credentials"}))
    with pytest.raises(HostUnavailable, match="as cn=a,dc=x refused") as e:
        _fake_directory(bind_password="hunter2").check()
    assert "hunter2" not in str(e.value) and len(connections) == 1


def test_filters_escape_values(fake_ldap):
    calls, _, _ = fake_ldap
    d = _fake_directory()
    d.get_account("alice")
    d.get_account_by_uid(1234)
    assert ("search_ext", "ou=people,dc=x", "(&(objectClass=posixAccount)(uid=alice))") in calls
    assert ("search_ext", "ou=people,dc=x", "(&(objectClass=posixAccount)(uidNumber=1234))") in calls


@pytest.mark.parametrize("call", [
    lambda d: d.create_account("Bad*name", home="/home/x"),
    lambda d: d.create_account("alice", home="relative"),
    lambda d: d.create_account("alice", home="/home/alice", uid=0),
    lambda d: d.get_account("a)(uid=*"),
    lambda d: d.get_account_by_uid("1"),
    lambda d: d.delete_account("x,ou=people"),
])
def test_bad_arguments_are_refused_before_connecting(fake_ldap, call):
    calls, _, _ = fake_ldap
    with pytest.raises(InvalidInput):
        call(_fake_directory())
    assert calls == []


# -- a real slapd ------------------------------------------------------------------------

integration = pytest.mark.integration


@integration
@pytest.mark.real_commands
def test_enable_two_accounts_and_delete_one(directory, ldap_tree):
    server, base = ldap_tree.server, ldap_tree.base_dn
    alice = directory.create_account("alice", home="/home/alice")
    bob = directory.create_account("bob", home="/home/bob")
    assert alice == PosixAccount("alice", UID_MIN, UID_MIN, "/home/alice", "/bin/bash")
    assert bob.uid == bob.gid == UID_MIN + 1

    people = ldapsearch(server, base, "(objectClass=posixAccount)", "uid", "uidNumber", "gidNumber",
                        "homeDirectory", "loginShell", "objectClass")
    entry = people[f"uid=alice,ou=people,{base}"]
    assert entry["uidNumber"] == entry["gidNumber"] == [str(UID_MIN)]
    assert entry["homeDirectory"] == ["/home/alice"] and entry["loginShell"] == ["/bin/bash"]
    assert {"account", "posixAccount", "shadowAccount"} <= set(entry["objectClass"])
    assert people[f"uid=bob,ou=people,{base}"]["uidNumber"] == [str(UID_MIN + 1)]
    groups = ldapsearch(server, base, "(objectClass=posixGroup)", "cn", "gidNumber")
    assert groups == {f"cn=alice,ou=groups,{base}": {"cn": ["alice"], "gidNumber": [str(UID_MIN)]},
                      f"cn=bob,ou=groups,{base}": {"cn": ["bob"], "gidNumber": [str(UID_MIN + 1)]}}

    directory.delete_account("bob")
    assert ldapsearch(server, base, "(|(uid=bob)(cn=bob))") == {}
    assert set(ldapsearch(server, base, "(cn=alice)")) == {f"uid=alice,ou=people,{base}",
                                                          f"cn=alice,ou=groups,{base}"}
    assert directory.get_account("bob") is None
    directory.delete_account("bob")  # already gone: fine


@integration
def test_get_account_and_by_uid(directory):
    alice = directory.create_account("alice", home="/home/alice")
    assert directory.get_account("alice") == alice
    assert directory.get_account_by_uid(alice.uid) == alice
    assert directory.get_account("nobody") is None
    assert directory.get_account_by_uid(UID_MIN + 50) is None


@integration
def test_given_uid_raises_the_mark_and_numbers_are_never_reused(directory):
    assert directory.create_account("carol", home="/h/carol", uid=UID_MIN + 1).uid == UID_MIN + 1
    assert directory.create_account("dave", home="/h/dave").uid == UID_MIN + 2
    assert directory.create_account("erin", home="/h/erin").uid == UID_MIN + 3
    directory.delete_account("dave")
    directory.delete_account("erin")
    # The lowest free number is UID_MIN and the highest used UID_MIN + 1: neither is handed out.
    assert directory.create_account("frank", home="/h/frank").uid == UID_MIN + 4
    # An admin may still give a free number below the mark (e.g. an old cluster account's).
    assert directory.create_account("gina", home="/h/gina", uid=UID_MIN).uid == UID_MIN
    assert directory.create_account("hank", home="/h/hank").uid == UID_MIN + 5


@integration
def test_numbers_used_as_gid_anywhere_below_base_are_skipped(directory, ldap_tree):
    add_group_by_hand(ldap_tree, "staff", UID_MIN)
    assert directory.create_account("alice", home="/home/alice").uid == UID_MIN + 1
    with pytest.raises(Conflict, match=f"uid {UID_MIN} is already used"):
        directory.create_account("bob", home="/home/bob", uid=UID_MIN)
    with pytest.raises(Conflict, match="staff is already taken"):
        directory.create_account("staff", home="/home/staff")
    assert directory.get_account("bob") is None


@integration
def test_duplicates_are_conflicts_and_leave_nothing(directory):
    alice = directory.create_account("alice", home="/home/alice")
    with pytest.raises(Conflict, match="alice"):
        directory.create_account("alice", home="/home/other")
    with pytest.raises(Conflict, match=f"uid {alice.uid}"):
        directory.create_account("bob", home="/home/bob", uid=alice.uid)
    assert directory.get_account("alice") == alice
    assert directory.get_account("bob") is None


@integration
@pytest.mark.real_commands
def test_exhausted_range_is_a_host_error(ldap_tree):
    d = make(ldap_tree.server, ldap_tree.base_dn, uid_min=UID_MIN, uid_max=UID_MIN + 1)
    d.create_account("alice", home="/home/alice")
    d.create_account("bob", home="/home/bob")
    with pytest.raises(HostError, match=f"no uidNumber left in the LDAP range {UID_MIN}-{UID_MIN + 1}"):
        d.create_account("carol", home="/home/carol")
    assert ldapsearch(ldap_tree.server, ldap_tree.base_dn, "(|(uid=carol)(cn=carol))") == {}
    d.delete_account("bob")  # its number is not free again
    with pytest.raises(HostError, match="never reused"):
        d.create_account("carol", home="/home/carol")


@integration
def test_a_failed_group_add_removes_the_account(directory, monkeypatch):
    real_add = directory._add

    def add(dn, entry):
        if dn.startswith("cn=alice,"):
            raise HostError("boom")
        real_add(dn, entry)

    monkeypatch.setattr(directory, "_add", add)
    with pytest.raises(HostError, match="boom"):
        directory.create_account("alice", home="/home/alice")
    monkeypatch.undo()
    assert directory.get_account("alice") is None
    # The number the failed create took stays spent: numbers only go up.
    assert directory.create_account("alice", home="/home/alice").uid == UID_MIN + 1


@integration
def test_delete_leaves_a_group_that_is_not_the_accounts(directory, ldap_tree):
    dn = add_group_by_hand(ldap_tree, "alice", 500)
    directory.delete_account("alice")
    assert _entry(ldap_tree.server, dn) is not None


@integration
def test_a_number_another_tool_took_after_the_mark_is_skipped(directory, ldap_tree, caplog):
    caplog.set_level("INFO", logger="host_adapters.accounts.ldap_directory")
    assert directory.create_account("alice", home="/home/alice").uid == UID_MIN
    add_group_by_hand(ldap_tree, "handmade", UID_MIN + 1)
    assert directory.create_account("bob", home="/home/bob").uid == UID_MIN + 2
    assert f"uidNumber {UID_MIN + 1} is held by an entry made without the mark; bob takes the next one" in caplog.text


@integration
def test_a_creator_whose_add_lost_to_an_earlier_writer_yields(ldap_tree, monkeypatch, caplog):
    caplog.set_level("INFO", logger="host_adapters.accounts.ldap_directory")
    first = make(ldap_tree.server, ldap_tree.base_dn)
    second = make(ldap_tree.server, ldap_tree.base_dn)
    assert first.create_account("alice", home="/home/alice").uid == UID_MIN
    # As if the second creator had checked for holders just before alice's entry appeared.
    real_holders = second._holders
    calls = []

    def holders(n):
        calls.append(n)
        return [] if len(calls) == 1 else real_holders(n)

    monkeypatch.setattr(second, "_holders", holders)
    monkeypatch.setattr(second, "_take_next_number", iter([UID_MIN, UID_MIN + 5]).__next__)
    assert second.create_account("bob", home="/home/bob").uid == UID_MIN + 5
    assert first.get_account("alice").uid == UID_MIN
    assert f"uidNumber {UID_MIN} was taken concurrently; bob tries the next one" in caplog.text


@integration
def test_concurrent_creators_get_distinct_numbers(ldap_tree):
    directories = [make(ldap_tree.server, ldap_tree.base_dn) for _ in range(4)]
    made, errors = [], []

    def create(d, names):
        try:
            made.extend(d.create_account(n, home=f"/home/{n}") for n in names)
        except Exception as e:  # collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(d, [f"u{i}x{k}" for k in range(4)]))
               for i, d in enumerate(directories)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(a.uid for a in made) == list(range(UID_MIN, UID_MIN + 16))


@integration
@pytest.mark.real_commands
def test_lock_sets_shadow_expire_and_unlock_removes_only_its_own(directory, ldap_tree):
    server, base = ldap_tree.server, ldap_tree.base_dn
    directory.create_account("alice", home="/home/alice")
    directory.lock_account("alice")
    people = ldapsearch(server, base, "(uid=alice)", "shadowExpire")
    assert people[f"uid=alice,ou=people,{base}"] == {"shadowExpire": ["1"]}
    directory.unlock_account("alice")
    assert ldapsearch(server, base, "(uid=alice)", "shadowExpire")[f"uid=alice,ou=people,{base}"] == {}
    # An expiry an admin set is not the controller's lock: unlock leaves it.
    conn = as_admin(server)
    conn.modify_s(f"uid=alice,ou=people,{base}", [(ldap.MOD_REPLACE, "shadowExpire", [b"25000"])])
    conn.unbind_s()
    assert directory.get_account("alice").locked is False
    directory.unlock_account("alice")
    assert ldapsearch(server, base, "(uid=alice)", "shadowExpire")[f"uid=alice,ou=people,{base}"] == {
        "shadowExpire": ["25000"]}
    directory.lock_account("alice")
    assert directory.get_account("alice").locked is True


@integration
@pytest.mark.real_commands
def test_the_uid_mark_entry(directory, ldap_tree):
    server, base = ldap_tree.server, ldap_tree.base_dn
    directory.create_account("alice", home="/home/alice")
    directory.create_account("bob", home="/home/bob")
    directory.delete_account("bob")
    mark = ldapsearch(server, base, "(cn=cloud-controller-uid-mark)", "uidNumber", "objectClass")
    assert mark == {f"cn=cloud-controller-uid-mark,{base}": {
        "uidNumber": [str(UID_MIN + 1)], "objectClass": ["top", "applicationProcess", "extensibleObject"]}}
    # Not an account: NSS looks for posixAccount entries.
    assert directory.get_account_by_uid(UID_MIN + 1) is None


@integration
def test_the_mark_starts_above_every_number_in_use(directory, ldap_tree):
    """A directory that had accounts before the mark existed: their numbers and the gaps
    between them are never handed out."""
    for name, number in (("old1", UID_MIN + 3), ("old2", UID_MIN + 7), ("outside", UID_MIN + 500)):
        add_group_by_hand(ldap_tree, name, number)
    assert directory.create_account("alice", home="/home/alice").uid == UID_MIN + 8


@integration
def test_check_and_a_missing_ou(ldap_tree):
    make(ldap_tree.server, ldap_tree.base_dn).check()
    with pytest.raises(HostUnavailable, match=f"ou=nowhere,{ldap_tree.base_dn} does not exist"):
        make(ldap_tree.server, ldap_tree.base_dn, groups_ou="ou=nowhere").check()


@integration
def test_a_dropped_connection_is_retried_once(directory, caplog):
    alice = directory.create_account("alice", home="/home/alice")
    old = directory._conn
    # Break the TCP connection under python-ldap, as a server-side close would.
    with socket.socket(fileno=os.dup(old.get_option(ldap.OPT_DESC))) as sock:
        sock.shutdown(socket.SHUT_RDWR)
    assert directory.get_account("alice") == alice
    assert directory._conn is not old
    assert "lost during search" in caplog.text and "reconnecting once" in caplog.text


@integration
def test_a_restarted_server_is_reconnected_and_a_stopped_one_is_unavailable(private_slapd):
    server = private_slapd.server
    d = make(server, timeout=2)
    d.check()
    private_slapd.stop()
    private_slapd.start()
    alice = d.create_account("alice", home="/home/alice")
    assert d.get_account("alice") == alice
    private_slapd.stop()
    for call in (d.check, lambda: d.get_account("alice"), lambda: d.create_account("bob", home="/home/bob")):
        with pytest.raises(HostUnavailable, match=f"{server.uri}"):
            call()


@integration
def test_a_hung_server_times_out_as_unavailable(private_slapd):
    d = make(private_slapd.server, timeout=0.5)
    d.check()
    os.kill(private_slapd.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(HostUnavailable, match="unavailable during search"):
            d.get_account("alice")
        assert time.monotonic() - started < 5
    finally:
        os.kill(private_slapd.proc.pid, signal.SIGCONT)
    assert d.get_account("alice") is None


@integration
def test_searches_read_every_page(directory, ldap_tree, monkeypatch, caplog):
    caplog.set_level("INFO", logger="host_adapters.accounts.ldap_directory")
    monkeypatch.setattr(ldap_directory, "_PAGE_SIZE", 2)
    for name in ("a1", "a2", "a3", "a4", "a5"):
        directory.create_account(name, home=f"/home/{name}")
    assert len(directory._search(ldap_tree.base_dn, ldap.SCOPE_SUBTREE, "(gidNumber=*)", ["1.1"])) == 10
    assert directory.create_account("a6", home="/home/a6").uid == UID_MIN + 5
    assert "taken concurrently" not in caplog.text


@integration
def test_nothing_listening_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        d = LdapDirectory(uri=f"ldap://127.0.0.1:{port}/", base_dn="dc=x", bind_dn="cn=a,dc=x",
                          bind_password="pw", timeout=2)
        with pytest.raises(HostUnavailable, match="Can't contact LDAP server"):
            d.check()


@integration
def test_a_wrong_password_is_unavailable(slapd):
    with pytest.raises(HostUnavailable, match="refused: Invalid credentials") as e:
        make(slapd, bind_password="wrong-pw").check()
    assert "wrong-pw" not in str(e.value)


@integration
def test_starttls_verifies_the_server_with_the_ca_file(slapd):
    if not slapd.ca_file:
        pytest.skip("CC_TEST_LDAP_CA_FILE is not set for this server")
    make(slapd, starttls=True, tls_ca_file=slapd.ca_file).check()
    with pytest.raises(HostUnavailable, match="TLS failed: check tls_ca_file"):
        make(slapd, starttls=True, tls_ca_file="/etc/ssl/certs/ca-certificates.crt").check()


# -- the contract every Directory keeps (shared with FakeDirectory and LocalDirectory) --


def _entry(server, dn: str) -> dict[str, list[bytes]] | None:
    conn = ldap.initialize(server.uri)
    try:
        conn.simple_bind_s(server.bind_dn, server.password)
        [(_, attrs)] = conn.search_s(dn, ldap.SCOPE_BASE)
        return attrs
    except ldap.NO_SUCH_OBJECT:
        return None
    finally:
        conn.unbind_s()


@integration
class TestLdapDirectory(DirectoryContract):
    @pytest.fixture
    def directory(self, ldap_tree):
        # The contract expects allocation to start at 10000.
        d = make(ldap_tree.server, ldap_tree.base_dn, uid_min=10000, uid_max=60000)
        yield d
        d._drop()

    @pytest.fixture
    def host_account(self, ldap_tree):
        def read(name):
            attrs = _entry(ldap_tree.server, f"uid={name},ou=people,{ldap_tree.base_dn}")
            if attrs is None:
                return None
            value = {k: v[0].decode() for k, v in attrs.items()}
            return (int(value["uidNumber"]), int(value["gidNumber"]),
                    value["homeDirectory"], value["loginShell"])

        return read

    @pytest.fixture
    def host_group(self, ldap_tree):
        def read(name):
            attrs = _entry(ldap_tree.server, f"cn={name},ou=groups,{ldap_tree.base_dn}")
            return None if attrs is None else [m.decode() for m in attrs.get("memberUid", [])]

        return read

    @pytest.fixture
    def add_group(self, ldap_tree):
        gids = iter(range(5000, 6000))

        def add(name, members):
            add_group_by_hand(ldap_tree, name, next(gids), members)

        return add

    @pytest.fixture
    def add_member(self, ldap_tree):
        def add(group, user):
            conn = as_admin(ldap_tree.server)
            conn.modify_s(f"cn={group},ou=groups,{ldap_tree.base_dn}",
                          [(ldap.MOD_ADD, "memberUid", [user.encode()])])
            conn.unbind_s()

        return add

    @pytest.fixture
    def no_commands(self, directory, monkeypatch):
        def refuse(*args, **kwargs):
            raise AssertionError("the directory was contacted")

        monkeypatch.setattr(directory, "_call", refuse)
