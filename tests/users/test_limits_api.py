"""GET /v1/limits (limits, docs/api.md): a user's limits in force and what it holds now,
for itself or a user it sees; on fake host adapters through the API."""

import pytest

from controller import limits
from tests.fixtures.api import enable, give_volume, make_caller

SMALL = {"instances": 3, "vcpus": 4, "memory_mb": 4096, "groups": 2, "managed_users": 5}


def limits_of(client, caller, **query) -> dict:
    r = client.simulate_get("/v1/limits", headers=caller.headers, params=query)
    assert r.status_code == 200, r.json
    assert r.json["success"] is True and r.json["msg"] == ""
    [obj] = r.json["data"]
    assert set(obj) == {"cloudauth-id", *limits.KINDS}
    return obj


def refused(client, caller, status, **query) -> str:
    r = client.simulate_get("/v1/limits", headers=caller.headers, params=query)
    assert r.status_code == status, r.json
    assert r.json["data"] == [] and r.json["success"] is False
    return r.json["msg"]


@pytest.fixture
def limited(cctx):
    cctx.config = cctx.config.with_values({"limits": SMALL})
    return cctx


@pytest.fixture
def owner(limited, client):
    caller = make_caller(limited, "owner@example.org", roles=("create_user",))
    enable(limited, caller, username="owner")
    give_volume(client, caller)
    return caller


def test_a_user_sees_its_limits_and_what_it_holds(client, limited, owner, catalog):
    fresh = limits_of(client, owner)
    assert fresh == {"cloudauth-id": owner.id, **{k: {"limit": v, "used": 0} for k, v in SMALL.items()}}
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]}
    assert client.simulate_post("/v1/server-instance", headers=owner.headers, json=body).status_code == 201
    assert client.simulate_post("/v1/group", headers=owner.headers, json={"group-name": "lab"}).status_code == 201
    make_caller(limited, "managed@example.org", owner=owner)
    held = limits_of(client, owner)
    assert held["instances"] == {"limit": 3, "used": 1}
    assert held["vcpus"] == {"limit": 4, "used": catalog["small"]["vcpu"]}
    assert held["memory_mb"] == {"limit": 4096, "used": catalog["small"]["memory"]}
    assert held["groups"] == {"limit": 2, "used": 1}
    assert held["managed_users"] == {"limit": 5, "used": 1}


def test_an_override_and_no_limit_show_as_set(client, limited, owner):
    limits.set_limits(limited, limited.store.get_user(owner.id), {"instances": -1, "groups": 7})
    got = limits_of(client, owner)
    assert got["instances"]["limit"] == -1 and got["groups"]["limit"] == 7
    assert got["vcpus"]["limit"] == SMALL["vcpus"]


def test_owner_sees_its_managed_user_and_a_superuser_sees_anyone(client, limited, owner, admin):
    managed = make_caller(limited, "managed@example.org", owner=owner)
    assert limits_of(client, owner, **{"cloudauth-id": managed.id})["cloudauth-id"] == managed.id
    assert limits_of(client, admin, **{"cloudauth-id": owner.id})["managed_users"]["used"] == 1
    assert limits_of(client, admin, **{"cloudauth-id": managed.id})["cloudauth-id"] == managed.id


def test_a_user_not_seen_is_404_and_a_bad_id_400(client, limited, owner, admin):
    stranger = make_caller(limited, "stranger@example.org")
    assert refused(client, stranger, 404, **{"cloudauth-id": owner.id}) == f"user {owner.id} not found"
    assert refused(client, stranger, 404, **{"cloudauth-id": admin.id}) == f"user {admin.id} not found"
    assert refused(client, owner, 404, **{"cloudauth-id": "7c7c7c7c-0000-4000-8000-000000000000"}).endswith("not found")
    assert refused(client, owner, 400, **{"cloudauth-id": "not-a-uuid"}) == "cloudauth-id must be a UUID"


def test_limits_need_a_token(client, limited):
    assert client.simulate_get("/v1/limits").status_code == 401


def test_the_openapi_document_lists_limits():
    from api.openapi import openapi_document

    op = openapi_document()["paths"]["/v1/limits"]["get"]
    assert {"200", "400", "401", "404"} <= set(op["responses"])
    assert [p["name"] for p in op["parameters"]] == ["cloudauth-id"]
