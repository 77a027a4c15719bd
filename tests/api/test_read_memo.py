"""A GET of one instance and a list of one chunk are remembered only while nothing was written,
here or in any other process (controller/store/read_memo.py): a deletion, a status change or a
user cut from its owner shows in the very next read."""

from controller.store import Store
from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401 (fixture)
from tests.fixtures.api import give_volume


def statements(store, call):
    """call()'s result and the SQL statements it ran in this thread (the test client serves
    requests in the caller's thread)."""
    ran = []
    store.conn.set_trace_callback(ran.append)
    try:
        return call(), ran
    finally:
        store.conn.set_trace_callback(None)


def reads(ran):
    return [s for s in ran if s.lstrip().upper().startswith("SELECT")]


def list_reads(ran):
    """The list's own statements (its hosts and its objects): the status sync beside them asks
    the fake host, whose statuses are not kept by events, on every list."""
    return [s for s in ran if "DISTINCT host" in s or "group_concat" in s]


def test_a_repeated_get_and_list_run_no_statement_until_a_write(client, cctx, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    [made] = ok(boot(client, owner, catalog), 201)
    get = lambda: ok(client.simulate_get(f"/v1/server-instance/{made['id']}", headers=owner.headers))  # noqa: E731
    listed = lambda: ok(client.simulate_get("/v1/server-instance", headers=owner.headers))  # noqa: E731
    first, ran = statements(cctx.store, get)
    assert first == [made] and reads(ran)
    again, ran = statements(cctx.store, get)
    assert again == [made] and ran == []
    first_list, ran = statements(cctx.store, listed)
    assert first_list == [made] and len(list_reads(ran)) == 2
    again, ran = statements(cctx.store, listed)
    assert again == [made] and list_reads(ran) == []
    cctx.store.purge_expired_tokens(now=0)  # any committed write, even one that changes no row
    again, ran = statements(cctx.store, get)
    assert again == [made] and reads(ran)
    again, ran = statements(cctx.store, listed)
    assert again == [made] and len(list_reads(ran)) == 2


def test_a_user_cut_from_its_owner_is_hidden_from_the_owner_at_once(client, cctx, people, catalog):
    owner, managed = people["owner"], people["managed"]
    give_volume(client, managed)
    [made] = ok(boot(client, managed, catalog), 201)
    path = f"/v1/server-instance/{made['id']}"
    for _ in range(2):  # the second answer is the remembered one
        assert ok(client.simulate_get(path, headers=owner.headers)) == [made]
        assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == [made]
    cctx.store.update_user(managed.id, {"owner_userid": None})
    err(client.simulate_get(path, headers=owner.headers), 404)
    assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == []
    assert ok(client.simulate_get(path, headers=managed.headers)) == [made]


def test_a_write_by_another_process_ends_what_is_remembered(client, cctx, adapters, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    made = [ok(boot(client, owner, catalog), 201)[0] for _ in range(2)]
    path = f"/v1/server-instance/{made[0]['id']}"
    for _ in range(2):
        assert ok(client.simulate_get(path, headers=owner.headers)) == [made[0]]
        # Made in the same second, they are listed by id.
        assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == sorted(made, key=lambda i: i["id"])
    # Another Store on the same database file stands for `cloud-agent` in another process:
    # only the shared write mark tells this one about its commit.
    other = Store(cctx.store.path)
    try:
        assert other.write_mark.usable
        other.delete_instance(made[0]["id"])
    finally:
        other.close()
    err(client.simulate_get(path, headers=owner.headers), 404)
    assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == [made[1]]


def test_a_status_changed_on_the_host_is_answered_though_the_row_was_remembered(client, cctx, adapters, people,
                                                                             catalog):
    owner, hv = people["owner"], adapters.hypervisor
    give_volume(client, owner)
    [made] = ok(boot(client, owner, catalog), 201)
    path = f"/v1/server-instance/{made['id']}"
    for _ in range(2):
        assert ok(client.simulate_get(path, headers=owner.headers)) == [made]
    hv.instances[made["id"]].status = "shutoff"  # changed behind the controller's back
    assert ok(client.simulate_get(path, headers=owner.headers)) == [dict(made, status="shutoff")]
    assert ok(client.simulate_get(path, headers=owner.headers)) == [dict(made, status="shutoff")]
    assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == [dict(made, status="shutoff")]
    assert cctx.store.get_instance(made["id"], visible_to=None)["status"] == "shutoff"
