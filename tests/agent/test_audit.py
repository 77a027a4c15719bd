"""The audit trail: API calls and agent commands leave rows; `cloud-agent audit` lists and filters
them; no password, API secret or token reaches the audit, the database or the logs.

The API is the real `cloud-agent serve` on a sandbox, its log captured to a file.
"""

import getpass
import json
import re
import sqlite3
from datetime import datetime, timezone

import pytest

from tests.agent.test_agent_controller import (
    ADMIN_EMAIL,
    ADMIN_PASSWORD,
    BOB_EMAIL,
    USER_PASSWORD,
    Sandbox,
    copy_sandbox,
    sandbox,
    sandbox_template,
)
from tests.fixtures.server import Server

AGENT_ACTOR = f"cloud-agent:{getpass.getuser()}"
CAROL_PASSWORD = "Carol-first-2026"
CAROL_NEW_PASSWORD = "Carol-second-2026"
ROOT2_PASSWORD = "Second-admin-2026"
WRONG_PASSWORD = "Wrong-guess-2026"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def token(server, body: dict) -> tuple[dict, str]:
    status, reply = server.call("POST", "/v1/auth/token", body)
    assert status == 200, reply
    data = reply["data"]
    return {"X-Auth-Token": data["token"], "X-Auth-Cloudauth-Id": data["userid"]}, data["token"]


def audit(sandbox, *args: str) -> list[dict]:
    proc = sandbox.run("--json", "audit", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["entries"]


def rows_since(sandbox, first_id: int) -> list[tuple]:
    return [(e["actor"], e["action"], e["target"], e["result"]) for e in audit(sandbox) if e["id"] > first_id]


def last_id(sandbox) -> int:
    return max((e["id"] for e in audit(sandbox)), default=0)


@pytest.fixture(scope="module")
def session(sandbox_template, tmp_path_factory):
    """A run of API calls and agent commands, successful and failed, on a sandbox of its own
    (read by several tests); what it used and produced."""
    tmp_path = tmp_path_factory.mktemp("audited")
    sandbox = copy_sandbox(sandbox_template, tmp_path)
    admin_id = sandbox.admin["userid"]
    began, first = utc_now(), last_id(sandbox)
    server = Server(sandbox, tmp_path / "serve.log")
    secrets = [ADMIN_PASSWORD, sandbox.admin["api_secret"], USER_PASSWORD, CAROL_PASSWORD, CAROL_NEW_PASSWORD,
               ROOT2_PASSWORD, WRONG_PASSWORD]
    try:
        admin, t1 = token(server, {"api_key": sandbox.admin["api_key"], "api_secret": sandbox.admin["api_secret"]})
        _, t2 = token(server, {"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
        assert server.call("POST", "/v1/auth/token", {"email": ADMIN_EMAIL, "password": WRONG_PASSWORD})[0] == 401
        status, reply = server.call("POST", "/v1/user/create", {"email": "carol@example.org",
                                                                "password": CAROL_PASSWORD}, admin)
        assert status == 200, reply
        carol_id = reply["data"]["userid"]
        assert server.call("POST", "/v1/user/create", {"email": "carol@example.org", "password": CAROL_PASSWORD},
                           admin)[0] == 409
        status, reply = server.call("GET", f"/v1/user/view_api_secret/{carol_id}", headers=admin)
        assert status == 200
        carol_secret = reply["data"]["api_secret"]
        carol, t3 = token(server, {"api_key": sandbox.rows("SELECT api_key FROM users WHERE id = ?",
                                                           (carol_id,))[0]["api_key"], "api_secret": carol_secret})
        assert server.call("POST", "/v1/user/create", {"email": "dave@example.org", "password": CAROL_PASSWORD},
                           carol)[0] == 403
        assert server.call("POST", "/v1/user/create", {"email": "eve@example.org", "password": CAROL_PASSWORD},
                           {"X-Auth-Token": "forged", "X-Auth-Cloudauth-Id": admin_id})[0] == 401
        assert server.call("POST", f"/v1/user/set_password/{carol_id}", {"password": CAROL_NEW_PASSWORD},
                           admin)[0] == 200
        status, reply = server.call("POST", f"/v1/user/reset_api_secret/{carol_id}", {}, admin)
        assert status == 200
        carol_new_secret = reply["data"]["api_secret"]
        # Reads leave no row.
        assert server.call("GET", "/v1/user/list", headers=admin)[0] == 200
        assert server.call("POST", "/v1/user/search", {"email": "carol@example.org"}, admin)[0] == 200
        assert server.call("GET", "/v1/server-image", headers=admin)[0] == 200
        # 409: the admin has no system account yet.
        assert server.call("POST", "/v1/storage-volume", {"volume-size": 1, "volume-type": {"visibility": "cluster"}},
                           admin)[0] == 409
    finally:
        log = server.stop()
    agent_output = ""
    for args, code in ((["account", "enable", "carol@example.org", "--username", "carol"], 0),
                       (["account", "enable", "nobody@example.org", "--username", "nobody"], 1),
                       (["user", "create-superuser", "--email", "root2@example.org", "--password", ROOT2_PASSWORD], 0),
                       (["check"], 0)):
        proc = sandbox.run(*args)
        assert proc.returncode == code, proc.stderr
        agent_output += proc.stderr
    secrets += [carol_secret, carol_new_secret, t1, t2, t3]
    return {"sandbox": sandbox, "began": began, "ended": utc_now(), "first": first, "admin_id": admin_id,
            "carol_id": carol_id, "log": log + agent_output, "secrets": secrets}


def test_api_calls_and_agent_commands_leave_one_row_each(session):
    sandbox = session["sandbox"]
    admin_id, carol_id = session["admin_id"], session["carol_id"]
    assert rows_since(sandbox, session["first"]) == [
        ("anonymous", "POST /v1/auth/token", admin_id, "200"),
        ("anonymous", "POST /v1/auth/token", admin_id, "200"),
        (admin_id, "POST /v1/user/create", carol_id, "200"),
        (admin_id, "POST /v1/user/create", "", "409"),
        (admin_id, "GET /v1/user/view_api_secret/{userid}", carol_id, "200"),
        ("anonymous", "POST /v1/auth/token", carol_id, "200"),
        (carol_id, "POST /v1/user/create", "", "403"),
        (admin_id, "POST /v1/user/set_password/{userid}", carol_id, "200"),
        (admin_id, "POST /v1/user/reset_api_secret/{userid}", carol_id, "200"),
        (admin_id, "POST /v1/storage-volume", "", "409"),
        # The anonymous failures (a wrong password, a forged token) are counted, and the
        # count is written when the server stops.
        ("anonymous", "anonymous failed requests", "", "2"),
        # An agent row names the user it acted on by id; the email typed is in the detail.
        (AGENT_ACTOR, "cloud-agent account enable", carol_id, "ok"),
        (AGENT_ACTOR, "cloud-agent account enable", "nobody@example.org",
         "error: no user with email nobody@example.org"),
        (AGENT_ACTOR, "cloud-agent user create-superuser", "root2@example.org", "ok"),
    ]
    for entry in audit(sandbox):
        if entry["id"] > session["first"]:
            assert RFC3339.match(entry["at_utc"]) and session["began"] <= entry["at_utc"] <= session["ended"]
    [counted] = [e for e in audit(sandbox) if e["action"] == "anonymous failed requests"]
    assert re.fullmatch(r"since \S+Z: POST /v1/auth/token 401 x1, POST /v1/user/create 401 x1", counted["detail"])
    enable = [e for e in audit(sandbox) if e["action"] == "cloud-agent account enable"]
    assert enable[0]["detail"] == "email=carol@example.org username=carol"


def test_no_secret_reaches_the_database_or_the_logs(session):
    sandbox = session["sandbox"]
    assert "serving on http://127.0.0.1:" in session["log"]
    entries = json.dumps(audit(sandbox))
    stored = b"".join(p.read_bytes() for p in sandbox.root.iterdir()
                      if p.name.startswith("controller.db"))
    assert len(stored) > 10_000
    for secret in session["secrets"]:
        assert len(secret) >= 14
        assert secret not in session["log"], "a secret is in the log"
        assert secret not in entries, "a secret is in the audit"
        assert secret.encode() not in stored, "a secret is in the database files in plaintext"
    # The agent keeps its arguments in the detail, but never the password.
    [row] = [e for e in audit(sandbox) if e["target"] == "root2@example.org"]
    assert row["detail"] == "name="


def test_audit_filters_by_user(session):
    sandbox = session["sandbox"]
    carol_rows = audit(sandbox, "--user", "carol@example.org")
    assert [(e["action"], e["result"]) for e in carol_rows] == [("POST /v1/user/create", "403")]
    assert audit(sandbox, "--user", session["carol_id"]) == carol_rows
    admin_rows = audit(sandbox, "--user", ADMIN_EMAIL)
    assert {e["actor"] for e in admin_rows} == {session["admin_id"]} and len(admin_rows) == 6
    agent_rows = audit(sandbox, "--user", AGENT_ACTOR)
    # Including the template's create-superuser of the admin.
    assert [e["target"] for e in agent_rows] == [ADMIN_EMAIL, session["carol_id"], "nobody@example.org",
                                                 "root2@example.org"]
    assert audit(sandbox, "--user", "cloud-agent:nobody") == []
    proc = sandbox.run("audit", "--user", "nobody@example.org")
    assert proc.returncode == 1 and proc.stderr == "error: no user with email nobody@example.org\n"


def _old_row(sandbox, at: str) -> None:
    conn = sqlite3.connect(sandbox.db_path)
    with conn:
        conn.execute("INSERT INTO audit (at_utc, actor, action, target, result, detail) "
                     "VALUES (?, 'old-actor', 'POST /v1/user/create', '', '200', '')", (at,))
    conn.close()


def test_audit_filters_by_time(sandbox):
    _old_row(sandbox, "2020-06-01T12:00:00Z")
    sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "1", "--vcpu", "1")
    everything = audit(sandbox)
    assert "old-actor" in {e["actor"] for e in everything}
    recent = [e for e in everything if e["actor"] != "old-actor"]
    assert audit(sandbox, "--since", "1h") == recent
    assert audit(sandbox, "--since", "2020-06-01T12:00:00Z") == everything
    assert audit(sandbox, "--since", "2020-06-01T12:00:01Z") == recent
    # Another offset means the same instant.
    assert audit(sandbox, "--since", "2020-06-01T14:00:00+02:00") == everything
    assert audit(sandbox, "--since", "2999-01-01T00:00:00Z") == []
    assert [e["actor"] for e in audit(sandbox, "--since", "2d", "--user", "old-actor")] == []
    proc = sandbox.run("audit", "--since", "yesterday")
    assert proc.returncode == 1 and proc.stderr.startswith("error: --since wants a time"), proc.stderr


@pytest.mark.parametrize("value", ["\u00b9d", "\u0661h", "\uff11m", "1" * 5000 + "d", "99999999999d", "-1d",
                                   "0001-01-01T00:00:00+14:00"])
def test_audit_refuses_spans_that_are_not_ascii_or_leave_the_calendar(sandbox, value):
    # Issue 16, finding 14: str.isdigit() took "\u00b9" (int() then failed) and a span past
    # the year 1 overflowed: a traceback, not an error line.
    for args in (["audit", "--since", value], ["audit", "--prune", "--before", value]):
        proc = sandbox.run(*args)
        option = args[-2]
        assert proc.returncode == 1 and proc.stderr.startswith(f"error: {option} wants a time"), proc.stderr


def test_audit_human_output(sandbox):
    proc = sandbox.run("audit")
    assert proc.returncode == 0
    [line] = proc.stdout.splitlines()
    assert line.endswith(f" {AGENT_ACTOR} cloud-agent user create-superuser {ADMIN_EMAIL} -> ok (name=)")


def test_agent_rows_name_what_a_command_created(sandbox):
    first = last_id(sandbox)
    image = sandbox.ok("image", "add", "--name", "Debian", "--os-name", "debian", "--os-major", "12",
                       "--os-minor", "7", "--min-disk", "1", "--min-ram", "256")
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "1", "--vcpu", "1")
    sandbox.ok("image", "deactivate", image["id"])
    sandbox.error("flavor", "add", "--name", "small", "--memory", "512", "--disk", "1", "--vcpu", "1")
    assert rows_since(sandbox, first) == [
        (AGENT_ACTOR, "cloud-agent image add", image["id"], "ok"),
        (AGENT_ACTOR, "cloud-agent flavor add", flavor["id"], "ok"),
        (AGENT_ACTOR, "cloud-agent image deactivate", image["id"], "ok"),
        (AGENT_ACTOR, "cloud-agent flavor add", "", "error: a flavor named 'small' exists"),
    ]


def test_read_only_agent_commands_leave_no_row(sandbox, tmp_path):
    first = last_id(sandbox)
    for args in (["check"], ["audit"], ["backup", str(tmp_path / "b.db")], ["reconcile"]):
        assert sandbox.run(*args).returncode == 0
    assert rows_since(sandbox, first) == []


def test_reconcile_fix_leaves_a_row_even_when_drift_remains(sandbox):
    sandbox.ok("account", "enable", BOB_EMAIL, "--username", "bob")
    first = last_id(sandbox)
    # A uid changed behind the controller's back is drift reconcile leaves for the admin.
    passwd = sandbox.root / "sysroot" / "etc" / "passwd"
    uid = sandbox.entries("passwd")["bob"][2]
    passwd.write_text(passwd.read_text().replace(f"bob:x:{uid}:", "bob:x:31999:"))
    proc = sandbox.run("--json", "reconcile", "--fix")
    assert proc.returncode == 1
    assert [d["kind"] for d in json.loads(proc.stdout)["drift"]] == ["account-uid"]
    assert rows_since(sandbox, first) == [(AGENT_ACTOR, "cloud-agent reconcile", "", "exit 1")]
    assert audit(sandbox)[-1]["detail"] == "fix=True"
