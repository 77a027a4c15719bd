"""Hostile input is refused with a 4xx before it reaches the host.

The service runs on the sandbox's real adapters (libvirt's test driver, homes
on disk, accounts and groups in a scratch system root). While the hostile
requests are sent, every argv the adapters would run and every call into the
hypervisor, homes, groups and directory adapters is recorded: there must be
none, and every answer must be a 4xx in the right envelope.
"""

import json

import pytest
from falcon import testing

from controller.storage import images
from host_adapters import subp
from tests.fixtures.api import config_values_for, enable, give_volume, make_caller, new_context

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

SHELL = ["a;b", "$(id)", "`id`", "a|b", "a&&b", "a b", "-rf", "a\nb", "a\x00b"]
PATHS = ["..", "../etc", "a/b", "/etc/passwd", "./x", "%2e%2e"]
LOOK_ALIKE = ["аdmin", "ｒoot", "al\u200bice"]  # Cyrillic a, fullwidth r, zero-width space
LONG = ["a" * 33, "a" * 5000]
NAMES = SHELL + PATHS + LOOK_ALIKE + LONG + ["", "Alice", "1abc", "a:b", "a,b"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import libvirt

    from host_adapters.accounts.sysroot import make_sysroot
    from tests.fixtures.libvirtd import cleanup_hypervisor, unique_prefix

    tmp = tmp_path_factory.mktemp("hostile")
    values = config_values_for(tmp)
    values["libvirt"]["domain_prefix"] = unique_prefix()
    (tmp / "home").mkdir()
    make_sysroot(str(values["unix"]["root"]))
    anchor = libvirt.open("test:///default")
    ctx = new_context(values, real_adapters=True)
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subp, "_run", subp._run)  # real commands for the set-up
        alice = make_caller(ctx, "alice@example.org", roles=("superuser",))
        enable(ctx, alice, username="alice")
        give_volume(client, alice)
        image = images.add_image(ctx, name="i", os_name="d", os_major="1", os_minor="0", min_disk=1, min_ram=64)
        flavor = images.add_flavor(ctx, name="f", memory=128, disk=1, vcpu=1)
        [inst] = client.simulate_post("/v1/server-instance", headers=alice.headers,
                                      json={"server-image": image["id"], "server-flavor": flavor["id"]}).json["data"]
        [group] = client.simulate_post("/v1/group", headers=alice.headers,
                                       json={"group-name": "lab", "group-members": ["alice"]}).json["data"]
    yield {"ctx": ctx, "client": client, "alice": alice, "image": image, "flavor": flavor, "instance": inst,
           "group": group}
    cleanup_hypervisor(ctx.adapters.hypervisor)
    anchor.close()


@pytest.fixture
def recorder(world, monkeypatch):
    """Every argv run and every adapter call made while the test runs."""
    seen = []
    real_run = subp._run

    def record_run(argv, **kwargs):
        seen.append(("argv", list(argv)))
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subp, "_run", record_run)
    adapters = world["ctx"].adapters
    for name in ("hypervisor", "homes", "groups", "directory"):
        adapter = getattr(adapters, name)
        for method in [m for m in dir(type(adapter)) if not m.startswith("_")]:
            real = getattr(adapter, method)
            if not callable(real):
                continue

            def recording(*args, _name=f"{name}.{method}", _real=real, **kwargs):
                seen.append(("call", _name))
                return _real(*args, **kwargs)

            monkeypatch.setattr(adapter, method, recording)
    return seen


def refused(r):
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    body = r.json
    assert body["success"] is False and (body.get("msg") or body.get("message")), body


def send(world, method, path, body=None, *, raw=None, content_type="application/json"):
    headers = dict(world["alice"].headers)
    kwargs = {}
    if raw is not None:
        headers["Content-Type"] = content_type
        kwargs["body"] = raw
    elif body is not None:
        kwargs["json"] = body
    return world["client"].simulate_request(method, path, headers=headers, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_group_names(world, recorder, name):
    refused(send(world, "POST", "/v1/group", {"group-name": name}))
    refused(send(world, "GET", "/v1/group", None, raw=None) if False else
            world["client"].simulate_get("/v1/group", headers=world["alice"].headers,
                                         params={"group-name": "lab", "cloudauth-id": name}))
    assert recorder == []


@pytest.mark.parametrize("name", NAMES)
def test_member_names(world, recorder, name):
    refused(send(world, "POST", "/v1/group", {"group-name": "newgroup", "group-members": [name]}))
    for action in ("add", "delete", "replace"):
        refused(send(world, "PUT", f"/v1/group/{world['group']['group-id']}",
                     {"action": action, "group-members": [name]}))
    assert recorder == []


@pytest.mark.parametrize("value", SHELL + PATHS + LONG + ["00000000-0000-4000-8000-00000000000g"])
def test_ids_in_paths_and_bodies(world, recorder, value):
    from urllib.parse import quote

    quoted = quote(value, safe="")
    for path in (f"/v1/server-instance/{quoted}", f"/v1/storage-volume/{quoted}", f"/v1/group/{quoted}",
                 f"/v1/server-image/{quoted}", f"/v1/user/view/{quoted}"):
        r = world["client"].simulate_get(path, headers=world["alice"].headers)
        assert r.status_code in (400, 404), (path, r.status_code)
    refused(send(world, "DELETE", f"/v1/server-instance/{quoted}"))
    refused(send(world, "DELETE", f"/v1/storage-volume/{quoted}"))
    refused(send(world, "PUT", f"/v1/server-instance/{world['instance']['id']}",
                 {"task": {"what": "modify-users", "how": "add", "users": [value]}}))
    refused(send(world, "POST", "/v1/server-instance",
                 {"server-image": value, "server-flavor": world["flavor"]["id"]}))
    refused(send(world, "POST", "/v1/server-instance",
                 {"server-image": world["image"]["id"], "server-flavor": value}))
    assert recorder == []


@pytest.mark.parametrize("size", ["1; rm -rf /", -1, 0, 10**12, True, [], 1.5, None])
def test_volume_sizes(world, recorder, size):
    refused(send(world, "POST", "/v1/storage-volume", {"volume-size": size, "volume-type": {"visibility": "cluster"}}))
    assert recorder == []


@pytest.mark.parametrize("raw, content_type", [
    (b"[" * 100_000 + b"]" * 100_000, "application/json"),  # deep
    (b'{"group-name": "ok", "group-name": "bad;name"}', "application/json"),  # duplicate keys: the last wins
    (b'{"group-name": "' + b"a" * (2 * 1024 * 1024) + b'"}', "application/json"),  # huge: 413
    (b"group-name=lab2", "application/x-www-form-urlencoded"),
    (b"group-name: lab2", "text/plain"),
    (b"\xff\xfe{}", "application/json"),
    (b'{"group-name": "lab2"', "application/json"),
    (b'"lab2"', "application/json"),
])
def test_malformed_bodies(world, recorder, raw, content_type):
    refused(send(world, "POST", "/v1/group", raw=raw, content_type=content_type))
    assert world["ctx"].store.list_groups(visible_to=None, name="lab2") == []
    assert recorder == []


@pytest.mark.parametrize("email", ["a@b;c", "../x@y.z", "a\x00b@c.d", "x" * 300 + "@example.org", "", "not-an-email"])
def test_user_interface_emails(world, recorder, email):
    r = send(world, "POST", "/v1/user/create", {"email": email, "password": "Alice-pass-2026"})
    assert 400 <= r.status_code < 500 and r.json["success"] is False
    assert recorder == []


def test_nothing_was_recorded_by_accident(world, recorder):
    """The recorder itself sees host work: a valid group create does run groupadd."""
    r = send(world, "POST", "/v1/group", {"group-name": "recorded"})
    assert r.status_code == 201, r.text
    assert any(kind == "argv" and "groupadd" in argv[0] for kind, argv in recorder if kind == "argv")
    send(world, "DELETE", f"/v1/group/{r.json['data'][0]['group-id']}")


def test_large_json_numbers_and_nesting_do_not_crash(world, recorder):
    body = json.dumps({"volume-size": 10**400, "volume-type": {"visibility": "cluster"}}).encode()
    refused(send(world, "POST", "/v1/storage-volume", raw=body))
    assert recorder == []


# -- flavor ids: ASCII digits only (issue 16, finding 14) ----------------------------------------
# str.isdigit() passed "\u00b9" (then int() failed: a 500) and other scripts' digits, which
# int() reads: "\u0661" was flavor 1.
def _look_alike_digits(flavor_id: str) -> list[str]:
    return [flavor_id.translate({ord("0") + d: base + d for d in range(10)})
            for base in (0x0660, 0xFF10, 0x0966, 0x1D7CE)]  # Arabic-Indic, fullwidth, Devanagari, math bold


def _flavor_ids(world) -> list[str]:
    return ["\u00b9", "\u00b2", "\u00b3" * 3, "1" * 5000, "9" * 19, "-1", " 1", "1 ",
            *_look_alike_digits(world["flavor"]["id"])]


def test_a_flavor_id_that_is_not_ascii_digits_is_404(world, recorder):
    from urllib.parse import quote

    assert world["flavor"]["id"].isascii() and world["flavor"]["id"].isdigit()
    for value in _flavor_ids(world):
        r = world["client"].simulate_get(f"/v1/server-flavor/{quote(value, safe='')}", headers=world["alice"].headers)
        assert r.status_code == 404, (value[:20], r.status_code, r.text)
        assert r.json["success"] is False and r.json["data"] == [] and "not found" in r.json["msg"]
    r = world["client"].simulate_get(f"/v1/server-flavor/{world['flavor']['id']}", headers=world["alice"].headers)
    assert r.status_code == 200 and r.json["data"] == [world["flavor"]]
    assert recorder == []


def test_an_instance_with_a_flavor_id_that_is_not_ascii_digits_is_400(world, recorder):
    store = world["ctx"].store
    before = [r["id"] for r in store.all_instances()]
    for value in _flavor_ids(world):
        r = send(world, "POST", "/v1/server-instance", {"server-image": world["image"]["id"], "server-flavor": value})
        assert r.status_code == 400, (value[:20], r.status_code, r.text)
        refused(r)
        assert "server-flavor" in r.json["msg"] and "does not exist" in r.json["msg"]
    assert [r["id"] for r in store.all_instances()] == before
    assert recorder == []
