"""What a new user of `cloud` trips on (issue 29): image names by the service's one rule,
users named the same way in every command, tables that show names, and text from other
people (names, guest consoles) that cannot drive the terminal. The real `cloud` against a
real `cloud-agent serve` on the sandbox profile (tests/client/test_cloud_command.py's
service), except the console's bytes, which a guest writes: a stand-in service answers
those, since no guest runs in the sandbox."""

import json
import re
import signal
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pexpect
import pytest

from tests.client.test_cloud_command import (  # noqa: F401 - fixtures
    INSTANCE_KEYS, PASSWORD, admin, alice, bob, carol, login, svc)
from tests.fixtures.agent import agent_ok as agent
from tests.fixtures.agent import run_agent
from tests.fixtures.cloud import CLOUD, Cloud

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

OSC52 = "\x1b]52;c;aGk=\x07"  # sets the terminal's clipboard
IMAGE = ("--os-name", "debian", "--os-major", "12", "--min-disk", "1", "--min-ram", "256")


def test_an_image_name_picks_the_one_active_image_in_cloud_too(svc, bob):
    old = agent(svc.config, "image", "add", "--name", "Trixie", *IMAGE, "--os-minor", "1")
    refused = run_agent("--config", str(svc.config), "image", "add", "--name", "Trixie", *IMAGE, "--os-minor", "2")
    assert refused.returncode == 1 and "an active image is already named 'Trixie'" in refused.stderr
    agent(svc.config, "image", "deactivate", old["id"])
    new = agent(svc.config, "image", "add", "--name", "Trixie", *IMAGE, "--os-minor", "2")
    # The README's own `--image NAME` keeps working: the active image wins over its old namesake.
    assert bob.ok("--json", "image", "show", "Trixie")["id"] == new["id"]
    made = bob.ok("--json", "server", "create", "--image", "Trixie", "--flavor", "small")
    try:
        assert made["server-image"] == new["id"]
    finally:
        svc.api("bob", "DELETE", f"/v1/server-instance/{made['id']}")
    # Inactive namesakes only: ambiguous, each told apart by its OS version and state.
    msg = bob.error("image", "show", "Dup")
    assert msg.startswith("image name 'Dup' is ambiguous, use an id: ") and "(debian 12.7, inactive)" in msg


def test_users_are_named_by_id_email_or_system_username_in_every_command(svc, alice, admin, tmp_path):
    dave = svc.add_user("dave", by="alice")
    # Its display name differs from its system username (dave).
    assert alice.ok("--json", "user", "update", "dave@example.org", "--new-name", "Dave Jones")["name"] == "Dave Jones"
    assert alice.ok("--json", "limits", "--user", "dave")["cloudauth-id"] == dave["id"]
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--user", "dave")
    try:
        dave_uuid = svc.api("dave", "GET", f"/v1/user/view/{dave['id']}").json()["data"]["user"][
            "system_accounts"][0]["uuid"]
        assert dave_uuid in made["users"]
        assert dave_uuid not in alice.ok("--json", "server", "users", "remove", made["hostname"], "dave")["users"]
        assert dave_uuid in alice.ok("--json", "server", "users", "add", made["hostname"], "dave")["users"]
        dave_cloud = login(svc, tmp_path, "dave")
        theirs = dave_cloud.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
        try:
            for who in ("dave", "dave@example.org", dave["id"]):
                listed = admin.ok("--json", "server", "list", "--owner", who)
                assert [s["id"] for s in listed] == [theirs["id"]], who
        finally:
            svc.api("dave", "DELETE", f"/v1/server-instance/{theirs['id']}")
        # A name refused by the ownership rule says the rule.
        msg = alice.error("server", "users", "add", made["hostname"], "carol")
        assert msg.endswith("you may name only yourself and the users you own (that hold no role you lack); "
                            "a superuser may name anyone")
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{made['id']}")


def test_tables_show_names_where_the_caller_knows_them(svc, alice):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    try:
        rows = alice.ok("server", "list").splitlines()
        assert rows[0].split()[:6] == ["ID", "HOSTNAME", "STATUS", "OWNER", "IMAGE", "FLAVOR"]
        mine = next(r for r in rows if made["id"] in r)
        assert "alice@example.org  Debian 12  small" in mine
        shown = alice.ok("server", "show", made["hostname"])
        assert "owner:      alice@example.org" in shown and "image:      Debian 12" in shown
        assert "flavor:     small" in shown
        actions = alice.ok("server", "actions", made["hostname"]).splitlines()
        assert actions[0].split()[3] == "REQUESTER" and actions[1].split()[3] == "alice@example.org"
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{made['id']}")


def _field(text: str, key: str) -> str:
    """The value of `key:` in `name: value` lines."""
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key + ":"))


def _column(table: str, header: str, row_with: str) -> str:
    """The cell under `header` in the row holding `row_with` (columns are aligned to the header)."""
    head, *rows = table.splitlines()
    row = next(r for r in rows if row_with in r)
    starts = {m.group(): m.start() for m in re.finditer(r"\S+", head)}
    after = [at for at in starts.values() if at > starts[header]]
    return row[starts[header]:min(after) if after else None].strip()


def test_owners_of_volumes_groups_and_users_are_shown_by_email(svc, alice, bob):
    bob_id, alice_id = svc.users["bob"]["id"], svc.users["alice"]["id"]
    assert _field(bob.ok("volume", "show"), "owner") == "bob@example.org"
    assert bob.ok("--json", "volume", "show")["cloudauth-id"] == bob_id  # --json keeps the id
    bobs_volume = bob.ok("--json", "volume", "show")["volume-id"]
    assert _column(alice.ok("volume", "list"), "OWNER", bobs_volume) == "bob@example.org"  # alice owns bob
    made = alice.run("group", "create", "ownlab", "--member", "bob")
    assert made.returncode == 0, made.stderr
    try:
        assert _field(made.stdout, "owner") == "alice@example.org"
        assert _field(alice.ok("group", "show", "ownlab"), "owner") == "alice@example.org"
        assert _field(alice.ok("group", "add", "ownlab", "alice"), "owner") == "alice@example.org"
        assert _column(alice.ok("group", "list"), "OWNER", "ownlab") == "alice@example.org"
        assert alice.ok("--json", "group", "show", "ownlab")["cloudauth-id"] == alice_id
    finally:
        gid = alice.ok("--json", "group", "show", "ownlab")["group-id"]
        svc.api("alice", "DELETE", f"/v1/group/{gid}")
    created = alice.run("user", "create", "--email", "fay@example.org", stdin=PASSWORD + "\n")
    try:
        assert created.returncode == 0, created.stderr
        assert _field(created.stdout, "owner") == "alice@example.org"
        assert _field(alice.ok("user", "show", "bob"), "owner") == "alice@example.org"
        assert _field(alice.ok("user", "update", "bob", "--new-name", "bob"), "owner") == "alice@example.org"
        assert _column(alice.ok("user", "list"), "OWNER", "fay@example.org") == "alice@example.org"
    finally:
        fay = svc.api("admin", "POST", "/v1/user/search", json={"email": "fay@example.org"}).json()["data"]["users"]
        if fay:
            assert svc.api("admin", "POST", "/v1/user/delete/fay@example.org").status_code == 200


def test_a_superusers_server_list_shows_owner_and_host_and_nobody_else_sees_a_host(svc, admin, alice):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    try:
        [on] = [s["host"] for s in agent(svc.config, "server", "list")["servers"] if s["id"] == made["id"]]
        table = admin.ok("server", "list")
        assert table.splitlines()[0].split() == ["ID", "HOSTNAME", "STATUS", "OWNER", "IMAGE", "FLAVOR", "HOST",
                                                 "PRIVATE-IP", "PUBLIC-IP", "CREATED", "EXPIRES"]
        assert _column(table, "OWNER", made["id"]) == "alice@example.org"
        assert _column(table, "HOST", made["id"]) == on
        assert _field(admin.ok("server", "show", made["hostname"]), "host") == on
        # --json stays the API's server objects, a superuser's too.
        assert all(set(s) <= INSTANCE_KEYS | {"public-ip"} for s in admin.ok("--json", "server", "list"))
        # A regular user: no HOST column, no host line, and the service refuses the hosts.
        mine = alice.ok("server", "list")
        assert "HOST" not in mine.splitlines()[0].split() and _column(mine, "OWNER", made["id"]) == "alice@example.org"
        assert "host:" not in alice.ok("server", "show", made["hostname"])
        refused = svc.api("alice", "GET", "/v1/server-host")
        assert refused.status_code == 403 and on not in refused.text
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{made['id']}")


def test_logins_line_names_the_user_by_email_and_system_username(svc, tmp_path):
    alice_id = svc.users["alice"]["id"]
    line = Cloud(tmp_path / "a").ok("login", "--url", svc.base, "--email", "alice@example.org",
                                    stdin=PASSWORD + "\n")
    assert line.startswith(f"logged in to {svc.base} as alice@example.org (alice, id {alice_id}); token until ")
    doc = Cloud(tmp_path / "b").ok("--json", "login", "--url", svc.base, "--email", "alice@example.org",
                                   stdin=PASSWORD + "\n")
    assert (doc["userid"], doc["email"], doc["username"]) == (alice_id, "alice@example.org", "alice")
    # No system account: the email and the id.
    nobody = svc.add_user("nobody", account=False, volume=False)
    line = Cloud(tmp_path / "n").ok("login", "--url", svc.base, "--email", "nobody@example.org",
                                    stdin=PASSWORD + "\n")
    assert line.startswith(f"logged in to {svc.base} as nobody@example.org (id {nobody['id']}); token until ")


def test_group_names_complete_from_the_service(svc, alice):
    made = alice.ok("--json", "group", "create", "complab", "--member", "alice")
    try:
        for words, cword in (("cloud group show comp", "3"), ("cloud group add comp", "3")):
            env = {"_CLOUD_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": cword}
            proc = alice.run(env=env)
            assert proc.returncode == 0 and proc.stdout.split() == ["plain,complab"], (words, proc.stdout)
        # A name `group create` makes is new: nothing to complete.
        env = {"_CLOUD_COMPLETE": "bash_complete", "COMP_WORDS": "cloud group create comp", "COMP_CWORD": "3"}
        assert alice.run(env=env).stdout.split() == []
    finally:
        svc.api("alice", "DELETE", f"/v1/group/{made['group-id']}")


def test_a_user_the_admin_creates_with_cloud_is_owned_by_the_admin(svc, admin):
    # `cloud user create` makes "a user you own", a superuser's too (the service alone leaves
    # a superuser's new user without an owner).
    made = admin.ok("--json", "user", "create", "--email", "owned@example.org", stdin=PASSWORD + "\n")
    admin_id = svc.users["admin"]["id"]
    assert made["owner_userid"] == admin_id
    seen = svc.api("admin", "GET", f"/v1/user/view/{made['id']}").json()["data"]["user"]
    assert seen["owner_userid"] == admin_id


def test_names_with_control_characters_are_refused_by_the_service(svc, tmp_path):
    svc.add_user("erin2", volume=False)
    r = svc.api("erin2", "POST", "/v1/storage-volume", json={
        "volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": "home" + OSC52})
    assert r.status_code == 400 and r.json()["msg"] == "volume-name must not contain control characters"
    assert svc.api("erin2", "GET", "/v1/storage-volume").json()["data"] == []
    r = svc.api("erin2", "POST", f"/v1/user/update/{svc.users['erin2']['id']}", json={"name": "E\u202eevil"})
    assert r.status_code == 400 and "name must not contain control characters" in r.text
    assert svc.api("erin2", "GET", f"/v1/user/view/{svc.users['erin2']['id']}").json()["data"]["user"]["name"] == "erin2"


def test_a_name_stored_with_escapes_is_shown_escaped_and_json_keeps_it(svc, bob):
    made = agent(svc.config, "image", "add", "--name", "plain", *IMAGE, "--os-minor", "1", "--inactive")
    with sqlite3.connect(svc.database) as db:  # stored before the rule, or by hand
        db.execute("UPDATE images SET name = ? WHERE id = ?", ("evil" + OSC52, made["id"]))
    table = bob.ok("image", "list")
    assert "\x1b" not in table and "\x07" not in table and "evil\\x1b]52;c;aGk=\\x07" in table
    assert "\x1b" not in bob.ok("image", "show", made["id"])
    assert next(i for i in bob.ok("--json", "image", "list") if i["id"] == made["id"])["name"] == "evil" + OSC52


# -- the console: a guest's bytes ------------------------------------------------------------------
SERVER_ID = "0b8e7c9a-1d2f-4e3a-9b5c-6d7e8f901234"
USER_ID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
CONSOLE = "boot ok\r\n" + OSC52 + "\x1b[2J\u202etxt.exe\r\nlogin: \tdone\n"


class _Guest(BaseHTTPRequestHandler):
    """Answers what `cloud server console` asks: a token, the server list, the console."""

    def _send(self, status: int, data) -> None:
        body = json.dumps({"success": True, "data": data}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(200, {"token": "t", "userid": USER_ID, "expires_at": "2099-01-01T00:00:00Z"})

    def do_GET(self):  # noqa: N802
        if self.path.startswith(f"/v1/server-instance/{SERVER_ID}/console"):
            self._send(200, [{"console": CONSOLE, "ready": True}])
        else:
            self._send(200, [{"id": SERVER_ID, "cloudauth-id": USER_ID, "users": [], "server-image": "i",
                              "server-flavor": "1", "creation-date": "2026-01-01T00:00:00Z", "status": "running",
                              "hostname": "vm-0b8e7c9a"}])

    def do_PUT(self):  # noqa: N802 - a power task: the server as it is (running, no address)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def guest_console(tmp_path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Guest)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Cloud(tmp_path / "u", env={"CC_URL": f"http://127.0.0.1:{httpd.server_port}",
                                         "CC_EMAIL": "u@example.org", "CC_PASSWORD": PASSWORD})
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_console_shows_control_sequences_escaped_unless_raw(guest_console):
    shown = guest_console.ok("server", "console", "vm-0b8e7c9a")
    assert shown == ("boot ok\n\\x1b]52;c;aGk=\\x07\\x1b[2J\\u202etxt.exe\nlogin: \tdone\n-- ready: yes\n")
    raw = guest_console.ok("server", "console", "vm-0b8e7c9a", "--raw")
    # (text mode reads \r\n as \n; the escape sequences themselves come through untouched)
    assert raw == CONSOLE.replace("\r\n", "\n").rstrip("\n") + "\n-- ready: yes\n"
    assert guest_console.ok("--json", "server", "console", "vm-0b8e7c9a") == {"console": CONSOLE, "ready": True}


def test_server_names_complete_from_the_service(guest_console):
    env = {"_CLOUD_COMPLETE": "bash_complete", "COMP_WORDS": "cloud server show vm-", "COMP_CWORD": "3"}
    words = guest_console.run(env=env)
    assert words.returncode == 0 and words.stdout.split() == ["plain,vm-0b8e7c9a"]


def test_output_formats_print_the_apis_document(guest_console):
    server = guest_console.ok("--json", "server", "list")[0]
    assert guest_console.ok("server", "list", "-f", "value", "-c", "id", "-c", "status") == f"{SERVER_ID} running\n"
    csv_text = guest_console.ok("server", "list", "-f", "csv", "-c", "id", "-c", "users").splitlines()
    assert csv_text == ["id,users", f"{SERVER_ID},[]"]
    yaml_text = guest_console.ok("server", "list", "-f", "yaml")
    assert yaml_text.startswith(f'- id: "{SERVER_ID}"\n  cloudauth-id: "{USER_ID}"\n  users: []\n')
    assert guest_console.ok("server", "list", "-f", "json") == json.dumps([server], indent=1) + "\n"
    assert guest_console.error("server", "list", "-f", "value", "-c", "nope").startswith("no field 'nope'")


def test_the_sandbox_console_says_guests_do_not_boot_and_wait_stops_at_running(svc, alice):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    try:
        shown = alice.ok("server", "console", made["hostname"])
        assert shown.startswith("cloud-controller sandbox: libvirt's test driver runs no guest")
        started = time.monotonic()
        proc = alice.run("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--wait")
        assert proc.returncode == 0, proc.stderr
        waited = json.loads(proc.stdout)
        try:
            assert waited["status"] == "running" and time.monotonic() - started < 60
            assert "where guests do not boot (libvirt's test driver): stopped waiting at `running`" in proc.stderr
            assert f"created {waited['hostname']} ({waited['id']})" in proc.stderr
        finally:
            svc.api("alice", "DELETE", f"/v1/server-instance/{waited['id']}")
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{made['id']}")


def test_wait_shows_elapsed_time_and_a_timeout_with_json_names_the_server(guest_console):
    proc = guest_console.run("--json", "server", "start", "vm-0b8e7c9a", "--wait", "--timeout", "3")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {
        "error": f"server {SERVER_ID} did not take SSH logins within 3 s (last: running); "
                 "see `cloud server console vm-0b8e7c9a`", "id": SERVER_ID, "status": "running"}
    assert "waiting for vm-0b8e7c9a: running (0 s)" in proc.stderr


def test_ctrl_c_during_wait_says_the_server_keeps_running(guest_console):
    child = pexpect.spawn(str(CLOUD), ["server", "start", "vm-0b8e7c9a", "--wait", "--timeout", "60"],
                          env=guest_console.env, encoding="utf-8", timeout=30)
    child.expect("waiting for vm-0b8e7c9a: running")
    child.kill(signal.SIGINT)
    child.expect("keeps running; `cloud server delete vm-0b8e7c9a` deletes it")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130

