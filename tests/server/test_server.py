"""The real server: `cloud-agent serve` on waitress over loopback HTTP, driven as the README does."""

import configparser
from pathlib import Path

import pytest

from tests.fixtures.agent import agent_ok
from tests.fixtures.server import Http, start_server, stop_server

ALICE_PASSWORD = "Alice-pass-2026"


@pytest.fixture
def sandbox(tmp_path):
    """A sandbox config written by `cloud-agent init --sandbox` and its first superuser."""
    config = tmp_path / "controller.ini"
    assert agent_ok(config, "init", "--sandbox", str(tmp_path / "state")) == {
        "config": str(config.resolve())
    }
    admin = agent_ok(config, "user", "create-superuser",
                     "--email", "admin@example.org", "--password", "Admin-pass-2026")
    return config, admin


def readme_walk_through(http: Http, admin: dict) -> None:
    # A token from the admin's API key and secret.
    status, _, body = http.call("POST", "/v1/auth/token",
                                {"api_key": admin["api_key"], "api_secret": admin["api_secret"]})
    assert status == 200, body
    assert body["success"] is True and body["version"] == "1" and body["data"]["userid"] == admin["userid"]
    auth = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}

    # A managed user owned by the admin.
    status, _, body = http.call("POST", "/v1/user/create", {
        "email": "alice@example.org", "password": ALICE_PASSWORD, "owner_userid": admin["userid"],
    }, headers=auth)
    assert status == 200, body
    alice_id = body["data"]["userid"]

    # Everyone the admin may see.
    status, _, body = http.call("GET", "/v1/user/list", headers=auth)
    assert status == 200, body
    assert body["data"]["total"] == 2 == len(body["data"]["users"])
    by_email = {u["email"]: u for u in body["data"]["users"]}
    assert by_email["alice@example.org"]["id"] == alice_id
    assert by_email["alice@example.org"]["owner_userid"] == admin["userid"]
    assert by_email["admin@example.org"]["num_owned_accounts"] == 1
    assert by_email["admin@example.org"]["roles"] == ["superuser"]

    # alice logs in with her password and sees herself only, without superuser fields.
    status, _, body = http.call("POST", "/v1/auth/token", {"email": "alice@example.org", "password": ALICE_PASSWORD})
    assert status == 200, body
    alice = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": alice_id}
    status, _, body = http.call("POST", "/v1/user/list", {}, headers=alice)
    assert status == 200
    assert [u["email"] for u in body["data"]["users"]] == ["alice@example.org"]
    assert "api_key" not in body["data"]["users"][0]

    # Errors over the wire keep the envelope and the right status.
    status, _, body = http.call("GET", "/v1/user/list")
    assert (status, body["success"]) == (401, False)
    status, headers, body = http.call("GET", "/v1/user/create", headers=auth)
    assert status == 405 and "POST" in headers["Allow"] and body["success"] is False
    status, _, body = http.call("POST", "/v1/user/list", b"x" * (1024 * 1024 + 1), headers=auth)
    assert status == 413 and body == {"message": "request body over 1048576 bytes", "success": False, "version": "1"}
    status, _, body = http.call("POST", "/v1/user/create", b"{", headers=auth)
    assert status == 400 and body["success"] is False

    status, _, doc = http.call("GET", "/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    assert "/v1/user/create" in doc["paths"]


def set_interfaces(config: Path, interfaces: str) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    parser["server"]["interfaces"] = interfaces
    with open(config, "w") as f:
        parser.write(f)


def test_user_interface_alone_over_http(sandbox, tmp_path):
    """A deployment may run the user interface as its own service."""
    config, admin = sandbox
    set_interfaces(config, "user")
    proc, http = start_server(config, tmp_path / "serve.log")
    try:
        readme_walk_through(http, admin)
        # Only the user interface is served.
        status, _, _ = http.call("GET", "/v1/server-flavor", headers={"X-Auth-Token": "x"})
        assert status == 404
    finally:
        code = stop_server(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()
    assert "serving on http://127.0.0.1:" in (tmp_path / "serve.log").read_text()


def test_sandbox_server_over_http(sandbox, tmp_path):
    """The sandbox config as `init --sandbox` writes it: both interfaces on one server."""
    config, admin = sandbox
    proc, http = start_server(config, tmp_path / "serve.log")
    try:
        readme_walk_through(http, admin)
        status, _, token = http.call("POST", "/v1/auth/token",
                                     {"api_key": admin["api_key"], "api_secret": admin["api_secret"]})
        auth = {"X-Auth-Token": token["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}
        status, _, body = http.call("GET", "/v1/server-flavor", headers=auth)
        assert status == 200 and body == {"data": [], "msg": "", "success": True}
    finally:
        code = stop_server(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()
