"""32 concurrent clients on one resource: exactly one winner where one must win, no lost
update, no `database is locked` reaching a client, and database and host agreeing after."""

import pytest

from controller.errors import Conflict
from controller.locks import host_changes
from controller.maintenance.reconcile import reconcile
from tests.fixtures.api import enable, give_volume, hold_purges, make_caller
from tests.fixtures.concurrency import together
from tests.api.test_controller_api import boot, people  # noqa: F401  (fixture)

CLIENTS = 32


def statuses(results):
    assert not [r for r in results if isinstance(r, Exception)], results
    for r in results:
        assert r.status_code < 500, r.text
        assert "locked" not in r.text
    return sorted(r.status_code for r in results)


def test_one_second_volume(client, cctx, people):
    owner = people["owner"]
    results = together(CLIENTS, lambda i: client.simulate_post(
        "/v1/storage-volume", headers=owner.headers, json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}))
    assert statuses(results) == [201] + [409] * (CLIENTS - 1)
    assert len(cctx.store.list_volumes(visible_to=None, owner_id=owner.id, with_intents=True)) == 1


def test_one_group_name(client, cctx, adapters, people):
    results = together(CLIENTS, lambda i: client.simulate_post(
        "/v1/group", headers=people["owner"].headers, json={"group-name": "race"}))
    assert statuses(results) == [201] + [409] * (CLIENTS - 1)
    assert len(cctx.store.list_groups(visible_to=None, name="race", with_intents=True)) == 1
    assert "race" in adapters.groups.groups


def test_one_delete_of_a_volume(client, cctx, adapters, people):
    vol = give_volume(client, people["owner"])
    deleted = []
    real = adapters.homes.retire

    def counting(*args, **kwargs):
        deleted.append(args)
        return real(*args, **kwargs)

    adapters.homes.retire = counting
    results = together(CLIENTS, lambda i: client.simulate_delete(
        f"/v1/storage-volume/{vol['volume-id']}", headers=people["owner"].headers))
    codes = statuses(results)
    assert codes.count(200) == 1 and set(codes) <= {200, 404, 409}
    assert len(deleted) == 1  # the tree is removed once, not by every retry
    assert cctx.store.volume_of_user(people["owner"].id) is None


def test_modify_users_on_one_instance_loses_no_update(client, cctx, adapters, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    [inst] = boot(client, owner, catalog).json["data"]
    managed = []
    for i in range(CLIENTS):
        caller = make_caller(cctx, f"m{i}@example.org", owner=owner)
        managed.append(enable(cctx, caller, username=f"m{i:02d}")["uuid"])
    results = together(CLIENTS, lambda i: client.simulate_put(
        f"/v1/server-instance/{inst['id']}", headers=owner.headers,
        json={"task": {"what": "modify-users", "how": "add", "users": [managed[i]]}}))
    assert statuses(results) == [200] * CLIENTS
    [row] = cctx.store.list_instances(visible_to=None, instance_id=inst["id"])
    assert set(row["users"]) == {people["accounts"]["owner"]["uuid"], *managed}
    guest_users = {u.username for u in adapters.hypervisor.instances[inst["id"]].guest.users}
    assert guest_users == {"owner", *(f"m{i:02d}" for i in range(CLIENTS))}  # the host agrees


def test_group_member_adds_lose_no_update(client, cctx, adapters, people):
    owner = people["owner"]
    names = []
    for i in range(CLIENTS):
        caller = make_caller(cctx, f"g{i}@example.org", owner=owner)
        names.append(enable(cctx, caller, username=f"g{i:02d}")["username"])
    [group] = client.simulate_post("/v1/group", headers=owner.headers, json={"group-name": "lab"}).json["data"]
    results = together(CLIENTS, lambda i: client.simulate_put(
        f"/v1/group/{group['group-id']}", headers=owner.headers, json={"action": "add", "group-members": [names[i]]}))
    assert statuses(results) == [200] * CLIENTS
    [row] = cctx.store.list_groups(visible_to=None, group_id=group["group-id"])
    assert sorted(row["members"]) == sorted(names)
    assert sorted(adapters.groups.get("lab")) == sorted(names)
    assert [d for d in reconcile(cctx) if d["kind"] == "group-members"] == []


def test_reconcile_fix_waits_for_operations_in_flight(cctx):
    with host_changes(cctx):  # an operation in flight
        with pytest.raises(Conflict):
            with host_changes(cctx, exclusive=True, wait=False):
                pass
    with host_changes(cctx, exclusive=True, wait=False):  # free again
        pass


def test_a_volume_delete_answers_before_the_tree_is_removed(client, cctx, adapters, people):
    """The slow part of a delete runs in the background: the request thread returns at once."""
    from controller.background import Background

    cctx.background = Background()
    vol = give_volume(client, people["owner"])
    release, purging = hold_purges(adapters.homes)
    r = client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=people["owner"].headers)
    assert r.status_code == 200
    assert purging.wait(10)  # the removal runs, and the request did not wait for it
    assert cctx.store.volume_of_user(people["owner"].id) is None
    assert len(adapters.homes.list_retired()) == 1
    # The user may make a new volume while the old tree is still being removed.
    give_volume(client, people["owner"])
    release.set()
    cctx.background.wait()
    assert adapters.homes.list_retired() == []
    assert adapters.homes.inspect("owner").exists
