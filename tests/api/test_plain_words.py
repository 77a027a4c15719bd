"""Issue 41, for people who are not cloud experts: name rules in words (never a pattern), values
echoed cut short, refusals in the user's words, one name per id (account id), every answer in
the envelope (413 too, also the HTTP server's own), and `GET /` sending a browser to the portal."""

import json
import re
import socket
import threading

import click
import pytest
from falcon import testing

from tests.fixtures.api import enable, give_volume, make_caller

GROUP_RULE = "Group names are 1 to 32 characters: lowercase letters, digits, - and _, starting with a letter or _"
USERNAME_RULE = "Usernames are 1 to 32 characters: lowercase letters, digits, - and _, starting with a letter or _"
# What a pattern looks like in a message: a character class, a repetition bound, an anchor.
REGEX = re.compile(r"\^\[|\[[a-zA-Z0-9]-|\{\d+,\d*\}|\$\)|must match|pattern '")


def refused(r, status=400) -> str:
    assert r.status_code == status, r.text
    assert r.json == {"data": [], "msg": r.json["msg"], "success": False}
    assert not REGEX.search(r.json["msg"]), r.json["msg"]
    return r.json["msg"]


@pytest.fixture
def alice(cctx):
    caller = make_caller(cctx, "alice@example.org")
    enable(cctx, caller, username="alice")
    return caller


# -- 1. name rules in words, values cut short -----------------------------------------------
@pytest.mark.parametrize("name", ["Lab", "bad;name", "9lab", "g" * 33])
def test_a_bad_group_name_is_refused_with_the_rule_in_words(client, alice, name):
    msg = refused(client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": name}))
    assert GROUP_RULE in msg and "group-name" in msg


def test_a_bad_member_name_is_refused_with_the_username_rule_in_words(client, alice):
    msg = refused(client.simulate_post("/v1/group", headers=alice.headers,
                                       json={"group-name": "lab", "group-members": ["Alice;x"]}))
    assert USERNAME_RULE in msg and "'Alice;x'" in msg
    [group] = client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": "lab"}).json["data"]
    for action in ("add", "delete", "replace"):
        msg = refused(client.simulate_put(f"/v1/group/{group['group-id']}", headers=alice.headers,
                                          json={"action": action, "group-members": ["-x"]}))
        assert USERNAME_RULE in msg


def test_the_sites_group_name_pattern_is_said_in_the_admins_words_never_shown(client, cctx, alice):
    cctx.config = cctx.config.with_values({"groups": {"name_pattern": "proj-[a-z]+"}})
    msg = refused(client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": "lab"}))
    assert "proj-[a-z]+" not in msg and "ask the admin" in msg
    cctx.config = cctx.config.with_values({"groups": {"name_pattern": "proj-[a-z]+",
                                                      "name_rule": "names start with proj- and a project's name"}})
    msg = refused(client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": "lab"}))
    assert msg.endswith(": names start with proj- and a project's name") and "[a-z]" not in msg


@pytest.mark.parametrize("body, field", [
    ({"group-name": "X" * 5000}, "group-name"),  # a pattern
    ({"group-name": ["X" * 5000]}, "group-name"),  # a type
    ({"group-name": "lab", "Y" * 5000: 1}, "Y"),  # an unknown field
    ({"group-name": "lab", "group-members": ["Z" * 5000]}, "Z"),  # a username
])
def test_an_echoed_value_is_cut_to_64_characters(client, alice, body, field):
    msg = refused(client.simulate_post("/v1/group", headers=alice.headers, json=body))
    assert "…" in msg and len(msg) < 300, msg
    assert re.search(r"[XYZ]{60,64}…", msg) and not re.search(r"[XYZ]{65}", msg), msg


def test_an_echoed_image_flavor_or_account_id_is_cut_to_64_characters(client, cctx, alice, catalog):
    give_volume(client, alice)
    for body in ({"server-image": "i" * 3000, "server-flavor": catalog["small"]["id"]},
                 {"server-image": catalog["public"]["id"], "server-flavor": "f" * 3000},
                 {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"],
                  "users": ["u" * 3000]}):
        msg = refused(client.simulate_post("/v1/server-instance", headers=alice.headers, json=body))
        assert "…" in msg and len(msg) < 200, msg


def test_every_pattern_of_the_api_says_its_rule_in_words():
    """A schema's pattern is never shown: each has a description, which a refusal says."""
    from api.openapi import openapi_document

    def patterns(node):
        if isinstance(node, dict):
            if "pattern" in node:
                yield node
            for value in node.values():
                yield from patterns(value)
        elif isinstance(node, list):
            for value in node:
                yield from patterns(value)

    found = list(patterns(openapi_document()))
    assert found
    for schema in found:
        assert schema.get("description") and not REGEX.search(schema["description"]), schema


def test_the_name_checks_of_the_host_adapters_say_their_rule_in_words():
    from common.errors import InvalidInput
    from host_adapters.guests.guest import check_hostname, check_mac
    from host_adapters.names import Names, check_group_name, check_id, check_username, check_volume_name

    for check, value in ((check_group_name, "A"), (check_username, "A"), (check_hostname, "-a"),
                         (check_mac, "zz"), (lambda v: check_id(v, "instance id"), "/x"),
                         (check_volume_name, ".x"), (Names, "/")):
        with pytest.raises(InvalidInput) as refusal:
            check(value)
        assert " are " in refusal.value.message and not REGEX.search(refusal.value.message), refusal.value.message


def test_no_help_of_cloud_agent_shows_a_pattern():
    from agent.cli import cli

    def commands(group):
        for command in group.commands.values():
            yield command
            if isinstance(command, click.Group):
                yield from commands(command)

    for command in commands(cli):
        for param in command.params:
            text = getattr(param, "help", None) or ""
            assert not REGEX.search(text), (command.name, param.name, text)


# -- 2. refusals in the user's words ---------------------------------------------------------
def test_a_second_volume_and_a_reboot_of_a_stopped_server_say_it_in_the_users_words(client, alice, catalog):
    give_volume(client, alice)
    r = client.simulate_post("/v1/storage-volume", headers=alice.headers,
                             json={"volume-size": 1, "volume-type": {"visibility": "cluster"}})
    assert refused(r, 409) == "you already have a home volume (one per user)"
    made = client.simulate_post("/v1/server-instance", headers=alice.headers,
                                json={"server-image": catalog["public"]["id"],
                                      "server-flavor": catalog["small"]["id"]}).json["data"][0]
    path = f"/v1/server-instance/{made['id']}"
    assert client.simulate_put(path, headers=alice.headers,
                               json={"task": {"what": "power-off"}}).json["data"][0]["status"] == "shutoff"
    r = client.simulate_put(path, headers=alice.headers, json={"task": {"what": "reboot"}})
    assert refused(r, 409) == "reboot needs a running server (this one is stopped)"


def test_a_server_without_a_volume_or_an_account_says_what_you_lack(client, cctx, alice, catalog):
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]}
    r = client.simulate_post("/v1/server-instance", headers=alice.headers, json=body)
    assert refused(r, 409) == "you have no home volume yet: create one first"
    bob = make_caller(cctx, "bob@example.org")
    r = client.simulate_post("/v1/server-instance", headers=bob.headers, json=body)
    assert refused(r, 409).startswith("you have no system account on this cluster")


# -- 3. one name per id: `users` takes account ids ---------------------------------------------
@pytest.fixture
def team(cctx):
    owner = make_caller(cctx, "owner@example.org")
    managed = make_caller(cctx, "managed@example.org", owner=owner)
    unenabled = make_caller(cctx, "unenabled@example.org", owner=owner)
    stranger = make_caller(cctx, "stranger@example.org")
    accounts = {"owner": enable(cctx, owner, username="owner"), "managed": enable(cctx, managed, username="managed"),
                "stranger": enable(cctx, stranger, username="stranger")}
    return {"owner": owner, "managed": managed, "unenabled": unenabled, "stranger": stranger, "accounts": accounts}


def test_a_user_id_in_users_names_the_account_id_to_send(client, team, catalog):
    owner, managed = team["owner"], team["managed"]
    account = team["accounts"]["managed"]
    give_volume(client, owner)
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]}
    r = client.simulate_post("/v1/server-instance", headers=owner.headers, json={**body, "users": [managed.id]})
    assert refused(r) == (f"{managed.id} is a user id; `users` takes account ids: that user's account on this "
                          f"cluster is {account['uuid']} (username managed)")
    r = client.simulate_post("/v1/server-instance", headers=owner.headers,
                             json={**body, "users": [team["unenabled"].id]})
    assert refused(r) == (f"{team['unenabled'].id} is a user id; `users` takes account ids: that user has no "
                          "account on this cluster")
    # Someone the requester may not name: no account of theirs is told, the rule is.
    r = client.simulate_post("/v1/server-instance", headers=owner.headers,
                             json={**body, "users": [team["stranger"].id]})
    msg = refused(r)
    assert msg.startswith(f"{team['stranger'].id} is a user id; `users` takes account ids")
    assert team["accounts"]["stranger"]["uuid"] not in msg and "you may name only yourself" in msg
    # The account id itself is taken.
    r = client.simulate_post("/v1/server-instance", headers=owner.headers, json={**body, "users": [account["uuid"]]})
    assert r.status_code == 201, r.text
    made = r.json["data"][0]
    for how in ("add", "replace", "delete"):
        r = client.simulate_put(f"/v1/server-instance/{made['id']}", headers=owner.headers,
                                json={"task": {"what": "modify-users", "how": how, "users": [managed.id]}})
        assert account["uuid"] in refused(r), how


def test_a_refused_account_is_named_by_its_account_id(client, team, catalog):
    owner = team["owner"]
    give_volume(client, owner)
    stranger = team["accounts"]["stranger"]
    r = client.simulate_post("/v1/server-instance", headers=owner.headers,
                             json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"],
                                   "users": [stranger["uuid"]]})
    assert f"(account id {stranger['uuid']})" in refused(r, 403)


def test_the_openapi_document_says_users_are_account_ids(client):
    doc = client.simulate_get("/v1/openapi.json").json
    create = doc["paths"]["/v1/server-instance"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    listed = doc["paths"]["/v1/server-instance"]["get"]["responses"]["200"]["content"]["application/json"]
    item = listed["schema"]["properties"]["data"]["items"]
    for users in (create["properties"]["users"], item["properties"]["users"]):
        assert users["description"].startswith("account ids: the `uuid` of each user's system account")
        assert "not the user's id" in users["description"]


# -- 4. every answer in the envelope, 413 too --------------------------------------------------
def test_a_body_over_the_limit_is_413_in_each_interfaces_envelope(client, alice):
    big = b"x" * (1024 * 1024 + 1)
    r = client.simulate_post("/v1/group", headers=alice.headers, body=big, content_type="application/json")
    assert (r.status_code, r.json) == (413, {"data": [], "msg": "request body over 1048576 bytes", "success": False})
    r = client.simulate_post("/v1/user/create", headers=alice.headers, body=big, content_type="application/json")
    assert (r.status_code, r.json) == (413, {"message": "request body over 1048576 bytes", "success": False,
                                             "version": "1"})


def _raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_the_http_servers_own_413_is_in_each_interfaces_envelope(cctx, alice):
    """A body far over the limit is refused by waitress before the app sees it: in the envelope too."""
    from waitress import create_server, wasyncore

    from api.app import create_app
    from api.server import RequestDeadline, waitress_settings

    server = create_server(create_app(cctx), host="127.0.0.1", port=0, threads=2,
                           **waitress_settings(cctx.config, connection_limit=10))
    RequestDeadline.attach(server, 30)  # as `cloud-agent serve` does
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        far = 5 * 1024 * 1024
        for path, envelope in (("/v1/group", {"data": [], "msg": "request body over 1048576 bytes",
                                              "success": False}),
                               ("/v1/user/create", {"message": "request body over 1048576 bytes",
                                                    "success": False, "version": "1"})):
            request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"X-Auth-Token: {alice.token}\r\nContent-Length: {far}\r\n\r\n").encode()
            status, headers, body = _raw(server.effective_port, request)
            assert status == 413 and headers["content-type"] == "application/json", (status, headers, body)
            assert json.loads(body) == envelope and headers.get("x-request-id")
    finally:
        server.task_dispatcher.shutdown()
        server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map, ignore_all=True))
        thread.join(timeout=10)


# -- 5. GET / -------------------------------------------------------------------------------------
def test_the_root_sends_a_browser_to_the_portal_where_it_is_served(cctx):
    from api.app import create_app

    with_portal = testing.TestClient(create_app(cctx, interfaces=("controller", "user", "portal")))
    r = with_portal.simulate_get("/")
    assert r.status_code == 303 and r.headers["location"] == "/portal/"
    without = testing.TestClient(create_app(cctx, interfaces=("controller", "user")))
    r = without.simulate_get("/")
    assert (r.status_code, r.json) == (404, {"data": [], "msg": "no such resource: /", "success": False})


def test_an_unknown_image_an_admin_named_is_echoed_cut_short(cctx, catalog):
    from controller.errors import NotFound
    from controller.lookups import image_named

    with pytest.raises(NotFound) as refusal:
        image_named(cctx, "n" * 500)
    assert refusal.value.message == f"server-image {'n' * 64}… not found (no image has that id or name)"
