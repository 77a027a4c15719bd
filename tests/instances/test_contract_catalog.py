"""Black-box tests of the published contract (the API spec, the README and docs/): images and flavors.

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import uuid

from tests.fixtures.blackbox import DATE_TIME, FLAVOR_FIELDS, IMAGE_FIELDS, cc_err, cc_ok, unique


# ===========================================================================
# Images and flavors
# ===========================================================================

def test_images_visibility_and_fields(env, contract_catalog):
    u = env.user()
    listed = {i["id"]: i for i in cc_ok(env.call("GET", "/v1/server-image", who=u))}
    assert contract_catalog["public"]["id"] in listed
    assert contract_catalog["inactive"]["id"] in listed and listed[contract_catalog["inactive"]["id"]]["active"] is False
    assert contract_catalog["private"]["id"] not in listed
    for img in listed.values():
        assert set(img) == IMAGE_FIELDS, img
        assert set(img["operating-system"]) == {"name", "major_version", "minor_version"}
        assert all(isinstance(v, str) for v in img["operating-system"].values())
        assert isinstance(img["min-disk"], int) and isinstance(img["min-ram"], int)
        assert isinstance(img["public"], bool) and isinstance(img["active"], bool)
        assert DATE_TIME.match(img["creation-date"])
    assert cc_ok(env.call("GET", f"/v1/server-image/{contract_catalog['public']['id']}", who=u)) == [
        listed[contract_catalog["public"]["id"]]]
    cc_err(env.call("GET", f"/v1/server-image/{contract_catalog['private']['id']}", who=u), 404)
    cc_err(env.call("GET", f"/v1/server-image/{uuid.uuid4()}", who=u), 404)
    cc_err(env.call("GET", "/v1/server-image/not-a-uuid", who=u), 404)

    admin_list = {i["id"] for i in cc_ok(env.call("GET", "/v1/server-image", who=env.admin))}
    assert contract_catalog["private"]["id"] in admin_list


def test_image_grant_activate_deactivate_match_api(env, contract_catalog):
    u = env.user()
    img = env.agent("image", "add", "--name", unique("img-"), "--os-name", "rocky", "--os-major", "9",
                    "--os-minor", "3", "--min-disk", "1", "--min-ram", "256", "--private")
    assert img["public"] is False and img["active"] is True
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]
    cc_err(env.call("GET", f"/v1/server-image/{img['id']}", who=u), 404)

    granted = env.agent("image", "grant", img["id"], u.email)
    assert granted == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=u))[0]["id"] == img["id"]
    assert img["id"] in {i["id"] for i in cc_ok(env.call("GET", "/v1/server-image", who=u))}
    env.enable(u)
    env.volume(u)
    booted = cc_ok(env.call("POST", "/v1/server-instance", who=u,
                            json_body={"server-image": img["id"], "server-flavor": contract_catalog["small"]["id"]}), 201)
    assert booted[0]["server-image"] == img["id"]

    off = env.agent("image", "deactivate", img["id"])
    assert off["active"] is False and off == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]
    on = env.agent("image", "activate", img["id"])
    assert on["active"] is True and on == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]


def test_flavors(env, contract_catalog):
    u = env.user()
    listed = {f["id"]: f for f in cc_ok(env.call("GET", "/v1/server-flavor", who=u))}
    small = contract_catalog["small"]
    assert listed[small["id"]] == small
    for f in listed.values():
        assert set(f) == FLAVOR_FIELDS and isinstance(f["id"], str)
        assert all(isinstance(f[k], int) for k in ("memory", "disk", "vcpu"))
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{small['id']}", who=u)) == [small]
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{small['id']}", who=env.admin)) == [small]
    cc_err(env.call("GET", "/v1/server-flavor/987654", who=u), 404)
