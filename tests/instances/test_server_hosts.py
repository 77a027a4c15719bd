"""GET /v1/server-host on fake host adapters: which hypervisor host each server-instance is on,
for a superuser only. The server-instance object itself keeps its own fields (none is a host),
and a regular user is never told a host name, not even of its own instances."""

from tests.api.test_controller_api import boot, err, ok, people  # noqa: F401 - fixture
from tests.fixtures.api import give_volume


def test_a_superuser_reads_the_host_of_every_instance(client, cctx, people, catalog):
    owner, stranger, admin = people["owner"], people["stranger"], people["admin"]
    made = []
    for caller in (owner, stranger):
        give_volume(client, caller)
        made.append(ok(boot(client, caller, catalog), 201)[0])
    first_host = cctx.store.get_instance(made[0]["id"], visible_to=None)["host"]
    # The other one moved elsewhere (as a drain records it): the answer is each row's host.
    cctx.store.conn.execute("UPDATE instances SET host = 'node02' WHERE id = ?", [made[1]["id"]])
    got = ok(client.simulate_get("/v1/server-host", headers=admin.headers))
    assert sorted(got, key=lambda h: h["host"] != first_host) == [
        {"id": made[0]["id"], "host": first_host}, {"id": made[1]["id"], "host": "node02"}]
    # The instance objects stay as they were: no host in them, for a superuser either.
    for obj in ok(client.simulate_get("/v1/server-instance", headers=admin.headers)):
        assert "host" not in obj


def test_anyone_else_is_refused_and_told_no_host(client, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    ok(boot(client, owner, catalog), 201)
    for who in ("owner", "managed", "stranger"):
        r = client.simulate_get("/v1/server-host", headers=people[who].headers)
        assert err(r, 403) == "listing the hosts of server-instances needs the superuser role"
        assert "default" not in r.text
    assert client.simulate_get("/v1/server-host").status_code == 401


def test_an_instance_being_created_or_deleted_is_left_out(client, cctx, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    kept, going = (ok(boot(client, owner, catalog), 201)[0] for _ in range(2))
    cctx.store.conn.execute("UPDATE instances SET intent = 'deleting' WHERE id = ?", [going["id"]])
    got = ok(client.simulate_get("/v1/server-host", headers=people["admin"].headers))
    assert [h["id"] for h in got] == [kept["id"]]
