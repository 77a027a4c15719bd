"""One lookup for every resource: a path id is parsed, fetched and answered 404 naming the id
as the client sent it (issue 8, finding 11)."""

import pytest

from controller.storage import images
from controller.errors import NotFound
from controller.rules import find_or_404
from tests.fixtures.api import enable, give_volume, make_caller

UNKNOWN_UPPER = "ABCDEF00-0000-4000-8000-000000000000"

PATHS = [
    "/v1/server-instance/{}",
    "/v1/storage-volume/{}",
    "/v1/group/{}",
    "/v1/server-image/{}",
    "/v1/server-flavor/{}",
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("given", ["not-a-uuid", "ZZZ", UNKNOWN_UPPER, "1" * 200])
def test_a_404_names_the_id_as_sent(client, admin, path, given):
    r = client.simulate_get(path.format(given), headers=admin.headers)
    assert r.status_code == 404, r.text
    assert r.json["success"] is False and r.json["data"] == []
    msg = r.json["msg"]
    assert "None" not in msg
    # Bounded: a long id is cut, but what is shown is what was sent.
    assert given[:64] in msg and len(msg) < 120, msg


def test_the_user_interface_404_names_the_id_as_sent(user_client, admin):
    r = user_client.simulate_get("/v1/user/view/not-a-uuid", headers=admin.headers)
    assert r.status_code == 404 and "not-a-uuid" in r.json["message"] and "None" not in r.json["message"]


def test_upper_case_ids_find_the_resource(client, cctx, admin, catalog):
    enable(cctx, admin)
    volume = give_volume(client, admin)
    r = client.simulate_post("/v1/group", headers=admin.headers, json={"group-name": "lab"})
    assert r.status_code == 201, r.text
    group = r.json["data"][0]
    r = client.simulate_post("/v1/server-instance", headers=admin.headers,
                             json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]})
    assert r.status_code == 201, r.text
    instance = r.json["data"][0]
    for path, obj_id, key in (("/v1/server-instance/{}", instance["id"], "id"),
                              ("/v1/storage-volume/{}", volume["volume-id"], "volume-id"),
                              ("/v1/group/{}", group["group-id"], "group-id"),
                              ("/v1/server-image/{}", catalog["public"]["id"], "id")):
        r = client.simulate_get(path.format(obj_id.upper()), headers=admin.headers)
        assert r.status_code == 200, r.text
        assert r.json["data"][0][key] == obj_id


def test_an_invisible_resource_is_404_like_a_missing_one(client, cctx, admin):
    enable(cctx, admin)
    volume = give_volume(client, admin)
    stranger = make_caller(cctx, "stranger@example.org")
    r = client.simulate_get(f"/v1/storage-volume/{volume['volume-id']}", headers=stranger.headers)
    assert r.status_code == 404 and volume["volume-id"] in r.json["msg"]


def test_admin_image_commands_take_an_upper_case_id(cctx, catalog, admin):
    """cloud-agent image activate/deactivate/grant: the row is found by its canonical id and the
    change is made to it (deactivate used to update nothing and then fail on a None row)."""
    private = catalog["private"]
    out = images.set_image_active(cctx, private["id"].upper(), False)
    assert out["id"] == private["id"] and out["active"] is False
    assert cctx.store.get_image(private["id"])["active"] == 0
    images.grant_image(cctx, private["id"].upper(), admin.email)
    assert cctx.store.list_images(usable_by=admin.id, image_id=private["id"])


@pytest.mark.parametrize("given", [None, "", "x", "../etc"])
def test_find_or_404_never_fetches_a_malformed_id(given):
    fetched = []
    with pytest.raises(NotFound) as e:
        find_or_404("thing", given, lambda i: fetched.append(i))
    assert fetched == [] and e.value.message == f"thing {given} not found"
