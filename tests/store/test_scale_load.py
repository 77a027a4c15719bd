"""Loading a sandbox at scale (agent/sandbox_load.py) and what keeps reads cheap there.

The bulk writers of a scratch system root are checked with the real shadow tools
(grpck, pwck, useradd, groupadd, gpasswd, groupdel read what they wrote); a small
load of a real sandbox is checked invariant by invariant, by `cloud-agent
reconcile`, and by a real `cloud-agent serve` that must rebuild every domain.
"""

import json
import os
import sqlite3
import stat
import subprocess
import time
import urllib.request
from collections import Counter
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from controller.errors import Conflict, HostError
from host_adapters.accounts import local_directory, local_groups, sysroot
from host_adapters.accounts.local_directory import LocalDirectory
from host_adapters.accounts.sysroot import make_sysroot
from host_adapters.accounts.local_groups import CommandUnixGroups
from host_adapters.libvirt.volume_io import InProcessVolumeIO
from tests.api.test_controller_api import boot, ok, people  # noqa: F401 (people: a fixture)
from tests.fixtures.agent import agent_ok
from tests.fixtures.api import give_volume
from tests.fixtures.server import free_port, start_server



# -- bulk writers of a scratch system root ----------------------------------------------
@pytest.fixture
def root(tmp_path):
    return make_sysroot(tmp_path / "sysroot")


def _tool(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@pytest.mark.real_commands
def test_bulk_accounts_and_groups_are_what_the_shadow_tools_read(root):
    directory = LocalDirectory(root)
    groups = CommandUnixGroups(root, gid_range=(70000, 79999))
    made = local_directory.create_accounts(directory, [(f"bulk{i}", f"/srv/home/bulk{i}") for i in range(20)])
    assert [a.uid for a in made] == list(range(10000, 10020)) and all(a.gid == a.uid for a in made)
    gids = local_groups.create_many(groups, [("team1", ["bulk1", "bulk2"]), ("team2", [])])
    assert gids == {"team1": 70000, "team2": 70001}

    # grpck finds nothing wrong; pwck only the homes and shell a scratch root lacks.
    assert _tool("grpck", "-r", "-R", root).returncode == 0
    complaints = [l for l in _tool("pwck", "-r", "-R", root).stdout.splitlines() if l != "pwck: no changes"]
    assert complaints and all(l.endswith(("does not exist", "does not exist ")) for l in complaints), complaints
    # The tools see the bulk entries: names are taken, the next uid and gid come after them.
    assert _tool("useradd", "-R", root, "-U", "-M", "bulk3").returncode == 9
    assert _tool("groupadd", "-R", root, "team1").returncode == 9
    alice = directory.create_account("alice", home="/srv/home/alice")
    assert alice.uid == 10020
    assert _tool("gpasswd", "-Q", root, "-a", "alice", "team2").returncode == 0
    assert groups.get("team2") == ["alice"] and groups.gid("team1") == 70000
    assert directory.get_account("bulk7").uid == 10007 and not directory.get_account("bulk7").locked
    directory.lock_account("bulk7")  # usermod on a bulk entry
    assert directory.get_account("bulk7").locked
    assert _tool("groupdel", "-R", root, "team1").returncode == 0
    assert groups.get("team1") is None
    assert directory.uid_mark.read() == 10020


def test_a_bulk_write_that_clashes_changes_nothing(root):
    directory = LocalDirectory(root)
    local_directory.create_accounts(directory, [("taken", "/srv/home/taken")])
    before = {n: Path(root, "etc", n).read_text() for n in ("passwd", "group", "shadow", "gshadow")}
    with pytest.raises(Conflict):
        local_directory.create_accounts(directory, [("fresh", "/srv/home/fresh"), ("taken", "/srv/home/x")])
    with pytest.raises(Conflict):
        local_groups.create_many(CommandUnixGroups(root), [("newgroup", []), ("taken", [])])
    assert {n: Path(root, "etc", n).read_text() for n in before} == before
    assert directory.uid_mark.read() == 10000


def test_bulk_writes_refuse_the_host_itself():
    with pytest.raises(HostError, match="scratch system root"):
        local_directory.create_accounts(LocalDirectory(None), [("someone", "/home/someone")])
    with pytest.raises(HostError, match="scratch system root"):
        local_groups.create_many(CommandUnixGroups(None), [("somegroup", [])])


def test_parsed_account_files_follow_every_replacement(root):
    directory = LocalDirectory(root)
    assert directory.get_account("late") is None
    local_directory.create_accounts(directory, [("late", "/srv/home/late")])
    assert directory.get_account("late").uid == 10000
    passwd = Path(root, "etc", "passwd")
    # Rewritten in place, same size: a new mtime is enough to be read again.
    text = passwd.read_text().replace(":10000:10000:", ":10001:10000:")
    time.sleep(0.01)
    passwd.write_text(text)
    assert directory.get_account("late").uid == 10001


def test_indexed_account_files_keep_one_string_per_line(root):
    local_directory.create_accounts(LocalDirectory(root), [(f"u{i}", f"/srv/home/u{i}") for i in range(50)])
    assert sysroot.find_user(root, "u7").home == "/srv/home/u7"
    _, rows, by_name = sysroot._indexed[sysroot.etc_file(root, "passwd")]
    # Split into fields only when asked for: 10,000 accounts split were 12 MB of the server.
    assert all(isinstance(number, int) and isinstance(line, str) for number, line in rows)
    assert by_name["u7"][1].startswith("u7:") and len(by_name) == len(rows)
    # A line with a field too many or too few is still refused for every read.
    passwd = Path(root, "etc", "passwd")
    passwd.write_text(passwd.read_text() + "broken:x:1:1::/home/broken\n")
    with pytest.raises(HostError, match="malformed line"):
        sysroot.find_user(root, "u7")


def test_in_process_volume_contents_keep_their_padding():
    io = InProcessVolumeIO()

    class Vol:
        def path(self):
            return "/pool/seed"

    io.write(None, Vol(), b"seed", pad_to=4096)
    data = io.read(None, Vol(), limit=4096)
    assert len(data) == 4096 and data.startswith(b"seed") and not data[4:].strip(b"\0")
    assert io.read_head(None, Vol(), 2) == b"se"


def test_in_process_volume_contents_are_kept_outside_the_heap_and_rewritten_in_place():
    io = InProcessVolumeIO()

    class Vol:
        def __init__(self, path):
            self._path = path

        def path(self):
            return self._path

    a, b = Vol("/pool/a"), Vol("/pool/b")
    first = os.urandom(3000)  # does not compress: the longest content of this test
    io.write(None, a, first, pad_to=8192)
    io.write(None, b, b"b" * 100)
    # In the file, not in memory: only places are kept.
    assert os.fstat(io._file.fileno()).st_size >= len(first) and all(
        isinstance(v, tuple) and all(isinstance(x, int) for x in v) for v in io._where.values())
    size = os.fstat(io._file.fileno()).st_size
    io.write(None, a, b"shorter")  # fits where the first content was: the file does not grow
    assert os.fstat(io._file.fileno()).st_size == size
    assert io.read(None, a, limit=100) == b"shorter" and io.read(None, b, limit=100) == b"b" * 100
    assert io.read(None, Vol("/pool/never"), limit=100) == b""


# -- the streamed list envelope ---------------------------------------------------------------
def _encoded_chunks(count: int, per_chunk: int = 200, closed: list | None = None):
    """What store.iter_instance_json yields: objects joined by commas, per_chunk at a time."""
    try:
        for start in range(0, count, per_chunk):
            yield ",".join(json.dumps({"id": str(i)}) for i in range(start, min(count, start + per_chunk)))
    finally:
        if closed is not None:
            closed.append(True)


@pytest.mark.parametrize("count", [0, 1, 200, 201, 450])
def test_short_lists_are_sent_whole_and_long_ones_streamed(count):
    import falcon

    from api.envelopes import stream_controller

    closed = []
    resp = falcon.Response()
    stream_controller(resp, _encoded_chunks(count, closed=closed))
    if count <= 200:
        assert resp.stream is None and closed == [True]  # read to the end
        body = resp.data
    else:
        assert resp.data is None and closed == []
        first = next(resp.stream)
        resp.stream.close()  # the client went away: the source is closed too
        assert closed == [True]
        resp = falcon.Response()
        stream_controller(resp, _encoded_chunks(count))
        chunks = list(resp.stream)
        assert len(chunks) == 1 + -(-count // 200)  # a piece per chunk, then the envelope's end
        body = b"".join(chunks)
    assert json.loads(body) == {"data": [{"id": str(i)} for i in range(count)], "msg": "", "success": True}
    if count > 200:
        assert first.startswith(b'{"data": [')


# -- hypervisor calls per request (fake) -------------------------------------------------------
def test_a_list_makes_one_hypervisor_call_whatever_its_length(client, cctx, adapters, people, catalog):
    owner, managed, admin, hv = people["owner"], people["managed"], people["admin"], adapters.hypervisor
    before = hv.host_calls
    assert ok(client.simulate_get("/v1/server-instance", headers=admin.headers)) == []
    assert hv.host_calls == before  # an empty list asks the host nothing
    give_volume(client, owner)
    give_volume(client, managed)
    for caller, count in ((owner, 7), (managed, 5)):
        for _ in range(count):
            ok(boot(client, caller, catalog), 201)
    for caller, rows in ((admin, 12), (owner, 12), (managed, 5), (people["stranger"], 0)):
        before = hv.host_calls
        assert len(ok(client.simulate_get("/v1/server-instance", headers=caller.headers))) == rows
        assert hv.host_calls - before == (1 if rows else 0), hv.calls
    one = ok(client.simulate_get("/v1/server-instance", headers=managed.headers))[0]["id"]
    before = hv.host_calls
    ok(client.simulate_get(f"/v1/server-instance/{one}", headers=owner.headers))
    assert hv.host_calls - before == 1


# -- lists encoded by SQLite (store.iter_instance_json) -------------------------------------------
def _five_instances(client, cctx, people, catalog):
    owner, managed = people["owner"], people["managed"]
    give_volume(client, owner)
    ids = [ok(boot(client, owner, catalog), 201)[0]["id"] for _ in range(5)]
    a, b = people["accounts"]["owner"]["uuid"], people["accounts"]["managed"]["uuid"]
    # Users in grant order, not sorted; address fields unset, empty or set; one creation
    # second for all (the order falls to the id, across chunk boundaries).
    cctx.store.set_instance_users(ids[0], sorted([a, b], reverse=True))
    cctx.store.set_instance_users(ids[1], [])
    with cctx.store.write() as conn:
        conn.execute("UPDATE instances SET creation_date = '2026-11-23T10:00:00Z'")
        conn.execute("UPDATE instances SET hostname = NULL, public_ip = '203.0.113.7' WHERE id = ?", (ids[2],))
        conn.execute("UPDATE instances SET private_ip = '' WHERE id = ?", (ids[3],))
    return ids


def instance_object(row: dict) -> dict:
    """The spec's server-instance object (section 2.1) of a store row, built field by field:
    what SQLite's encoding must equal."""
    obj = {
        "id": row["id"],
        "cloudauth-id": row["owner_id"],
        "users": list(row["users"]),
        "server-image": row["image_id"],
        "server-flavor": str(row["flavor_id"]),
        "creation-date": row["creation_date"],
        "status": row["status"],
        "expires-at": row["expires_at"],
        "lease": "none" if row["expires_at"] is None else "active",
    }
    for field, column in (("hostname", "hostname"), ("public-ip", "public_ip"), ("private-ip", "private_ip")):
        if row.get(column):
            obj[field] = row[column]
    return obj


def test_encoded_lists_are_the_instance_objects_in_creation_order(client, cctx, people, catalog):
    ids = _five_instances(client, cctx, people, catalog)
    listed = ok(client.simulate_get("/v1/server-instance", headers=people["admin"].headers))
    expected = [instance_object(r) for r in cctx.store.list_instances(visible_to=None)]
    assert listed == expected and len(listed) == 5
    assert [o["id"] for o in listed] == sorted(ids)
    by_id = {o["id"]: o for o in listed}
    assert {"hostname", "private-ip"} <= set(by_id[ids[4]]) and "public-ip" not in by_id[ids[4]]
    assert "hostname" not in by_id[ids[2]] and by_id[ids[2]]["public-ip"] == "203.0.113.7"
    assert "private-ip" not in by_id[ids[3]] and by_id[ids[1]]["users"] == []
    assert by_id[ids[0]]["users"] == sorted(by_id[ids[0]]["users"], reverse=True) and len(by_id[ids[0]]["users"]) == 2
    for per_chunk in (1, 2, 4, 5, 6):
        chunks = list(cctx.store.iter_instance_json(visible_to=None, per_chunk=per_chunk))
        assert len(chunks) == -(-5 // per_chunk)
        assert json.loads("[" + ",".join(chunks) + "]") == expected
    # Each object is what GET of that instance answers.
    for obj in listed:
        assert ok(client.simulate_get(f"/v1/server-instance/{obj['id']}", headers=people["owner"].headers)) == [obj]


def test_a_list_holds_nothing_between_chunks_and_lists_no_row_twice(client, cctx, people, catalog):
    ids = sorted(_five_instances(client, cctx, people, catalog))
    chunks = cctx.store.iter_instance_json(visible_to=None, per_chunk=2)
    first = json.loads("[" + next(chunks) + "]")
    assert [o["id"] for o in first] == ids[:2]
    # No transaction or cursor is left open in this thread: another connection deletes a
    # row of a later chunk and this thread writes, both at once.
    assert not cctx.store.conn.in_transaction
    other = sqlite3.connect(cctx.store.path, timeout=0)
    with other:
        other.execute("DELETE FROM instance_users WHERE instance_id = ?", (ids[3],))
        other.execute("DELETE FROM instances WHERE id = ?", (ids[3],))
    other.close()
    cctx.store.set_instance_status(ids[0], "paused")
    rest = json.loads("[" + ",".join(chunks) + "]")
    assert [o["id"] for o in rest] == [ids[2], ids[4]]  # the deleted one is gone, none twice
    assert not cctx.store.conn.in_transaction


def test_a_list_writes_what_the_host_says_and_checks_the_whole_view_again(client, cctx, adapters, people, catalog,
                                                                          monkeypatch):
    from controller.hosts import status_sync

    ids = _five_instances(client, cctx, people, catalog)
    hv, admin = adapters.hypervisor, people["admin"].headers

    def stored(instance_id):
        return cctx.store.list_instances(visible_to=None, instance_id=instance_id)[0]["status"]

    hv.instances[ids[1]].status = "shutoff"  # changed on the host
    listed = {o["id"]: o["status"] for o in ok(client.simulate_get("/v1/server-instance", headers=admin))}
    assert listed[ids[1]] == "shutoff" and stored(ids[1]) == "shutoff"
    del hv.instances[ids[2]]  # the host lost it
    listed = {o["id"]: o["status"] for o in ok(client.simulate_get("/v1/server-instance", headers=admin))}
    assert listed[ids[2]] == "error" and stored(ids[2]) == "error"

    # A host that tells only what changed since the last mark: nothing is read again...
    asked = []

    def changes_only(since):
        asked.append(since)
        return ("mark", {}, False) if since == "mark" else ("mark", hv.statuses(), True)

    monkeypatch.setattr(hv, "status_changes", changes_only)
    ok(client.simulate_get("/v1/server-instance", headers=admin))
    cctx.store.set_instance_status(ids[0], "paused")  # written by another process, from an older view
    assert {o["id"]: o["status"] for o in ok(client.simulate_get("/v1/server-instance", headers=admin))}[ids[0]] \
        == "paused"
    assert asked[-1] == "mark"
    # ... until the whole view is compared again, which corrects it.
    monkeypatch.setattr(status_sync, "WHOLE_CHECK_SECONDS", -1)
    assert {o["id"]: o["status"] for o in ok(client.simulate_get("/v1/server-instance", headers=admin))}[ids[0]] \
        == "running"
    assert asked[-1] is None and stored(ids[0]) == "running"


def test_listed_users_follow_grants_revocations_and_deleted_accounts(client, cctx, people, catalog):
    ids = _five_instances(client, cctx, people, catalog)
    a, b = people["accounts"]["owner"]["uuid"], people["accounts"]["managed"]["uuid"]

    def listed():
        objs = ok(client.simulate_get("/v1/server-instance", headers=people["admin"].headers))
        return {o["id"]: o["users"] for o in objs}

    assert listed()[ids[0]] == [b, a] if b > a else [a, b]
    ok(client.simulate_put(f"/v1/server-instance/{ids[1]}", headers=people["owner"].headers,
                           json={"task": {"what": "modify-users", "how": "add", "users": [b]}}))
    assert listed()[ids[1]] == [a, b]  # the owner's account stays first
    with cctx.store.write() as conn:
        conn.execute("DELETE FROM instance_users WHERE account_uuid = ? AND instance_id = ?", (b, ids[0]))
        conn.execute("UPDATE instance_users SET instance_id = ? WHERE instance_id = ? AND account_uuid = ?",
                     (ids[3], ids[1], b))
    users = listed()
    assert users[ids[0]] == [a] and users[ids[1]] == [a] and users[ids[3]] == [a, b]
    with cctx.store.write() as conn:  # an account deleted: ON DELETE CASCADE takes it off every instance
        conn.execute("DELETE FROM system_accounts WHERE uuid = ?", (b,))
    users = listed()
    assert users[ids[3]] == [a] and all(b not in u for u in users.values())
    assert users == {i: cctx.store.instance_users([i]).get(i, []) for i in ids}


def test_migration_fills_the_listed_users_of_existing_instances(client, cctx, people, catalog):
    from controller.store import migrations

    ids = _five_instances(client, cctx, people, catalog)
    before = {i: cctx.store.instance_users([i]).get(i, []) for i in ids}
    conn = cctx.store.conn
    # The database as version 9 left it: no column, no triggers.
    for trigger in ("instance_user_added", "instance_user_removed", "instance_user_changed"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP INDEX instances_live_host")
    conn.execute("ALTER TABLE instances DROP COLUMN users_json")
    conn.execute("ALTER TABLE volumes DROP COLUMN uid")  # migration 11's
    conn.execute("DROP TABLE evacuations")  # migration 12's
    conn.execute("ALTER TABLE instances DROP COLUMN console_since")  # migration 13's
    conn.execute("DROP TABLE reconcile_runs")  # migration 14's
    conn.execute("DROP TABLE reconcile_drift")
    conn.execute("DROP TABLE instance_actions")  # migration 15's
    conn.execute("ALTER TABLE audit DROP COLUMN request_id")
    conn.execute("DROP TABLE moves")  # migration 16's (host drain)
    conn.execute("DROP TABLE instance_claims")  # _M_INSTANCE_CLAIMS (one claim per instance)
    for index in ("hosts_host_uuid", "hosts_pool_uuid"):  # _M_HOST_IDENTITY's
        conn.execute(f"DROP INDEX {index}")
    conn.execute("ALTER TABLE hosts DROP COLUMN host_uuid")
    conn.execute("ALTER TABLE hosts DROP COLUMN pool_uuid")
    conn.execute("DROP TABLE portal_sessions")  # _M_PORTAL_SESSIONS (the cloud portal)
    for trigger in [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                               "AND name LIKE 'auth_changes_%'")]:
        conn.execute(f"DROP TRIGGER {trigger}")  # _M_CLOUD_AUTH's (one cloud auth, several clusters)
    for table in ("registered_accounts", "controllers", "auth_changes", "auth_epoch", "cloud_auth_follow",
                  "cloud_auth_accounts"):  # and _M_CLOUD_AUTH_REGISTRY's
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DROP TABLE lease_events")  # _M_LEASES's (instance leases)
    conn.execute("DROP INDEX instances_expires")
    conn.execute("ALTER TABLE instances DROP COLUMN expires_at")
    conn.execute("ALTER TABLE flavors DROP COLUMN lease_default_seconds")
    conn.execute("ALTER TABLE flavors DROP COLUMN lease_max_seconds")
    conn.execute("PRAGMA user_version = 9")
    assert cctx.store.migrate() == (9, migrations.SCHEMA_VERSION)
    listed = ok(client.simulate_get("/v1/server-instance", headers=people["admin"].headers))
    assert {o["id"]: o["users"] for o in listed} == before and any(len(u) == 2 for u in before.values())


# -- the libvirt adapter: status snapshot and batched reservations (test driver) -------------------
def _guest(hv, index):
    from host_adapters.guests.guest import GuestSpec, Nic

    mac = "52:54:00:aa:%02x:%02x" % (index >> 8, index & 255)
    return GuestSpec(hostname=f"batch{index}", users=(), groups=(),
                     nics=(Nic(mac=mac, address=f"10.213.9.{index + 2}", prefix=16, gateway="10.213.0.1",
                               network=hv.network),))


def test_statuses_snapshot_follows_the_adapters_own_changes(libvirt_test_driver):
    import libvirt

    from tests.fixtures.libvirtd import TEST_URI

    hv = libvirt_test_driver
    hv._no_events = True  # a driver without lifecycle events: statuses are read as snapshots
    hv._status_max_age = 60
    base = hv.create_base_image("snapimg", size_gb=1)
    a, b = "0a000000-0000-4000-8000-00000000000a", "0b000000-0000-4000-8000-00000000000b"
    for i, iid in enumerate((a, b)):
        hv.spawn(iid, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, i))
    assert hv.statuses()[a] == "running"
    # Changed behind the adapter's back: the snapshot answers until it is too old...
    libvirt.open(TEST_URI).lookupByName(hv._names.domain(a)).destroy()
    assert hv.statuses()[a] == "running"
    # ...or until the adapter changes a domain itself.
    hv.power_off(b)
    assert hv.statuses() == {**hv.statuses(), a: "shutoff", b: "shutoff"}
    hv._status_max_age = 0
    assert hv.statuses()[a] == "shutoff"


def test_statuses_are_kept_current_by_lifecycle_events(libvirt_test_driver, monkeypatch):
    import time

    import libvirt

    from tests.fixtures.libvirtd import TEST_URI

    hv = libvirt_test_driver
    base = hv.create_base_image("eventimg", size_gb=1)
    a, b = "0d000000-0000-4000-8000-00000000000a", "0d000000-0000-4000-8000-00000000000b"
    for i, iid in enumerate((a, b)):
        hv.spawn(iid, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, i))
    assert hv.statuses()[a] == "running"
    mark, whole_view, whole = hv.status_changes(None)
    assert whole and whole_view == hv.statuses()
    # The spawns' own lifecycle events may still be on their way on a loaded machine (each is
    # journalled when it lands): the mark is taken once none has come for a second.
    quiet, deadline = time.monotonic() + 1, time.monotonic() + 15
    while time.monotonic() < min(quiet, deadline):
        mark, late, _ = hv.status_changes(mark)
        if late:
            quiet = time.monotonic() + 1
        time.sleep(0.05)
    # From here on no list reads every domain again: the events keep the statuses.
    reads = []
    monkeypatch.setattr(hv, "_read_statuses", lambda: reads.append(1) or {})
    assert hv.status_changes(mark)[1:] == ({}, False)
    # Changed behind the adapter's back (another connection): the event brings it.
    other = libvirt.open(TEST_URI)
    other.lookupByName(hv._names.domain(a)).destroy()
    deadline = time.monotonic() + 5
    while hv.statuses().get(a) != "shutoff" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hv.statuses()[a] == "shutoff" and hv.status(a) == "shutoff"
    mark, changes, whole = hv.status_changes(mark)
    assert changes == {a: "shutoff"} and not whole  # only what changed since the mark
    other.lookupByName(hv._names.domain(a)).create()
    other.lookupByName(hv._names.domain(a)).suspend()
    while hv.statuses().get(a) != "paused" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hv.statuses()[a] == "paused"
    # The adapter's own changes show at once, before their events arrive.
    hv.power_off(b)
    assert hv.statuses()[b] == "shutoff" and hv.status(b) == "shutoff"
    hv.destroy(b)
    assert b not in hv.statuses() and hv.status(b) == "error"
    assert hv.status_changes(mark)[1:] == ({a: "paused", b: None}, False)  # None: no domain
    assert reads == []


def test_a_mark_older_than_the_remembered_changes_gets_the_whole_view():
    from host_adapters.names import Names
    from host_adapters.libvirt.statuses import _LiveStatuses

    live = _LiveStatuses(conn=None, names=Names("cc-"))
    ids = [f"0f000000-0000-4000-8000-{i:012d}" for i in range(3)]
    live.start({ids[0]: "running"})
    first, view, whole = live.changes(None)
    assert whole and view == {ids[0]: "running"}
    live.set(ids[1], "shutoff")
    mark, changes, whole = live.changes(first)
    assert changes == {ids[1]: "shutoff"} and not whole
    for i in range(live.JOURNAL_MAX + 1):
        live.set(ids[2], "running" if i % 2 else "paused")
    assert live.changes(mark) == ((live, mark[1] + live.JOURNAL_MAX + 1), live.copy(), True)
    other = _LiveStatuses(conn=None, names=Names("cc-"))
    other.start({})
    assert live.changes(other.changes(None)[0])[2]  # another connection's mark


def test_events_before_the_first_read_are_applied_after_it_in_order():
    import libvirt

    from host_adapters.names import Names
    from host_adapters.libvirt.statuses import _LiveStatuses

    names = Names("cc-")
    live = _LiveStatuses(conn=None, names=names)
    iid, gone = "0e000000-0000-4000-8000-00000000000a", "0e000000-0000-4000-8000-00000000000b"
    live.event(names.domain(iid), libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED)
    live.event(names.domain(iid), libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED)
    live.event(names.domain(gone), libvirt.VIR_DOMAIN_EVENT_UNDEFINED, 0)
    live.event("someone-elses-domain", libvirt.VIR_DOMAIN_EVENT_STOPPED, 0)
    live.start({iid: "running", gone: "shutoff"})  # the read saw the restart; the undefine came after it
    assert live.copy() == {iid: "running"}
    live.event(names.domain(iid), libvirt.VIR_DOMAIN_EVENT_DEFINED, 0)  # a new definition keeps it running
    assert live.get(iid) == "running"
    live.event(names.domain(iid), libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_CRASHED)
    assert live.get(iid) == "crashed" and live.get(gone) == "error"


def test_our_own_change_is_not_undone_by_an_older_event_that_arrives_late():
    """A loaded host delivers events late: the STARTED of an earlier power-on after our
    power-off's own update, the DEFINED of a create after our destroy. They must not show
    an old status (or a destroyed instance) until the later events catch up."""
    import libvirt

    from host_adapters.names import Names
    from host_adapters.libvirt.statuses import _LiveStatuses

    names = Names("cc-")
    clock = [100.0]
    live = _LiveStatuses(conn=None, names=names)
    live.clock = lambda: clock[0]
    a, b = "0d000000-0000-4000-8000-00000000000a", "0d000000-0000-4000-8000-00000000000b"
    live.start({a: "running"})
    ev = lambda iid, e, d=0: live.event(names.domain(iid), e, d)  # noqa: E731
    live.set(a, "shutoff")  # our power-off, read from the domain
    ev(a, libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED)  # an older one, late
    assert live.get(a) == "shutoff" and live.copy()[a] == "shutoff"
    ev(a, libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED)  # its own: the pin ends
    ev(a, libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED)  # a new change, shown
    assert live.get(a) == "running"
    live.set(b, "running")  # our create
    live.set(b, None)  # and our destroy
    ev(b, libvirt.VIR_DOMAIN_EVENT_DEFINED)  # the create's events, late
    ev(b, libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED)
    assert b not in live.copy()
    ev(b, libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED)
    ev(b, libvirt.VIR_DOMAIN_EVENT_UNDEFINED)
    assert b not in live.copy()
    # A pin no event agrees with yields, after PIN_SECONDS, to what the events said.
    live.set(a, "paused")
    ev(a, libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_CRASHED)
    assert live.get(a) == "paused"
    clock[0] += live.PIN_SECONDS + 1
    assert live.get(a) == "crashed"
    mark = live.changes(None)[0]
    ev(a, libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED)
    assert live.changes(mark)[1] == {a: "running"}


def test_a_batch_makes_the_reservations_together_at_its_end(libvirt_test_driver):
    hv = libvirt_test_driver
    hv.ensure_network()
    base = hv.create_base_image("batchimg", size_gb=1)
    ids = [f"0c00000{i}-0000-4000-8000-000000000000" for i in range(3)]
    with hv.batch():
        for i, iid in enumerate(ids):
            hv.spawn(iid, base_image=base, vcpu=1, memory_mb=64, disk_gb=1, guest=_guest(hv, i))
        assert hv.list_reservations() == []  # queued
        hv.destroy(ids[2])  # an instance gone before the end takes its reservation along
    found = {r.mac: r.address for r in hv.list_reservations()}
    assert found == {_guest(hv, i).nics[0].mac: f"10.213.9.{i + 2}" for i in range(2)}
    assert all(hv.describe(i).reservations for i in ids[:2])
    assert hv.statuses()[ids[0]] == "running"


# -- a real sandbox, loaded small ------------------------------------------------------------------
def _agent(config, *args, input=None):
    return agent_ok(config, *args, input=input, timeout=300)


def _get(port, path, token, userid):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"X-Auth-Token": token, "X-Auth-Cloudauth-Id": userid})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _token(port, who):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/auth/token", method="POST",
                                 data=json.dumps({"api_key": who["api_key"], "api_secret": who["api_secret"]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]["token"]


@pytest.mark.real_commands
def test_a_small_load_keeps_every_invariant_and_serves(tmp_path):
    import sqlite3

    state, config = tmp_path / "state", tmp_path / "state" / "controller.ini"
    _agent(config, "init", "--sandbox", str(state))
    admin = _agent(config, "user", "create-superuser", "--email", "admin@example.org", "--password-file", "-",
                   input="Admin-pass-2026-x\n")
    loaded = _agent(config, "sandbox", "load", "--users", "40", "--owners", "3", "--managed-per-owner", "4",
                    "--instances", "35", "--owner-instances", "5", "--groups", "7", "--members-per-group", "3")
    assert (loaded["users"], loaded["owners"], loaded["managed_users"], loaded["accounts"], loaded["volumes"],
            loaded["groups"], loaded["instances"]) == (40, 3, 12, 40, 40, 7, 35)

    db = sqlite3.connect(state / "controller.db")
    db.row_factory = sqlite3.Row
    users = db.execute("SELECT * FROM users WHERE registration_source = 'load'").fetchall()
    accounts = db.execute("SELECT * FROM system_accounts").fetchall()
    instances = db.execute("SELECT * FROM instances").fetchall()
    groups = db.execute("SELECT * FROM groups").fetchall()
    assert len(users) == 40 and len(accounts) == 40 and len(instances) == 35
    # Ownership: 3 owners with 4 managed users each; the rest plain.
    owned = Counter(u["owner_userid"] for u in users if u["owner_userid"])
    assert sorted(owned.values()) == [4, 4, 4]
    # Unique names, numbers and addresses; addresses in the subnet; all live.
    for column in ("username", "uid", "uuid"):
        assert len({a[column] for a in accounts}) == 40
    for column in ("private_ip", "hostname", "mac"):
        assert len({i[column] for i in instances}) == 35 and all(i[column] for i in instances)
    subnet = IPv4Network("10.213.0.0/16")
    assert all(IPv4Address(i["private_ip"]) in subnet for i in instances)
    assert all(i["intent"] is None and i["status"] == "running" for i in instances)
    per_owner = Counter(i["owner_id"] for i in instances)
    assert sorted(per_owner[o] for o in owned) == [5, 5, 5]
    # Each instance's user is its owner's account.
    account_of = {a["user_id"]: a for a in accounts}
    links = db.execute("SELECT instance_id, account_uuid FROM instance_users").fetchall()
    assert {(l[0], l[1]) for l in links} == {(i["id"], account_of[i["owner_id"]]["uuid"]) for i in instances}

    # Accounts, private groups and API groups in the scratch root; homes made and owned.
    root = str(state / "sysroot")
    passwd = {e.name: e for e in sysroot.read_passwd(root)}
    etc_groups = {g.name: g for g in sysroot.read_group(root)}
    for a in accounts:
        assert (passwd[a["username"]].uid, passwd[a["username"]].gid) == (a["uid"], a["gid"])
        assert etc_groups[a["username"]].gid == a["gid"]
        st = os.lstat(state / "home" / a["username"])
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
            (a["uid"], a["gid"], 0o700)
    for g in groups:
        members = [m[0] for m in db.execute(
            "SELECT username FROM group_members WHERE group_id = ? ORDER BY position", (g["id"],))]
        assert list(etc_groups[g["name"]].members) == members and len(members) == 3
        assert 70000 <= etc_groups[g["name"]].gid <= 79999
    assert _tool("grpck", "-r", "-R", root).returncode == 0
    assert _agent(config, "reconcile") == {"drift": []}

    # The server makes every domain at start: all instances answer running, and an
    # owner sees its own and its managed users' instances.
    port = free_port()
    server, _ = start_server(config, tmp_path / "serve.log", port=port, timeout=120)
    try:
        listed = _get(port, "/v1/server-instance", _token(port, admin), admin["userid"])["data"]
        assert sorted(i["id"] for i in listed) == sorted(i["id"] for i in instances)
        assert {i["status"] for i in listed} == {"running"}
        owner = loaded["sample"]["owner"]
        mine = _get(port, "/v1/server-instance", _token(port, owner), owner["userid"])["data"]
        visible = {owner["userid"]} | {u["id"] for u in users if u["owner_userid"] == owner["userid"]}
        assert sorted(i["id"] for i in mine) == sorted(i["id"] for i in instances if i["owner_id"] in visible)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "sandbox reconcile: left" not in (tmp_path / "serve.log").read_text()
