"""The controller interface on fake host adapters: every endpoint, rule and error."""

import pytest

from controller.errors import HostError
from tests.fixtures.api import enable, give_volume, make_caller

NOT_A_UUID = "not-a-uuid"
UNKNOWN = "00000000-0000-4000-8000-000000000000"


def ok(r, status=200):
    assert r.status_code == status, r.json
    assert r.json["success"] is True and r.json["msg"] == ""
    assert isinstance(r.json["data"], list)
    return r.json["data"]


def err(r, status):
    assert r.status_code == status, r.json
    assert r.json == {"data": [], "msg": r.json["msg"], "success": False}
    assert r.json["msg"]
    return r.json["msg"]


@pytest.fixture
def people(cctx):
    """A superuser, an owner with a managed user, and a stranger; all with accounts."""
    admin = make_caller(cctx, "root@example.org", roles=("superuser",))
    owner = make_caller(cctx, "owner@example.org")
    managed = make_caller(cctx, "managed@example.org", owner=owner)
    stranger = make_caller(cctx, "stranger@example.org")
    accounts = {}
    # "admin" is a reserved name (a privileged group's): the superuser's account is ccadmin.
    for name, caller in (("admin", admin), ("owner", owner), ("managed", managed), ("stranger", stranger)):
        accounts[name] = enable(cctx, caller, username="ccadmin" if name == "admin" else name)
    return {"admin": admin, "owner": owner, "managed": managed, "stranger": stranger, "accounts": accounts}


def boot(client, caller, catalog, **extra):
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"], **extra}
    return client.simulate_post("/v1/server-instance", headers=caller.headers, json=body)


# -- images and flavors ----------------------------------------------------------------
def test_images_list_public_and_granted_ones_with_inactive_flagged(client, cctx, people, catalog):
    owner = people["owner"]
    ids = {i["id"]: i for i in ok(client.simulate_get("/v1/server-image", headers=owner.headers))}
    assert catalog["public"]["id"] in ids and catalog["inactive"]["id"] in ids
    assert catalog["private"]["id"] not in ids
    assert ids[catalog["inactive"]["id"]]["active"] is False
    from controller.storage import images

    images.grant_image(cctx, catalog["private"]["id"], owner.email)
    ids = {i["id"] for i in ok(client.simulate_get("/v1/server-image", headers=owner.headers))}
    assert catalog["private"]["id"] in ids
    admin_ids = {i["id"] for i in ok(client.simulate_get("/v1/server-image", headers=people["admin"].headers))}
    assert catalog["private"]["id"] in admin_ids


def test_image_object_has_exactly_the_spec_fields(client, people, catalog):
    [image] = ok(client.simulate_get(f"/v1/server-image/{catalog['public']['id']}", headers=people["owner"].headers))
    assert set(image) == {"id", "name", "public", "operating-system", "min-disk", "min-ram", "creation-date", "active"}
    assert image["operating-system"] == {"name": "debian", "major_version": "12", "minor_version": "7"}
    assert image["creation-date"].endswith("Z") and image["min-disk"] == 2 and image["public"] is True


@pytest.mark.parametrize("image_id", [NOT_A_UUID, UNKNOWN])
def test_unknown_image_is_404(client, people, catalog, image_id):
    err(client.simulate_get(f"/v1/server-image/{image_id}", headers=people["owner"].headers), 404)


def test_private_image_is_invisible_to_others(client, people, catalog):
    err(client.simulate_get(f"/v1/server-image/{catalog['private']['id']}", headers=people["owner"].headers), 404)


def test_flavors_list_and_get(client, people, catalog):
    flavors = ok(client.simulate_get("/v1/server-flavor", headers=people["owner"].headers))
    assert {f["name"] for f in flavors} == {"small", "tiny"}
    assert all(isinstance(f["id"], str) and set(f) == {"id", "name", "memory", "disk", "vcpu"} for f in flavors)
    [small] = ok(client.simulate_get(f"/v1/server-flavor/{catalog['small']['id']}", headers=people["owner"].headers))
    assert small == {"id": catalog["small"]["id"], "name": "small", "memory": 1024, "disk": 10, "vcpu": 1}
    for bad in ("999", "abc", "-1"):
        err(client.simulate_get(f"/v1/server-flavor/{bad}", headers=people["owner"].headers), 404)


@pytest.mark.parametrize("path", ["/v1/server-image", "/v1/server-flavor", "/v1/server-image/x", "/v1/server-flavor/1"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_images_and_flavors_are_read_only_with_allow_header(client, people, path, method):
    r = client.simulate_request(method, path, headers=people["owner"].headers, json={})
    err(r, 405)
    assert "GET" in r.headers["allow"] and "POST" not in r.headers["allow"]


def test_requests_without_valid_auth_are_401(client, people):
    for headers in ({}, {"X-Auth-Token": "nope", "X-Auth-Cloudauth-Id": people["owner"].id},
                    {"X-Auth-Token": people["owner"].token, "X-Auth-Cloudauth-Id": people["managed"].id}):
        err(client.simulate_get("/v1/server-instance", headers=headers), 401)


# -- volumes ---------------------------------------------------------------------------
def test_volume_create_makes_the_home_and_the_row(client, cctx, adapters, people):
    owner = people["owner"]
    r = client.simulate_post("/v1/storage-volume", headers=owner.headers,
                             json={"volume-size": 3, "volume-type": {"visibility": "cluster"}, "volume-name": "home"})
    [vol] = ok(r, 201)
    assert vol["cloudauth-id"] == owner.id and vol["volume-size"] == 3 and vol["volume-name"] == "home"
    assert vol["volume-type"] == {"visibility": "cluster", "mount-point": adapters.homes.path("owner")}
    assert set(vol) == {"volume-id", "cloudauth-id", "volume-size", "volume-type", "creation-date", "volume-name"}
    state = adapters.homes.inspect("owner")
    assert state.exists and state.uid == people["accounts"]["owner"]["uid"] and state.mode == 0o700
    assert cctx.store.volume_of_user(owner.id)["size_gb"] == 3


def test_second_volume_is_409_and_needs_an_account(client, cctx, people):
    give_volume(client, people["owner"])
    err(client.simulate_post("/v1/storage-volume", headers=people["owner"].headers,
                             json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)
    nobody = make_caller(cctx, "noaccount@example.org")
    msg = err(client.simulate_post("/v1/storage-volume", headers=nobody.headers,
                                   json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)
    assert "system account" in msg
    assert cctx.store.volume_of_user(nobody.id) is None


@pytest.mark.parametrize("body", [
    {},
    {"volume-size": 1},
    {"volume-size": 0, "volume-type": {"visibility": "cluster"}},
    {"volume-size": 101, "volume-type": {"visibility": "cluster"}},
    {"volume-size": "1", "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1.5, "volume-type": {"visibility": "cluster"}},
    {"volume-size": True, "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1, "volume-type": {"visibility": "public"}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster", "mount-point": "/etc"}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "extra": 1},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": 5},
])
def test_bad_volume_bodies_are_400(client, cctx, people, body):
    err(client.simulate_post("/v1/storage-volume", headers=people["owner"].headers, json=body), 400)
    assert cctx.store.volume_of_user(people["owner"].id) is None


def test_volume_visibility_and_delete_permissions(client, cctx, adapters, people):
    mine = give_volume(client, people["managed"])
    vid = mine["volume-id"]
    for who in ("managed", "owner", "admin"):
        assert [v["volume-id"] for v in ok(client.simulate_get("/v1/storage-volume", headers=people[who].headers))] == [vid]
    assert ok(client.simulate_get("/v1/storage-volume", headers=people["stranger"].headers)) == []
    err(client.simulate_get(f"/v1/storage-volume/{vid}", headers=people["stranger"].headers), 404)
    err(client.simulate_delete(f"/v1/storage-volume/{vid}", headers=people["stranger"].headers), 404)
    assert ok(client.simulate_get(f"/v1/storage-volume?cloudauth-id={people['owner'].id}",
                                  headers=people["owner"].headers)) == []
    err(client.simulate_get("/v1/storage-volume?cloudauth-id=xyz", headers=people["owner"].headers), 400)
    assert ok(client.simulate_delete(f"/v1/storage-volume/{vid}", headers=people["owner"].headers)) == []
    assert cctx.store.volume_of_user(people["managed"].id) is None
    assert not adapters.homes.inspect("managed").exists
    err(client.simulate_get(f"/v1/storage-volume/{vid}", headers=people["owner"].headers), 404)


def test_managed_user_cannot_delete_its_owners_volume(client, people):
    vol = give_volume(client, people["owner"])
    # The managed user cannot even see it.
    err(client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=people["managed"].headers), 404)


def test_volume_put_is_405(client, people):
    vol = give_volume(client, people["owner"])
    r = client.simulate_put(f"/v1/storage-volume/{vol['volume-id']}", headers=people["owner"].headers, json={})
    err(r, 405)
    assert "PUT" not in r.headers["allow"]


@pytest.mark.parametrize("step", ["create"])
def test_volume_host_failure_leaves_no_row(client, cctx, adapters, people, step):
    adapters.homes.fail_on[step] = HostError("disk on fire")
    err(client.simulate_post("/v1/storage-volume", headers=people["owner"].headers,
                             json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 503)
    assert cctx.store.volume_of_user(people["owner"].id) is None
    assert not adapters.homes.inspect("owner").exists


# -- instances -----------------------------------------------------------------------------
def test_instance_create_needs_account_and_volume(client, cctx, adapters, people, catalog):
    nobody = make_caller(cctx, "nobody@example.org")
    assert "system account" in err(boot(client, nobody, catalog), 409)
    assert "home volume" in err(boot(client, people["owner"], catalog), 409)
    assert cctx.store.all_instances() == [] and adapters.hypervisor.list_instances() == []


def test_instance_create_runs_the_domain_with_the_owners_share(client, cctx, adapters, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    [inst] = ok(boot(client, owner, catalog), 201)
    assert inst["cloudauth-id"] == owner.id and inst["status"] == "running"
    assert inst["users"] == [people["accounts"]["owner"]["uuid"]]
    assert inst["server-image"] == catalog["public"]["id"] and inst["server-flavor"] == catalog["small"]["id"]
    assert set(inst) <= {"id", "cloudauth-id", "users", "server-image", "server-flavor", "creation-date", "status",
                         "hostname", "public-ip", "private-ip", "expires-at", "lease"}
    assert inst["expires-at"] is None and inst["lease"] == "none"  # leases are off unless configured
    info = adapters.hypervisor.describe(inst["id"])
    assert info.status == "running"
    assert [(s.tag, s.source_dir) for s in info.shares] == [("owner", adapters.homes.path("owner"))]
    assert [r["id"] for r in cctx.store.all_instances()] == [inst["id"]]


def test_instance_with_granted_users(client, cctx, adapters, people, catalog):
    owner, acc = people["owner"], people["accounts"]
    give_volume(client, owner)
    give_volume(client, people["managed"])
    [inst] = ok(boot(client, owner, catalog, users=[acc["managed"]["uuid"]]), 201)
    assert set(inst["users"]) == {acc["owner"]["uuid"], acc["managed"]["uuid"]}
    tags = {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares}
    assert tags == {"owner", "managed"}
    # A stranger's account may not be granted; unknown ids are 400.
    err(boot(client, owner, catalog, users=[acc["stranger"]["uuid"]]), 403)
    err(boot(client, owner, catalog, users=[UNKNOWN]), 400)
    err(boot(client, owner, catalog, users=["nope"]), 400)
    assert len(cctx.store.all_instances()) == 1


@pytest.mark.parametrize("change,status", [
    ({"server-image": UNKNOWN}, 400),
    ({"server-image": "not-uuid"}, 400),
    ({"server-flavor": "999"}, 400),
    ({"server-flavor": "tiny"}, 400),
    ({"users": "x"}, 400),
    ({"users": [1]}, 400),
    ({"extra": True}, 400),
    ({"server-image": 5}, 400),
])
def test_bad_instance_bodies(client, cctx, people, catalog, change, status):
    give_volume(client, people["owner"])
    err(boot(client, people["owner"], catalog, **change), status)
    assert cctx.store.all_instances() == []


def test_flavor_too_small_private_and_inactive_images_are_400(client, cctx, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["tiny"]["id"]}
    assert "too small" in err(client.simulate_post("/v1/server-instance", headers=owner.headers, json=body), 400)
    for image in ("private", "inactive"):
        body = {"server-image": catalog[image]["id"], "server-flavor": catalog["small"]["id"]}
        err(client.simulate_post("/v1/server-instance", headers=owner.headers, json=body), 400)
    assert cctx.store.all_instances() == []


@pytest.mark.parametrize("step", ["volume", "seed", "reserve", "define", "start", "spawn"])
def test_a_failure_at_each_spawn_step_leaves_nothing(client, cctx, adapters, people, catalog, step):
    # No row, domain, disk, seed or DHCP reservation.
    give_volume(client, people["owner"])
    adapters.hypervisor.fail_on[step] = HostError(f"{step} failed")
    assert f"{step} failed" in err(boot(client, people["owner"], catalog), 503)
    assert cctx.store.all_instances() == []
    assert adapters.hypervisor.list_instances() == []
    assert adapters.hypervisor.disks == {}
    assert adapters.hypervisor.seeds == {} and adapters.hypervisor.list_reservations() == []


def test_a_failure_after_spawn_undoes_the_domain(client, cctx, adapters, people, catalog, monkeypatch):
    give_volume(client, people["owner"])

    def broken(*a, **k):
        raise HostError("status unreadable")

    monkeypatch.setattr(adapters.hypervisor, "status", broken)
    err(boot(client, people["owner"], catalog), 503)
    assert cctx.store.all_instances() == []
    assert adapters.hypervisor.list_instances() == []


def _host_dies_at(monkeypatch, hv, step: str) -> None:
    """The fake host stops answering when spawn reaches `step` (libvirtd stopped mid-create)."""
    steps = hv._step

    def dying(name):
        if name == step:
            hv.dead = True
        steps(name)

    monkeypatch.setattr(hv, "_step", dying)


def _reconcile_removes_the_leftover(cctx, hv, row_id) -> None:
    from controller.maintenance.reconcile import reconcile

    hv.dead = False  # the host answers again (and its back-off is over)
    cctx.adapters.hosts.forget("default")
    drift = [d for d in reconcile(cctx, fix=True) if d["target"] == row_id]
    assert [(d["kind"], d["fixed"]) for d in drift] == [("instance-create-interrupted", True)]
    assert cctx.store.all_instances() == []
    assert hv.list_instances() == [] and hv.disks == {} and hv.seeds == {}
    assert all(not net for net in hv.networks.values())  # no DHCP reservation either
    assert reconcile(cctx) == []


@pytest.mark.parametrize("step", ["volume", "seed", "define", "start"])
def test_a_host_lost_mid_spawn_keeps_the_row_for_reconcile(client, cctx, adapters, people, catalog, monkeypatch,
                                                           step):
    """Issue 16, faults: libvirtd stopped mid-create. What spawn made cannot be removed from a
    host that does not answer; the row stays, hidden, with its intent, and reconcile removes
    both once the host answers. Deleted at once, it left domains and disks without a record."""
    owner = people["owner"]
    give_volume(client, owner)
    hv = adapters.hypervisor
    _host_dies_at(monkeypatch, hv, step)
    assert "cleanup failed" in err(boot(client, owner, catalog), 503)
    [row] = cctx.store.all_instances()
    assert row["intent"] == "creating"
    assert ok(client.simulate_get("/v1/server-instance", headers=owner.headers)) == []  # never shown
    assert (row["id"] in hv.disks) is (step != "volume")  # made before the host went
    monkeypatch.setattr(hv, "_step", type(hv)._step.__get__(hv))
    _reconcile_removes_the_leftover(cctx, hv, row["id"])


def test_a_host_lost_right_after_spawn_keeps_the_row_for_reconcile(client, cctx, adapters, people, catalog,
                                                                   monkeypatch):
    """The domain was made and started, then the host stopped answering before its status
    was read: the domain cannot be removed, so its row stays for reconcile (it was deleted,
    leaving a running domain without a record)."""
    from controller.errors import HostUnreachable

    owner = people["owner"]
    give_volume(client, owner)
    hv = adapters.hypervisor

    def gone(instance_id):
        hv.dead = True
        raise HostUnreachable("cannot connect to libvirt at fake host (status)")

    monkeypatch.setattr(hv, "status", gone)
    err(boot(client, owner, catalog), 503)
    [row] = cctx.store.all_instances()
    assert row["intent"] == "creating" and hv.instances[row["id"]].status == "running"
    monkeypatch.setattr(hv, "status", type(hv).status.__get__(hv))
    _reconcile_removes_the_leftover(cctx, hv, row["id"])


def test_instance_visibility(client, people, catalog):
    for who in ("owner", "managed", "stranger"):
        give_volume(client, people[who])
    [mine] = ok(boot(client, people["managed"], catalog), 201)
    [other] = ok(boot(client, people["stranger"], catalog), 201)
    seen = lambda who, q="": {i["id"] for i in ok(client.simulate_get(f"/v1/server-instance{q}", headers=people[who].headers))}  # noqa: E731
    assert seen("managed") == {mine["id"]}
    assert seen("owner") == {mine["id"]}
    assert seen("stranger") == {other["id"]}
    assert seen("admin") == {mine["id"], other["id"]}
    assert seen("admin", f"?cloudauth-id={people['stranger'].id}") == {other["id"]}
    assert seen("owner", f"?cloudauth-id={people['stranger'].id}") == set()
    err(client.simulate_get(f"/v1/server-instance/{other['id']}", headers=people["owner"].headers), 404)
    err(client.simulate_get("/v1/server-instance?cloudauth-id=123", headers=people["owner"].headers), 400)
    err(client.simulate_get(f"/v1/server-instance/{NOT_A_UUID}", headers=people["owner"].headers), 404)


def test_reads_make_one_hypervisor_call_whatever_the_row_count(client, cctx, adapters, people, catalog):
    owner, hv = people["owner"], adapters.hypervisor
    give_volume(client, owner)
    ids = [ok(boot(client, owner, catalog), 201)[0]["id"] for _ in range(5)]
    hv.instances[ids[0]].status = "shutoff"  # changed behind the controller's back
    del hv.instances[ids[1]]  # lost by the host
    for path, rows in (("/v1/server-instance", 5), (f"/v1/server-instance/{ids[2]}", 1)):
        before = hv.host_calls
        assert len(ok(client.simulate_get(path, headers=owner.headers))) == rows
        assert hv.host_calls - before == 1, hv.calls
    listed = {i["id"]: i["status"] for i in ok(client.simulate_get("/v1/server-instance", headers=owner.headers))}
    assert listed[ids[0]] == "shutoff" and listed[ids[1]] == "error" and listed[ids[4]] == "running"
    stored = {r["id"]: r["status"] for r in cctx.store.all_instances()}
    assert stored[ids[0]] == "shutoff" and stored[ids[1]] == "error"


def test_a_get_answers_the_hosts_status_and_records_it(client, cctx, adapters, people, catalog, monkeypatch):
    owner, hv = people["owner"], adapters.hypervisor
    give_volume(client, owner)
    made = ok(boot(client, owner, catalog), 201)[0]
    path = f"/v1/server-instance/{made['id']}"
    assert ok(client.simulate_get(path, headers=owner.headers)) == [made]
    hv.instances[made["id"]].status = "shutoff"  # changed behind the controller's back
    assert ok(client.simulate_get(path, headers=owner.headers)) == [dict(made, status="shutoff")]
    assert cctx.store.get_instance(made["id"], visible_to=None)["status"] == "shutoff"

    def unreachable(instance_id):
        raise HostError("the host does not answer")

    monkeypatch.setattr(hv, "status", unreachable)
    assert ok(client.simulate_get(path, headers=owner.headers)) == [dict(made, status="error")]
    assert cctx.store.get_instance(made["id"], visible_to=None)["status"] == "shutoff"

    def deleted_meanwhile(instance_id):  # after the row was read, before it is encoded again
        cctx.store.delete_instance(instance_id)
        return "running"

    monkeypatch.setattr(hv, "status", deleted_meanwhile)
    err(client.simulate_get(path, headers=owner.headers), 404)


def test_a_list_answers_from_the_record_when_the_host_cannot(client, cctx, adapters, people, catalog):
    owner = people["owner"]
    give_volume(client, owner)
    [inst] = ok(boot(client, owner, catalog), 201)
    adapters.hypervisor.fail_on["statuses"] = HostError("host down")
    [listed] = ok(client.simulate_get("/v1/server-instance", headers=owner.headers))
    assert listed["id"] == inst["id"]


def put_task(client, caller, instance_id, task):
    return client.simulate_put(f"/v1/server-instance/{instance_id}", headers=caller.headers, json={"task": task})


def test_power_tasks(client, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    iid, owner = inst["id"], people["owner"]
    [after] = ok(put_task(client, owner, iid, {"what": "power-off"}))
    assert after["status"] == "shutoff" and adapters.hypervisor.status(iid) == "shutoff"
    [after] = ok(put_task(client, owner, iid, {"what": "power-off"}))  # already off: no change
    assert after["status"] == "shutoff"
    assert "running" in err(put_task(client, owner, iid, {"what": "reboot"}), 409)
    [after] = ok(put_task(client, owner, iid, {"what": "power-on"}))
    assert after["status"] == "running" and adapters.hypervisor.status(iid) == "running"
    ok(put_task(client, owner, iid, {"what": "power-on"}))
    [after] = ok(put_task(client, owner, iid, {"what": "reboot"}))
    assert after["status"] == "running"


@pytest.mark.parametrize("body", [
    {},
    {"task": {}},
    {"task": {"what": "explode"}},
    {"task": {"what": "reboot", "how": "add"}},
    {"task": {"what": "modify-users", "how": "add"}},
    {"task": {"what": "modify-users", "how": "merge", "users": []}},
    {"task": {"what": "modify-users", "how": "add", "users": "x"}},
    {"task": {"what": "power-on"}, "extra": 1},
    {"task": "reboot"},
])
def test_bad_task_bodies_are_400(client, people, catalog, body):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    err(client.simulate_put(f"/v1/server-instance/{inst['id']}", headers=people["owner"].headers, json=body), 400)


def test_modify_users_add_delete_replace_keep_the_owner(client, adapters, people, catalog):
    acc = people["accounts"]
    for who in ("owner", "managed"):
        give_volume(client, people[who])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    iid, owner = inst["id"], people["owner"]
    o, m = acc["owner"]["uuid"], acc["managed"]["uuid"]
    [r] = ok(put_task(client, owner, iid, {"what": "modify-users", "how": "add", "users": [m]}))
    assert r["users"] == [o, m]
    assert {s.tag for s in adapters.hypervisor.describe(iid).shares} == {"owner", "managed"}
    [r] = ok(put_task(client, owner, iid, {"what": "modify-users", "how": "delete", "users": [m, o]}))
    assert r["users"] == [o]
    assert {s.tag for s in adapters.hypervisor.describe(iid).shares} == {"owner"}
    [r] = ok(put_task(client, owner, iid, {"what": "modify-users", "how": "replace", "users": [m]}))
    assert set(r["users"]) == {o, m}
    [r] = ok(put_task(client, owner, iid, {"what": "modify-users", "how": "replace", "users": []}))
    assert r["users"] == [o]
    err(put_task(client, owner, iid, {"what": "modify-users", "how": "add", "users": [acc["stranger"]["uuid"]]}), 403)
    err(put_task(client, owner, iid, {"what": "modify-users", "how": "add", "users": [UNKNOWN]}), 400)
    assert ok(client.simulate_get(f"/v1/server-instance/{iid}", headers=owner.headers))[0]["users"] == [o]


def test_mutation_permissions(client, cctx, people, catalog):
    give_volume(client, people["managed"])
    [inst] = ok(boot(client, people["managed"], catalog), 201)
    iid = inst["id"]
    # The owner's owner and a superuser may act; a stranger does not even see it.
    ok(put_task(client, people["owner"], iid, {"what": "power-off"}))
    ok(put_task(client, people["admin"], iid, {"what": "power-on"}))
    err(put_task(client, people["stranger"], iid, {"what": "power-off"}), 404)
    err(client.simulate_delete(f"/v1/server-instance/{iid}", headers=people["stranger"].headers), 404)
    # (By the three visibility rules every visible instance is one the requester may change,
    # so the controller's 403 comes from granting, tested above.)
    assert ok(client.simulate_delete(f"/v1/server-instance/{iid}", headers=people["owner"].headers)) == []
    assert cctx.store.all_instances() == []


def test_delete_removes_domain_and_disk(client, cctx, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    assert ok(client.simulate_delete(f"/v1/server-instance/{inst['id']}", headers=people["owner"].headers)) == []
    assert adapters.hypervisor.list_instances() == [] and adapters.hypervisor.disks == {}
    err(client.simulate_get(f"/v1/server-instance/{inst['id']}", headers=people["owner"].headers), 404)


def test_delete_failure_on_host_keeps_the_row(client, cctx, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog), 201)
    adapters.hypervisor.fail_on["destroy"] = HostError("libvirt said no")
    err(client.simulate_delete(f"/v1/server-instance/{inst['id']}", headers=people["owner"].headers), 503)
    assert [r["id"] for r in cctx.store.all_instances()] == [inst["id"]]


def test_volume_create_and_delete_follow_into_shares(client, adapters, people, catalog):
    acc = people["accounts"]
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog, users=[acc["managed"]["uuid"]]), 201)
    assert {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares} == {"owner"}
    vol = give_volume(client, people["managed"])
    assert {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares} == {"owner", "managed"}
    ok(client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=people["managed"].headers))
    assert {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares} == {"owner"}


# -- groups -------------------------------------------------------------------------------------
def make_group(client, caller, name, members=None):
    body = {"group-name": name}
    if members is not None:
        body["group-members"] = members
    return client.simulate_post("/v1/group", headers=caller.headers, json=body)


# The group tests are in tests/groups/test_api_groups.py, on both groups backends.


# -- request-level errors ---------------------------------------------------------------------
def test_body_errors(client, people):
    h = people["owner"].headers
    err(client.simulate_post("/v1/group", headers=h, body="{not json", content_type="application/json"), 400)
    err(client.simulate_post("/v1/group", headers=h, body="[1]", content_type="application/json"), 400)
    err(client.simulate_post("/v1/group", headers=h, body="a=b", content_type="application/x-www-form-urlencoded"), 415)
    err(client.simulate_post("/v1/group", headers=h, body="x", content_type="text/plain"), 415)
    err(client.simulate_post("/v1/group", headers=h, body="x" * (1024 * 1024 + 1), content_type="application/json"), 413)
    err(client.simulate_post("/v1/group", headers=h, body=b"\xff\xfe", content_type="application/json"), 400)
    err(client.simulate_get("/v1/nothing-here", headers=h), 404)
    r = client.simulate_patch("/v1/group", headers=h, json={})
    err(r, 405)
    assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_host_unavailable_is_503(client, adapters, people):
    from controller.errors import HostUnavailable

    adapters.homes.fail_on["create"] = HostUnavailable("homes unreachable")
    assert "homes unreachable" in err(client.simulate_post(
        "/v1/storage-volume", headers=people["owner"].headers,
        json={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 503)


def test_missing_base_disk_is_503_and_leaves_no_row(client, cctx, adapters, people, catalog):
    give_volume(client, people["owner"])
    adapters.hypervisor.delete_base_image(catalog["public"]["id"])
    assert "base image" in err(boot(client, people["owner"], catalog), 503)
    assert cctx.store.all_instances() == []


def test_volume_survives_a_share_update_failure(client, cctx, adapters, people, catalog):
    give_volume(client, people["owner"])
    [inst] = ok(boot(client, people["owner"], catalog, users=[people["accounts"]["managed"]["uuid"]]), 201)
    adapters.hypervisor.fail_on["set_guest"] = HostError("libvirt busy")
    vol = give_volume(client, people["managed"])  # 201 although the share could not be added yet
    assert cctx.store.volume_of_user(people["managed"].id)["id"] == vol["volume-id"]
    assert adapters.homes.inspect("managed").exists
    assert {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares} == {"owner"}
    del adapters.hypervisor.fail_on["set_guest"]
    from controller.maintenance.reconcile import reconcile

    # The running guest gets the new home at its next start, which reconcile also says.
    assert [d["kind"] for d in reconcile(cctx, fix=True)] == ["domain-shares", "seed-content", "domain-live-shares"]
    assert {s.tag for s in adapters.hypervisor.describe(inst["id"]).shares} == {"owner", "managed"}


@pytest.mark.parametrize("path,allow", [
    ("/v1/server-image", {"GET"}),
    ("/v1/server-flavor/1", {"GET"}),
    ("/v1/group", {"GET", "POST"}),
    ("/v1/storage-volume/x", {"GET", "DELETE"}),
    ("/v1/user/create", {"POST"}),
])
def test_options_is_refused_and_allow_names_only_real_methods(client, people, path, allow):
    for method in ("OPTIONS", "PATCH"):
        r = client.simulate_request(method, path, headers=people["owner"].headers)
        assert r.status_code == 405, r.text
        assert r.json["success"] is False
        assert {m.strip() for m in r.headers["allow"].split(",")} == allow


def test_ids_are_case_insensitive(client, cctx, people, catalog):
    owner = people["owner"]
    vol = give_volume(client, owner)
    up = vol["volume-id"].upper()
    [same] = ok(client.simulate_get(f"/v1/storage-volume/{up}", headers=owner.headers))
    assert same["volume-id"] == vol["volume-id"]
    listed = ok(client.simulate_get(f"/v1/storage-volume?cloudauth-id={owner.id.upper()}", headers=owner.headers))
    assert [v["volume-id"] for v in listed] == [vol["volume-id"]]
    headers = {"X-Auth-Token": owner.token, "X-Auth-Cloudauth-Id": owner.id.upper()}
    assert ok(client.simulate_get("/v1/server-flavor", headers=headers))
    body = {"server-image": catalog["public"]["id"].upper(), "server-flavor": catalog["small"]["id"],
            "users": [people["accounts"]["managed"]["uuid"].upper()]}
    [inst] = ok(client.simulate_post("/v1/server-instance", headers=owner.headers, json=body), 201)
    assert inst["server-image"] == catalog["public"]["id"]
    assert people["accounts"]["managed"]["uuid"] in inst["users"]
    [g] = ok(make_group(client, owner, "upper"), 201)
    ok(client.simulate_get(f"/v1/group/{g['group-id'].upper()}", headers=owner.headers))
    r = client.simulate_get(f"/v1/user/view/{owner.id.upper()}", headers=owner.headers)
    assert r.status_code == 200 and r.json["data"]["user"]["id"] == owner.id


@pytest.mark.parametrize("path", ["/v1/group/nope", "/v1/storage-volume/nope", "/v1/server-instance/nope"])
def test_not_found_names_the_id_the_client_sent(client, people, path):
    assert "nope" in err(client.simulate_get(path, headers=people["owner"].headers), 404)
