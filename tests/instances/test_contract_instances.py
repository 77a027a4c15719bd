"""Black-box tests of the published contract (the API spec, the README and docs/): server-instances.

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import ipaddress
import re
import uuid

from tests.fixtures.blackbox import (
    DATE_TIME, INSTANCE_FIELDS, INSTANCE_REQUIRED, INSTANCE_STATUSES, boot, cc_err, cc_ok, is_uuid,
    ready_user, ready_users,
)


# ===========================================================================
# Server-instances
# ===========================================================================

def test_instance_needs_account_and_volume(env, contract_catalog):
    bare, enabled = env.users({}, {"account": True})
    cc_err(boot(env, bare, contract_catalog), 409)
    cc_err(boot(env, enabled, contract_catalog), 409)


def test_instance_create_fields_and_get(env, contract_catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, contract_catalog), 201)
    assert len(inst) == 1
    inst = inst[0]
    assert INSTANCE_REQUIRED <= set(inst) <= INSTANCE_FIELDS, inst
    assert is_uuid(inst["id"]) and inst["cloudauth-id"] == u.id
    assert inst["users"] == [u.account_uuid]
    assert inst["server-image"] == contract_catalog["public"]["id"] and inst["server-flavor"] == contract_catalog["small"]["id"]
    assert DATE_TIME.match(inst["creation-date"])
    assert inst["status"] == "running"  # 201 comes once the domain is started
    for key in ("public-ip", "private-ip"):
        if key in inst:
            ipaddress.ip_address(inst[key])
    if "hostname" in inst:
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", inst["hostname"]), inst["hostname"]
    assert cc_ok(env.call("GET", f"/v1/server-instance/{inst['id']}", who=u)) == [inst]
    second = cc_ok(boot(env, u, contract_catalog), 201)[0]  # several instances per user
    listed = {i["id"] for i in cc_ok(env.call("GET", "/v1/server-instance", who=u))}
    assert listed == {inst["id"], second["id"]}


def instance_bad_body(contract_catalog, case, u):
    body = {"server-image": contract_catalog["public"]["id"], "server-flavor": contract_catalog["small"]["id"]}
    if case == "unknown-image":
        body["server-image"] = str(uuid.uuid4())
    elif case == "non-uuid-image":
        body["server-image"] = "debian"
    elif case == "inactive-image":
        body["server-image"] = contract_catalog["inactive"]["id"]
    elif case == "private-image":
        body["server-image"] = contract_catalog["private"]["id"]
    elif case == "unknown-flavor":
        body["server-flavor"] = "987654"
    elif case == "small-flavor":
        body["server-flavor"] = contract_catalog["tiny"]["id"]
    elif case == "image-needs-more-disk":
        body["server-image"] = contract_catalog["big-disk"]["id"]
    elif case == "extra-property":
        body["name"] = "vm"
    elif case == "missing-flavor":
        del body["server-flavor"]
    elif case == "users-not-array":
        body["users"] = u.account_uuid
    elif case == "image-not-string":
        body["server-image"] = 5
    elif case == "flavor-as-integer":  # spec 4.1: server-flavor is a string
        body["server-flavor"] = int(contract_catalog["small"]["id"])
    return body


def test_instance_bad_requests(env, contract_catalog):
    u = ready_user(env)
    for case in ("unknown-image", "non-uuid-image", "inactive-image", "private-image", "unknown-flavor",
                 "small-flavor", "image-needs-more-disk", "extra-property", "missing-flavor", "users-not-array",
                 "image-not-string", "flavor-as-integer"):
        r = env.call("POST", "/v1/server-instance", who=u, json_body=instance_bad_body(contract_catalog, case, u))
        assert r.status == 400, (case, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", "/v1/server-instance", who=u)) == []


def test_instance_users_grants(env, contract_catalog):
    owner = ready_user(env)
    managed, stranger = env.users({"owner": owner, "account": True, "login": False},
                                  {"account": True, "login": False})
    cc_err(boot(env, owner, contract_catalog, users=[str(uuid.uuid4())]), 400)
    cc_err(boot(env, owner, contract_catalog, users=[stranger.account_uuid]), 403)
    inst = cc_ok(boot(env, owner, contract_catalog, users=[managed.account_uuid]), 201)[0]
    assert sorted(inst["users"]) == sorted([owner.account_uuid, managed.account_uuid])
    inst = cc_ok(boot(env, owner, contract_catalog, users=[owner.account_uuid]), 201)[0]
    assert inst["users"] == [owner.account_uuid]

    admin_ready = ready_user(env, roles=["superuser"])
    inst = cc_ok(boot(env, admin_ready, contract_catalog, users=[stranger.account_uuid]), 201)[0]
    assert sorted(inst["users"]) == sorted([admin_ready.account_uuid, stranger.account_uuid])


def test_instance_power_states(env, contract_catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, contract_catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"

    def task(what, status=200):
        r = env.call("PUT", path, who=u, json_body={"task": {"what": what}})
        if status == 200:
            data = cc_ok(r)
            assert len(data) == 1 and data[0]["id"] == inst["id"]
            assert data[0]["status"] in INSTANCE_STATUSES
            return data[0]
        cc_err(r, status)
        return None

    assert task("reboot")["status"] == "running"
    assert task("power-off")["status"] == "shutoff"
    assert task("power-off")["status"] == "shutoff"  # already off: success, no change
    task("reboot", 409)
    assert cc_ok(env.call("GET", path, who=u))[0]["status"] == "shutoff"
    assert task("power-on")["status"] == "running"
    assert task("power-on")["status"] == "running"
    assert task("reboot")["status"] == "running"


INSTANCE_BAD_PUTS = [
    {},
    {"task": {"what": "explode"}},
    {"task": {"what": "reboot"}, "extra": 1},
    {"task": {"what": "reboot", "how": "add"}},
    {"task": {"what": "modify-users", "how": "add"}},
    {"task": {"what": "modify-users", "users": []}},
    {"task": {"what": "modify-users", "how": "merge", "users": []}},
    {"task": {"what": "modify-users", "how": "add", "users": [], "x": 1}},
    {"task": "reboot"},
]


def test_instance_put_bad_bodies(env, contract_catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, contract_catalog), 201)[0]
    for body in INSTANCE_BAD_PUTS:
        r = env.call("PUT", f"/v1/server-instance/{inst['id']}", who=u, json_body=body)
        assert r.status == 400, (body, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", f"/v1/server-instance/{inst['id']}", who=u)) == [inst]


def test_instance_modify_users(env, contract_catalog):
    owner = ready_user(env)
    m1, m2, stranger = env.users({"owner": owner, "account": True, "login": False},
                                 {"owner": owner, "account": True, "login": False},
                                 {"account": True, "login": False})
    inst = cc_ok(boot(env, owner, contract_catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"

    def modify(how, users, status=200):
        r = env.call("PUT", path, who=owner, json_body={"task": {"what": "modify-users", "how": how, "users": users}})
        if status != 200:
            cc_err(r, status)
            return None
        data = cc_ok(r)
        assert len(data) == 1
        return sorted(data[0]["users"])

    o, a, b = owner.account_uuid, m1.account_uuid, m2.account_uuid
    assert modify("add", [a]) == sorted([o, a])
    assert modify("add", [b]) == sorted([o, a, b])
    assert modify("delete", [a]) == sorted([o, b])
    assert modify("delete", [o]) == sorted([o, b])  # the owner stays
    assert modify("replace", [a]) == sorted([o, a])
    assert modify("replace", []) == [o]
    modify("add", [str(uuid.uuid4())], 400)
    modify("add", [stranger.account_uuid], 403)
    assert sorted(cc_ok(env.call("GET", path, who=owner))[0]["users"]) == [o]


def test_instance_visibility_and_delete(env, contract_catalog):
    owner = ready_user(env)
    managed, stranger = ready_users(env, {"owner": owner}, {})
    i_owner = cc_ok(boot(env, owner, contract_catalog), 201)[0]
    i_managed = cc_ok(boot(env, managed, contract_catalog), 201)[0]
    i_stranger = cc_ok(boot(env, stranger, contract_catalog), 201)[0]

    def listed(who, **query):
        return {i["id"] for i in cc_ok(env.call("GET", "/v1/server-instance", who=who, query=query or None))}

    assert listed(managed) == {i_managed["id"]}
    assert listed(owner) == {i_owner["id"], i_managed["id"]}
    assert {i_owner["id"], i_managed["id"], i_stranger["id"]} <= listed(env.admin)
    assert listed(owner, **{"cloudauth-id": managed.id}) == {i_managed["id"]}
    assert listed(env.admin, **{"cloudauth-id": stranger.id}) == {i_stranger["id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/server-instance", who=owner, query={"cloudauth-id": "abc"}), 400)

    for method, body in (("GET", None), ("PUT", {"task": {"what": "power-off"}}), ("DELETE", None)):
        cc_err(env.call(method, f"/v1/server-instance/{i_owner['id']}", who=stranger, json_body=body), 404)
        cc_err(env.call(method, f"/v1/server-instance/{i_owner['id']}", who=managed, json_body=body), 404)
    cc_err(env.call("GET", "/v1/server-instance/not-a-uuid", who=owner), 404)
    cc_err(env.call("DELETE", f"/v1/server-instance/{uuid.uuid4()}", who=owner), 404)

    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_managed['id']}", who=owner)) == []
    cc_err(env.call("GET", f"/v1/server-instance/{i_managed['id']}", who=managed), 404)
    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_stranger['id']}", who=env.admin)) == []
    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_owner['id']}", who=owner)) == []
    assert listed(owner) == set()


def test_controller_405_has_allow(env):
    u = env.user()
    r = env.call("PATCH", "/v1/server-instance", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "POST"} <= r.allow()
    r = env.call("POST", f"/v1/server-instance/{uuid.uuid4()}", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "PUT", "DELETE"} <= r.allow()
    r = env.call("PUT", "/v1/group", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "POST"} <= r.allow()
