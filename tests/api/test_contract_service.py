"""Black-box tests of the published contract (the API spec, the README and docs/): the service
endpoints, body limits and content types (the controller's rules, docs/api.md).

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import json

from tests.fixtures.blackbox import PASSWORD, cc_err, ui_err, unique


# ===========================================================================
# Service endpoints
# ===========================================================================

def test_openapi_document_lists_both_interfaces(env):
    r = env.call("GET", "/v1/openapi.json")
    assert r.status == 200
    doc = r.body
    assert str(doc["openapi"]).startswith("3.")
    paths = set(doc["paths"])
    for p in ("/v1/server-instance", "/v1/server-image", "/v1/server-flavor", "/v1/storage-volume", "/v1/group",
              "/v1/user/list", "/v1/user/create", "/v1/user/search", "/v1/auth/token"):
        assert p in paths, p
    for prefix in ("/v1/server-instance/{", "/v1/storage-volume/{", "/v1/group/{", "/v1/user/view/{",
                   "/v1/user/update/{", "/v1/user/delete/{", "/v1/user/set_password/{"):
        assert any(p.startswith(prefix) for p in paths), prefix


# ===========================================================================
# Body limits and content types (the controller's rules, docs/api.md)
# ===========================================================================

def test_413_on_both_interfaces(env):
    u = env.user(account=True)
    big = "x" * (1024 * 1024 + 10)
    r = env.call("POST", "/v1/storage-volume", who=u,
                 json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": big})
    cc_err(r, 413)
    r = env.call("POST", "/v1/user/create", who=env.admin,
                 json_body={"email": f"{unique('big-')}@example.org", "password": PASSWORD, "name": big})
    ui_err(r, 413)


def test_415_and_400_on_controller_bodies(env):
    u = env.user(account=True)
    body = json.dumps({"volume-size": 1, "volume-type": {"visibility": "cluster"}}).encode()
    cc_err(env.call("POST", "/v1/storage-volume", who=u, data=body, content_type="text/plain"), 415)
    cc_err(env.call("POST", "/v1/storage-volume", who=u, data=b"{not json", content_type="application/json"), 400)
    cc_err(env.call("POST", "/v1/storage-volume", who=u, json_body=[1, 2]), 400)
