"""Issue 8, finding 2: every free-text field has a bound; a longer value is 400 naming the field,
before anything is stored (user interface, controller, and the agent's image and flavor names)."""

import pytest

from controller.storage import images
from controller.errors import InvalidInput
from tests.fixtures.api import enable, make_caller, user_envelope


def refused(r, status=400) -> str:
    assert r.status_code == status, r.json
    assert r.json == {"data": [], "msg": r.json["msg"], "success": False}
    return r.json["msg"]


def ok(r, status=201):
    assert r.status_code == status, r.json
    return r.json["data"]


LONG_EMAIL = "a" * 243 + "@example.org"  # 255 characters


@pytest.mark.parametrize("extra, field", [
    ({"name": "n" * 256}, "name"),
    ({"registration_source": "r" * 65}, "registration_source"),
    ({"email": LONG_EMAIL}, "email"),
])
def test_user_create_refuses_long_text_naming_the_field(user_client, ctx, admin, extra, field):
    body = {"email": "new@example.org", "password": "Managed-pass-2026", **extra}
    r = user_client.simulate_post("/v1/user/create", headers=admin.headers, json=body)
    user_envelope(r, 400)
    assert r.json["message"].startswith(f"{field} is too long: at most ")
    assert [u["email"] for u in ctx.store.list_users(include_inactive=True)] == [admin.email]


def test_user_create_takes_text_at_its_bounds(user_client, ctx, admin):
    email = "b" * 64 + "@" + "d" * 61 + "." + "e" * 61 + "." + "f" * 61 + ".org"  # 254; a local part has 64 at most
    body = {"email": email, "password": "Managed-pass-2026", "name": "n" * 255, "registration_source": "r" * 64}
    user_envelope(user_client.simulate_post("/v1/user/create", headers=admin.headers, json=body), 200, data=True)
    assert ctx.store.get_user_by_email(email)["name"] == "n" * 255


def test_user_update_refuses_a_long_name_and_keeps_the_old_one(user_client, ctx, admin):
    r = user_client.simulate_post(f"/v1/user/update/{admin.id}", headers=admin.headers,
                                  json={"name": "x" * 256, "email": "renamed@example.org"})
    user_envelope(r, 400)
    assert r.json["message"].startswith("name is too long")
    stored = ctx.store.get_user(admin.id)
    assert (stored["name"], stored["email"]) == ("", admin.email)


@pytest.mark.parametrize("path, params, field", [
    ("/v1/user/search", {"email": LONG_EMAIL}, "email"),
    ("/v1/user/search", {"username": "u" * 33}, "username"),
    ("/v1/user/list", {"registration_source": "r" * 65}, "registration_source"),
])
def test_user_queries_refuse_long_text(user_client, admin, path, params, field):
    r = user_client.simulate_get(path, headers=admin.headers, params=params)
    user_envelope(r, 400)
    assert r.json["message"].startswith(f"{field} is too long")


def test_user_delete_refuses_a_long_email(user_client, admin):
    r = user_client.simulate_post(f"/v1/user/delete/{LONG_EMAIL}", headers=admin.headers)
    user_envelope(r, 400)
    assert r.json["message"].startswith("email is too long")


def test_volume_name_is_bounded_and_a_long_one_makes_nothing(client, cctx):
    caller = make_caller(cctx, "carol@example.org")
    enable(cctx, caller, username="carol")
    body = {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": "v" * 256}
    msg = refused(client.simulate_post("/v1/storage-volume", headers=caller.headers, json=body), 400)
    assert msg == "volume-name is too long: at most 255 characters, got 256"
    assert cctx.store.volume_of_user(caller.id) is None
    assert cctx.adapters.homes.homes == {}
    ok(client.simulate_post("/v1/storage-volume", headers=caller.headers, json=dict(body, **{"volume-name": "v" * 255})))


@pytest.mark.parametrize("field, kwargs", [
    ("image name", {"name": "i" * 256}),
    ("os-name", {"os_name": "d" * 65}),
    ("os-major", {"os_major": "1" * 65}),
    ("os-minor", {"os_minor": "1" * 65}),
])
def test_image_text_is_bounded_before_any_disk_is_made(cctx, field, kwargs):
    args = {**dict(name="Debian", os_name="debian", os_major="12", os_minor="7", min_disk=1, min_ram=256), **kwargs}
    with pytest.raises(InvalidInput, match=f"^{field} is too long"):
        images.add_image(cctx, **args)
    assert cctx.store.list_images() == [] and cctx.adapters.hypervisor.base_images == {}


def test_flavor_name_is_bounded(cctx):
    with pytest.raises(InvalidInput, match="^flavor name is too long"):
        images.add_flavor(cctx, name="f" * 256, memory=512, disk=1, vcpu=1)
    assert cctx.store.list_flavors() == []


def test_openapi_states_the_bounds():
    from api.openapi import openapi_document

    paths = openapi_document()["paths"]
    create = paths["/v1/user/create"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert create["name"]["anyOf"][0]["maxLength"] == 255
    assert create["email"]["anyOf"][0]["maxLength"] == 254
    assert create["registration_source"]["anyOf"][0]["maxLength"] == 64
    volume = paths["/v1/storage-volume"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert volume["properties"]["volume-name"]["maxLength"] == 255
