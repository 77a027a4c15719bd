"""The history's pages over HTTP (issue 27, item 5): the API on waitress in this process, on
fake host adapters, read by the client library and by `cloud server actions` (in process),
which follow the answer's Link rel=next."""

import json

import pytest
import requests
from click.testing import CliRunner

from agent.cloud.cli import cli as cloud_cli
from api.app import create_app
from common.client import Client
from controller.audit import history
from tests.api.test_controller_api import ok, people  # noqa: F401
from tests.fixtures.api import give_volume
from tests.fixtures.guest_e2e import served
from tests.instances.test_actions import _write_entries


@pytest.fixture
def service(client, cctx, people, catalog):  # noqa: F811
    """The owner's instance with 2,500 entries after its create, and the API served over HTTP."""
    owner = people["owner"]
    give_volume(client, owner)
    made = ok(client.simulate_post("/v1/server-instance", headers={**owner.headers, "X-Request-Id": "create-1"},
                                   json={"server-image": catalog["public"]["id"],
                                         "server-flavor": catalog["small"]["id"]}), 201)[0]
    _write_entries(cctx, made, 2500, "old")
    with served(create_app(cctx)) as base:
        yield base, made, owner, ["create-1"] + [f"old-{n}" for n in range(2500)]


def _id_of(cctx, request_id: str) -> int:
    """The stored id of an entry: the cursor an answer names is its oldest entry's."""
    [entry] = [e for e in cctx.store.list_instance_actions(_made_id(cctx), visible_to=None)
               if e["request_id"] == request_id]
    return entry["id"]


def _made_id(cctx) -> str:
    [row] = cctx.store.all_instances()
    return row["id"]


def test_a_long_page_is_chunked_over_http_and_names_the_next_one(service, cctx):
    base, made, owner, expected = service
    r = requests.get(f"{base}/v1/server-instance/{made['id']}/actions", headers=owner.headers, stream=True,
                     timeout=30)
    assert r.status_code == 200 and r.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in r.headers
    body = json.loads(b"".join(r.iter_content(chunk_size=None)))
    assert [a["request-id"] for a in body["data"]] == expected[-1000:] and body["msg"] == ""
    assert set(body) == {"data", "msg", "success"}  # the envelope, nothing added
    assert r.links["next"]["url"] == (f"/v1/server-instance/{made['id']}/actions?limit=1000"
                                      f"&before={history.cursor_of(_id_of(cctx, 'old-1500'))}")
    r = requests.get(f"{base}/v1/server-instance/{made['id']}/actions", headers=owner.headers, timeout=30,
                     params={"before": "not-a-cursor!"})
    assert r.status_code == 400 and r.json()["success"] is False and "before must be a cursor" in r.json()["msg"]


def test_the_client_follows_the_pages_and_takes_only_the_cursor(service):
    base, made, owner, expected = service
    client = Client(base, token=owner.token, userid=owner.id)
    page = client.server_actions_page(made["id"], limit=1000)
    assert [a.request_id for a in page.actions] == expected[-1000:] and page.next_cursor
    older = client.server_actions_page(made["id"], limit=1000, before=page.next_cursor)
    assert [a.request_id for a in older.actions] == expected[-2000:-1000]
    assert [a.request_id for a in client.server_actions(made["id"], limit=700, all_pages=True)] == expected
    assert [a.request_id for a in client.server_actions(made["id"], limit=3)] == expected[-3:]


def test_cloud_server_actions_pages_with_limit_marker_and_all(service, tmp_path):
    base, made, owner, expected = service
    env = {"CC_URL": base, "CC_API_KEY": owner.api_key, "CC_API_SECRET": owner.api_secret,
           "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()

    def cloud(*args):
        result = runner.invoke(cloud_cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result

    first = cloud("--json", "server", "actions", made["id"], "--limit", "2")
    assert [a["request-id"] for a in json.loads(first.stdout)] == expected[-2:]  # --json: the API's entries only
    [hint] = [line for line in first.stderr.splitlines() if "--marker" in line]
    marker = hint.split("--marker ")[1].split()[0]
    second = cloud("--json", "server", "actions", made["id"], "--limit", "2", "--marker", marker)
    assert [a["request-id"] for a in json.loads(second.stdout)] == expected[-4:-2]
    every = cloud("--json", "server", "actions", made["id"], "--limit", "1000", "--all")
    assert json.loads(every.stdout) == [a.raw for a in Client(base, token=owner.token, userid=owner.id)
                                        .server_actions(made["id"], all_pages=True)]
    assert [a["request-id"] for a in json.loads(every.stdout)] == expected and "--marker" not in every.stderr
    table = cloud("server", "actions", made["id"], "--limit", "2").stdout.splitlines()
    assert table[0].split()[:3] == ["TIME", "ACTION", "RESULT"] and len(table) == 3
