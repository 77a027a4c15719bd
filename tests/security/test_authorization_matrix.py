"""Who may do what: every endpoint against every kind of requester, one table.

The target is a managed user `target` owned by `owner`, who is itself owned by
`grandowner`; `target` holds a system account, a volume, an instance and a
group. Each cell is the status the documented rules give (docs/api.md):
the test fails on any cell that differs. Every cell runs against a fresh
service on fake adapters, so destructive calls do not disturb the others.
"""

import time

import pytest
from falcon import testing

from controller.storage import images
from tests.fixtures.api import enable, give_volume, make_caller

REQUESTERS = [
    "anonymous", "bad_token", "expired_token", "stranger", "self", "owner", "grandowner", "superuser",
    "view_user", "create_user", "update_user", "view_user_secret",
]

# The user interface. `T` is the target's id, `E` its email.
U = {"anonymous": 401, "bad_token": 401, "expired_token": 401}


def row(default, **cells):
    return {**U, **{r: default for r in REQUESTERS if r not in U}, **cells}


USER_MATRIX = [
    ("GET", "/v1/user/list", None, row(200)),
    ("POST", "/v1/user/list", {}, row(200)),
    ("GET", "/v1/user/view/T", None, row(403, self=200, owner=200, superuser=200)),
    ("POST", "/v1/user/create", "NEW", row(403, superuser=200, create_user=200)),
    ("POST", "/v1/user/update/T", {"name": "New Name"}, row(403, self=200, owner=200, superuser=200)),
    ("GET", "/v1/user/search?email=E", None, row(200)),
    ("POST", "/v1/user/set_password/T", {"password": "Another-pass-2026"}, row(403, superuser=200)),
    ("GET", "/v1/user/view_api_secret/T", None, row(403, superuser=200)),
    ("POST", "/v1/user/reset_api_secret/T", {}, row(403, superuser=200)),
    # The target still has a volume and an account: the superuser passes the check and hits the rule.
    ("POST", "/v1/user/delete/E", {}, row(403, superuser=409)),
]

# The controller. `I`, `V`, `G`: the target's instance, volume and group. Invisible is 404, never 403.
VISIBLE = dict(self=200, owner=200, superuser=200)
CONTROLLER_MATRIX = [
    ("GET", "/v1/server-instance", None, row(200)),
    ("GET", "/v1/server-instance/I", None, row(404, **VISIBLE)),
    ("PUT", "/v1/server-instance/I", {"task": {"what": "power-off"}}, row(404, **VISIBLE)),
    ("DELETE", "/v1/server-instance/I", None, row(404, **VISIBLE)),
    ("GET", "/v1/storage-volume", None, row(200)),
    ("GET", "/v1/storage-volume/V", None, row(404, **VISIBLE)),
    ("DELETE", "/v1/storage-volume/V", None, row(404, **VISIBLE)),
    ("GET", "/v1/group", None, row(200)),
    ("GET", "/v1/group/G", None, row(404, **VISIBLE)),
    ("PUT", "/v1/group/G", {"action": "replace", "group-members": []}, row(404, **VISIBLE)),
    ("DELETE", "/v1/group/G", None, row(404, **VISIBLE)),
    ("GET", "/v1/server-image", None, row(200)),
    ("GET", "/v1/server-flavor", None, row(200)),
    # Which host each instance is on: a superuser's only (host names map the cluster).
    ("GET", "/v1/server-host", None, row(403, superuser=200)),
]


@pytest.fixture
def world(cctx):
    ctx = cctx
    grandowner = make_caller(ctx, "grandowner@example.org")
    owner = make_caller(ctx, "owner@example.org", owner=grandowner)
    target = make_caller(ctx, "target@example.org", owner=owner)
    people = {
        "stranger": make_caller(ctx, "stranger@example.org"),
        "self": target, "owner": owner, "grandowner": grandowner,
        "superuser": make_caller(ctx, "root@example.org", roles=("superuser",)),
    }
    for role in ("view_user", "create_user", "update_user", "view_user_secret"):
        people[role] = make_caller(ctx, f"{role.replace('_', '-')}@example.org", roles=(role,))
    expired = make_caller(ctx, "expired@example.org")
    ctx.store.conn.execute("UPDATE tokens SET expires_at = ? WHERE user_id = ?", (int(time.time()) - 1, expired.id))
    enable(ctx, target, username="target")
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    give_volume(client, target)
    image = images.add_image(ctx, name="i", os_name="d", os_major="1", os_minor="0", min_disk=1, min_ram=64)
    flavor = images.add_flavor(ctx, name="f", memory=128, disk=1, vcpu=1)
    inst = client.simulate_post("/v1/server-instance", headers=target.headers,
                                json={"server-image": image["id"], "server-flavor": flavor["id"]}).json["data"][0]
    group = client.simulate_post("/v1/group", headers=target.headers,
                                 json={"group-name": "targets", "group-members": ["target"]}).json["data"][0]
    [volume] = client.simulate_get("/v1/storage-volume", headers=target.headers).json["data"]
    ids = {"T": target.id, "E": target.email, "I": inst["id"], "V": volume["volume-id"], "G": group["group-id"]}
    headers = {name: caller.headers for name, caller in people.items()}
    headers["anonymous"] = {}
    headers["bad_token"] = {"X-Auth-Token": "not-a-token", "X-Auth-Cloudauth-Id": target.id}
    headers["expired_token"] = expired.headers
    return client, headers, ids


def _cells(matrix):
    return [pytest.param((method, path, body), who, status, id=f"{method} {path} as {who}")
            for method, path, body, statuses in matrix for who, status in statuses.items()]


def _call(world, key, who):
    client, headers, ids = world
    method, path, body = key
    for placeholder, value in ids.items():
        path = path.replace(f"/{placeholder}", f"/{value}").replace(f"={placeholder}", f"={value}")
    if body == "NEW":
        body = {"email": f"new-{who}@example.org", "password": "Brand-new-pass-26"}
    kwargs = {"json": body} if body is not None else {}
    return client.simulate_request(method, path, headers=headers[who], **kwargs)


@pytest.mark.parametrize("key, who, status", _cells(USER_MATRIX))
def test_user_interface(world, key, who, status):
    r = _call(world, key, who)
    assert r.status_code == status, r.text
    assert r.json["success"] is (status == 200) and r.json["version"] == "1"


@pytest.mark.parametrize("key, who, status", _cells(CONTROLLER_MATRIX))
def test_controller(world, key, who, status):
    r = _call(world, key, who)
    assert r.status_code == status, r.text
    assert r.json["success"] is (status < 300)


def test_list_shows_each_requester_exactly_its_own(world):
    client, headers, ids = world
    seen = {who: {i["id"] for i in client.simulate_get("/v1/server-instance", headers=headers[who]).json["data"]}
            for who in REQUESTERS if who not in U}
    assert {who for who, found in seen.items() if ids["I"] in found} == {"self", "owner", "superuser"}
