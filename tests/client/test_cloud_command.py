"""The `cloud` command (issue 18, the user command, docs/client.md) against a real `cloud-agent serve`.

The sandbox profile on waitress (libvirt's test driver: no guest boots), driven
through the installed entry point next to the test's python, as a subprocess,
by a superuser (admin), an owner (alice, with create_user; she owns bob) and
plain users (bob, carol). Each test logs in with its own config folder.
Expected values come from the API itself (plain HTTP) or from what the test made.
"""

import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest
import requests

from controller.config import load_config
from controller.store.write_mark import WriteMark
from tests.fixtures.agent import agent_ok as agent
from tests.fixtures.cloud import Cloud
from tests.fixtures.server import sandbox_with_admin, served

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

PASSWORD = "Alice-pass-2026"
INSTANCE_KEYS = {"id", "cloudauth-id", "users", "server-image", "server-flavor", "creation-date", "status",
                 "hostname", "private-ip", "expires-at", "lease"}


class Service:
    def __init__(self, base: str, config: Path, database: str):
        self.base, self.config, self.database = base, config, database
        self.users: dict[str, dict] = {}

    def token(self, who: str) -> dict:
        u = self.users[who]
        r = requests.post(self.base + "/v1/auth/token", json={"email": u["email"], "password": PASSWORD}, timeout=10)
        assert r.status_code == 200, r.text
        return {"X-Auth-Token": r.json()["data"]["token"], "X-Auth-Cloudauth-Id": u["id"]}

    def api(self, who: str, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, self.base + path, headers=self.token(who), timeout=30, **kw)

    def add_user(self, name: str, *, by: str = "admin", account: bool = True, volume: bool = True) -> dict:
        email = f"{name}@example.org"
        r = self.api(by, "POST", "/v1/user/create", json={"email": email, "password": PASSWORD, "name": name})
        assert r.status_code == 200, r.text
        self.users[name] = {"email": email, "id": r.json()["data"]["userid"]}
        if account:
            agent(self.config, "account", "enable", email, "--username", name)
        if volume:
            r = self.api(name, "POST", "/v1/storage-volume", json={"volume-size": 1,
                                                                   "volume-type": {"visibility": "cluster"}})
            assert r.status_code == 201, r.text
        return self.users[name]


@pytest.fixture(scope="module")
def svc():
    state, config, admin = sandbox_with_admin("cloud-cmd-", PASSWORD)
    try:
        with served(config, state / "serve.log") as http:
            s = Service(http.base, config, load_config(str(config)).database_path)
            s.users["admin"] = {"email": "admin@example.org", "id": admin["userid"], "api_key": admin["api_key"],
                                "api_secret": admin["api_secret"]}
            s.add_user("alice")
            agent(config, "user", "grant", "alice@example.org", "create_user")
            s.add_user("bob", by="alice")
            s.add_user("carol")
            # Names of active images are unique: two namesakes are inactive ones.
            for name, more in (("Debian 12", ()), ("Dup", ("--inactive",)), ("Dup", ("--inactive",))):
                agent(config, "image", "add", "--name", name, "--os-name", "debian", "--os-major", "12",
                      "--os-minor", "7", "--min-disk", "1", "--min-ram", "256", *more)
            agent(config, "flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
            agent(config, "flavor", "add", "--name", "big", "--memory", "1024", "--disk", "2", "--vcpu", "2")
            yield s
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=False)


def login(svc, home: Path, who: str) -> Cloud:
    c = Cloud(home / who)
    c.ok("login", "--url", svc.base, "--email", svc.users[who]["email"], stdin=PASSWORD + "\n")
    return c


@pytest.fixture
def admin(svc, tmp_path):
    c = Cloud(tmp_path / "admin")
    u = svc.users["admin"]
    c.ok("login", "--url", svc.base, "--api-key", u["api_key"], "--keep", stdin=u["api_secret"] + "\n")
    return c


@pytest.fixture
def alice(svc, tmp_path):
    return login(svc, tmp_path, "alice")


@pytest.fixture
def bob(svc, tmp_path):
    return login(svc, tmp_path, "bob")


@pytest.fixture
def carol(svc, tmp_path):
    return login(svc, tmp_path, "carol")


def expire_tokens(svc, who: str) -> None:
    """Make every token of the user expired in the service's database (as time would)."""
    with sqlite3.connect(svc.database) as db:
        db.execute("UPDATE tokens SET expires_at = 0 WHERE user_id = ?", (svc.users[who]["id"],))
    # A write outside the service does not change its write mark: change it as the service's own
    # writes do, so that the service does not answer from a token it remembers (`cloud login`
    # has just used the token).
    WriteMark(svc.database).change()


# -- login, logout, the config file, the environment -----------------------------------
def test_login_keeps_url_and_token_in_a_0600_file_and_logout_forgets(svc, tmp_path):
    c = Cloud(tmp_path / "a")
    doc = c.ok("--json", "login", "--url", svc.base, "--email", "alice@example.org", stdin=PASSWORD + "\n")
    assert doc["userid"] == svc.users["alice"]["id"] and doc["kept_secret"] is False and doc["url"] == svc.base
    assert stat.S_IMODE(c.file.stat().st_mode) == 0o600
    assert stat.S_IMODE(c.file.parent.stat().st_mode) == 0o700
    kept = json.loads(c.file.read_text())
    assert set(kept) == {"url", "userid", "token", "expires_at", "source", "email"}
    assert PASSWORD not in c.file.read_text() and (kept["source"], kept["email"]) == ("password", "alice@example.org")
    assert c.ok("--json", "user", "show")["email"] == "alice@example.org"
    assert c.ok("logout").startswith("logged out")
    assert not c.file.exists()
    assert c.error("server", "list") == "no service URL: run `cloud login --url URL` or set CC_URL"


def test_login_with_a_wrong_password_says_what_the_portal_says(svc, tmp_path):
    from agent.cloud.account_commands import LOGIN_FAILED
    from api.portal.account_pages import LOGIN_FAILED as PORTALS

    assert LOGIN_FAILED == PORTALS == ("Log in failed: wrong email or password, or the account cannot use "
                                       "the cloud.")
    r = requests.post(svc.base + "/v1/auth/token", json={"email": "carol@example.org", "password": "x" * 14},
                      timeout=10)
    assert r.status_code == 401
    c = Cloud(tmp_path / "c")
    for email in ("carol@example.org", "nobody@example.org"):  # nothing tells which part was wrong
        assert c.error("login", "--url", svc.base, "--email", email, stdin="x" * 14 + "\n") == PORTALS
    assert not c.file.exists()
    assert "status" in json.loads(c.run("--json", "login", "--url", svc.base, "--email", "carol@example.org",
                                        stdin="x" * 14 + "\n").stdout)


def test_keep_with_a_password_keeps_a_new_secret_only_when_asked_and_never_the_password(svc, tmp_path):
    # More in tests/client/test_cloud_credentials.py.
    svc.add_user("keeper", account=False, volume=False)
    c = Cloud(tmp_path / "c")
    assert "never a password" in c.error("login", "--url", svc.base, "--email", "keeper@example.org", "--keep",
                                         code=2, stdin=PASSWORD + "\n")
    assert not c.file.exists()
    c.ok("login", "--url", svc.base, "--email", "keeper@example.org", "--keep", "--new-secret",
         stdin=PASSWORD + "\n")
    kept = json.loads(c.file.read_text())
    assert kept["api_key"] and kept["api_secret"] and PASSWORD not in c.file.read_text()
    r = requests.post(svc.base + "/v1/auth/token", json={"api_key": kept["api_key"],
                                                          "api_secret": kept["api_secret"]}, timeout=10)
    assert r.status_code == 200 and r.json()["data"]["userid"] == svc.users["keeper"]["id"]


def test_environment_overrides_the_file_and_writes_nothing(svc, alice, tmp_path):
    carol_id = svc.users["carol"]["id"]
    env = {"CC_URL": svc.base, "CC_EMAIL": "carol@example.org", "CC_PASSWORD": PASSWORD}
    assert alice.ok("--json", "user", "show", env=env)["id"] == carol_id
    assert alice.ok("--json", "user", "show")["id"] == svc.users["alice"]["id"]
    bare = Cloud(tmp_path / "nobody")
    u = svc.users["admin"]
    got = bare.ok("--json", "limits", env={"CC_URL": svc.base, "CC_API_KEY": u["api_key"],
                                           "CC_API_SECRET": u["api_secret"]})
    assert got["cloudauth-id"] == u["id"]
    assert not bare.file.exists()
    assert bare.error("limits", env={"CC_URL": svc.base}) == f"not logged in to {svc.base}: run `cloud login --url {svc.base}`"


def test_an_expired_token_is_renewed_from_the_kept_key_and_secret(svc, admin):
    before = json.loads(admin.file.read_text())
    assert before["api_key"] == svc.users["admin"]["api_key"]
    assert stat.S_IMODE(admin.file.stat().st_mode) == 0o600
    expire_tokens(svc, "admin")  # the service refuses the kept token (401)
    assert admin.ok("--json", "limits")["cloudauth-id"] == svc.users["admin"]["id"]
    after = json.loads(admin.file.read_text())
    assert after["token"] != before["token"] and after["api_secret"] == before["api_secret"]
    assert stat.S_IMODE(admin.file.stat().st_mode) == 0o600
    # A token the file itself says has ended is renewed before the call.
    admin.file.write_text(json.dumps({**after, "expires_at": "2000-01-01T00:00:00Z"}))
    admin.ok("image", "list")
    assert json.loads(admin.file.read_text())["token"] not in (after["token"], before["token"])


def test_without_a_kept_secret_an_expired_token_is_the_apis_401(svc, carol):
    expire_tokens(svc, "carol")
    proc = carol.run("--json", "limits")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["status"] == 401 and proc.stderr.strip() == f"error: {doc['error']}"


# -- images and flavors ------------------------------------------------------------------
def test_image_and_flavor_list_and_show_by_name_or_id(svc, bob):
    api = svc.api("bob", "GET", "/v1/server-image").json()["data"]
    assert bob.ok("--json", "image", "list") == api
    table = bob.ok("image", "list")
    assert table.splitlines()[0].split() == ["ID", "NAME", "OS", "MIN-DISK", "MIN-RAM", "ACTIVE"]
    assert all(i["id"] in table for i in api)
    debian = next(i for i in api if i["name"] == "Debian 12")
    assert bob.ok("--json", "image", "show", "Debian 12") == debian
    assert bob.ok("--json", "image", "show", debian["id"]) == debian
    flavors = svc.api("bob", "GET", "/v1/server-flavor").json()["data"]
    assert bob.ok("--json", "flavor", "list") == flavors
    small = next(f for f in flavors if f["name"] == "small")
    assert bob.ok("--json", "flavor", "show", "small") == small
    assert "vcpu:      1" in bob.ok("flavor", "show", small["id"])


def test_an_ambiguous_or_unknown_name_is_an_error_listing_the_candidates(svc, bob):
    dups = sorted(i["id"] for i in svc.api("bob", "GET", "/v1/server-image").json()["data"] if i["name"] == "Dup")
    msg = bob.error("image", "show", "Dup")
    assert msg.startswith("image name 'Dup' is ambiguous, use an id: ")
    assert all(d in msg for d in dups) and len(dups) == 2
    assert bob.ok("--json", "image", "show", dups[0])["id"] == dups[0]
    assert bob.error("flavor", "show", "huge") == "no flavor named 'huge' that you can see"
    assert bob.error("server", "create", "--image", "Dup", "--flavor", "small").startswith("image name 'Dup'")


# -- volumes -------------------------------------------------------------------------------
def test_volume_create_show_and_delete_asks_or_needs_yes(svc, tmp_path):
    svc.add_user("erin", volume=False)
    erin = login(svc, tmp_path, "erin")
    made = erin.ok("--json", "volume", "create", "--size", "2", "--name", "home")
    assert set(made) == {"volume-id", "cloudauth-id", "volume-size", "volume-type", "creation-date", "volume-name"}
    assert made["volume-size"] == 2 and made["volume-name"] == "home"
    assert made["cloudauth-id"] == svc.users["erin"]["id"]
    assert svc.api("erin", "GET", f"/v1/storage-volume/{made['volume-id']}").json()["data"] == [made]
    assert erin.ok("--json", "volume", "show") == made
    assert f"mount-point: {made['volume-type']['mount-point']}" in erin.ok("volume", "show", made["volume-id"])
    second = svc.api("erin", "POST", "/v1/storage-volume", json={"volume-size": 1,
                                                                 "volume-type": {"visibility": "cluster"}})
    assert erin.error("volume", "create", "--size", "1") == second.json()["msg"]
    assert erin.error("volume", "delete", code=2) == "not on a terminal: add --yes to confirm"
    assert svc.api("erin", "GET", f"/v1/storage-volume/{made['volume-id']}").status_code == 200
    assert erin.ok("--json", "volume", "delete", "--yes") == {"deleted": made["volume-id"]}
    assert svc.api("erin", "GET", f"/v1/storage-volume/{made['volume-id']}").status_code == 404
    assert erin.error("volume", "show") == "you have no volume: `cloud volume create --size GB`"


# -- servers --------------------------------------------------------------------------------
def test_server_lifecycle_by_hostname_and_id_prefix(svc, alice, carol, admin, tmp_path):
    bob_account = svc.api("bob", "GET", f"/v1/user/view/{svc.users['bob']['id']}").json()["data"]["user"]
    bob_uuid = bob_account["system_accounts"][0]["uuid"]
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small", "--user", "bob")
    assert INSTANCE_KEYS <= set(made) and made["cloudauth-id"] == svc.users["alice"]["id"]
    assert bob_uuid in made["users"] and len(made["users"]) == 2
    sid, host = made["id"], made["hostname"]
    try:
        assert svc.api("alice", "GET", f"/v1/server-instance/{sid}").json()["data"][0]["id"] == sid
        listed = alice.ok("--json", "server", "list")
        assert sid in [s["id"] for s in listed] and all(INSTANCE_KEYS <= set(s) for s in listed)
        assert alice.ok("--json", "server", "show", host)["id"] == sid
        assert alice.ok("--json", "server", "show", sid[:8])["id"] == sid
        shown = alice.ok("server", "show", host)
        assert f"hostname:   {host}" in shown and "users:      " in shown and "bob" in shown
        table = alice.ok("server", "list")
        assert table.splitlines()[0].split() == ["ID", "HOSTNAME", "STATUS", "OWNER", "IMAGE", "FLAVOR",
                                                 "PRIVATE-IP", "PUBLIC-IP", "CREATED", "EXPIRES"]
        assert host in table
        # Visibility: a stranger does not see it; the superuser does.
        assert carol.error("server", "show", host) == f"no server named {host!r} that you can see"
        assert sid in [s["id"] for s in admin.ok("--json", "server", "list")]
        assert carol.error("server", "delete", sid) == f"no server named {sid!r} that you can see"

        assert alice.ok("--json", "server", "stop", host)["status"] == "shutoff"
        assert svc.api("alice", "GET", f"/v1/server-instance/{sid}").json()["data"][0]["status"] == "shutoff"
        assert alice.ok("server", "start", host).strip() == f"started {host}: running"
        assert alice.ok("--json", "server", "reboot", host)["status"] == "running"
        assert svc.api("alice", "GET", f"/v1/server-instance/{sid}").json()["data"][0]["status"] == "running"

        assert alice.ok("--json", "server", "users", "remove", host, "bob")["users"] == [
            u for u in made["users"] if u != bob_uuid]
        assert bob_uuid in alice.ok("--json", "server", "users", "add", host, "bob")["users"]
        # replace: the given users, and the owner, whom the service always keeps
        assert sorted(alice.ok("--json", "server", "users", "set", host, "bob")["users"]) == sorted(made["users"])
        assert carol.error("server", "users", "add", host, "carol").startswith("no server named")
        # alice cannot see carol, so cannot name her.
        assert alice.error("server", "users", "add", host, "carol") == (
            "no user named 'carol' that you can see; you may name only yourself and the users you own "
            "(that hold no role you lack); a superuser may name anyone")
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{sid}")
    assert alice.error("server", "show", host) == f"no server named {host!r} that you can see"


def test_server_delete_ssh_and_wait(svc, alice, tmp_path):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    host, ip = made["hostname"], made["private-ip"]
    try:
        # The line ssh would run, its connection bounded; the sandbox runs no guest (a note says so).
        printed = alice.run("--json", "server", "ssh", host, "--print")
        assert json.loads(printed.stdout) == {"argv": ["ssh", "-o", "ConnectTimeout=10", f"alice@{ip}"]}
        assert printed.stderr.strip() == f"note: the sandbox runs no guest: nothing to connect to at {ip}"
        # In the sandbox ssh is never run (a stand-in on PATH would say so): nothing to connect to.
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "ssh").write_text('#!/bin/sh\necho "ssh $*"\n')
        (fake / "ssh").chmod(0o755)
        assert alice.error("server", "ssh", host, "--", "id", "-u", env={"PATH": f"{fake}:{os.environ['PATH']}"}) \
            == f"the sandbox runs no guest: nothing to connect to at {ip}"
        # No guest boots in the sandbox: --wait stops at `running` with a note, long before its bound.
        started = time.monotonic()
        proc = alice.run("server", "start", host, "--wait", "--timeout", "600")
        assert proc.returncode == 0 and proc.stdout.strip() == f"started {host}: running", proc.stderr
        assert f"note: {host} is running on the sandbox, where guests do not boot" in proc.stderr
        assert time.monotonic() - started < 60
    finally:
        gone = alice.ok("--json", "server", "delete", host)
    assert gone == {"deleted": made["id"]}
    assert svc.api("alice", "GET", f"/v1/server-instance/{made['id']}").status_code == 404



def test_server_console_shows_what_the_api_answers(svc, alice, carol):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    host, sid = made["hostname"], made["id"]
    try:
        api = svc.api("alice", "GET", f"/v1/server-instance/{sid}/console").json()["data"][0]
        assert alice.ok("--json", "server", "console", host) == api and set(api) == {"console", "ready"}
        assert len(alice.ok("--json", "server", "console", sid[:8], "--bytes", "1")["console"].encode()) <= 1
        shown = alice.ok("server", "console", host)
        assert shown.rstrip("\n").endswith("-- ready: " + ("yes" if api["ready"] else "no"))
        assert carol.error("server", "console", host) == f"no server named {host!r} that you can see"
    finally:
        svc.api("alice", "DELETE", f"/v1/server-instance/{sid}")

def test_a_refused_create_names_the_limit_and_what_is_in_use(svc, tmp_path):
    svc.add_user("grace")
    grace = login(svc, tmp_path, "grace")
    agent(svc.config, "user", "limits", "grace@example.org", "--instances", "0")
    msg = grace.error("server", "create", "--image", "Debian 12", "--flavor", "small")
    assert msg == ("limit reached: instances (0 per user); in use: instances 0 of 0, vcpus 0 of "
                   f"{grace.ok('--json', 'limits')['vcpus']['limit']}, memory_mb 0 of "
                   f"{grace.ok('--json', 'limits')['memory_mb']['limit']}")
    assert svc.api("grace", "GET", "/v1/server-instance").json()["data"] == []


# -- groups ----------------------------------------------------------------------------------
def test_group_commands(svc, alice, carol):
    made = alice.ok("--json", "group", "create", "lab1", "--member", "alice")
    assert set(made) == {"group-id", "cloudauth-id", "group-name", "group-members"}
    assert made["group-members"] == ["alice"] and made["cloudauth-id"] == svc.users["alice"]["id"]
    gid = made["group-id"]
    try:
        assert svc.api("alice", "GET", f"/v1/group/{gid}").json()["data"] == [made]
        assert gid in [g["group-id"] for g in alice.ok("--json", "group", "list")]
        assert "lab1" in alice.ok("group", "list")
        assert alice.ok("--json", "group", "show", "lab1") == made
        assert sorted(alice.ok("--json", "group", "add", "lab1", "bob")["group-members"]) == ["alice", "bob"]
        assert alice.ok("--json", "group", "remove", "lab1", "alice")["group-members"] == ["bob"]
        assert alice.ok("--json", "group", "set", gid, "alice")["group-members"] == ["alice"]
        assert svc.api("alice", "GET", f"/v1/group/{gid}").json()["data"][0]["group-members"] == ["alice"]
        assert carol.error("group", "show", "lab1") == "no group named 'lab1' that you can see"
        api = svc.api("alice", "PUT", f"/v1/group/{gid}", json={"action": "add", "group-members": ["carol"]})
        assert api.status_code in (403, 404) and alice.error("group", "add", "lab1", "carol") == api.json()["msg"]
        assert alice.error("group", "create", "lab1") == svc.api(
            "alice", "POST", "/v1/group", json={"group-name": "lab1"}).json()["msg"]
    finally:
        assert alice.ok("--json", "group", "delete", "lab1") == {"deleted": gid}
    assert svc.api("alice", "GET", f"/v1/group/{gid}").status_code == 404


# -- users and limits ------------------------------------------------------------------------
def test_user_commands_for_an_owner_and_their_refusals(svc, alice, bob, carol):
    made = alice.ok("--json", "user", "create", "--email", "dan@example.org", "--name", "Dan",
                    stdin="Dan-password-2026\n")
    assert made["email"] == "dan@example.org" and made["owner_userid"] == svc.users["alice"]["id"]
    assert "password" not in made
    assert made == svc.api("alice", "GET", f"/v1/user/view/{made['id']}").json()["data"]["user"]
    assert "dan@example.org" in [u["email"] for u in alice.ok("--json", "user", "list")]
    assert "dan@example.org" in alice.ok("user", "list")
    assert alice.ok("--json", "user", "show", "Dan")["id"] == made["id"]
    updated = alice.ok("--json", "user", "update", "dan@example.org", "--new-name", "Daniel")
    assert updated["name"] == "Daniel"
    assert svc.api("alice", "GET", f"/v1/user/view/{made['id']}").json()["data"]["user"]["name"] == "Daniel"
    r = requests.post(svc.base + "/v1/auth/token", json={"email": "dan@example.org", "password": "Dan-password-2026"},
                      timeout=10)
    assert r.status_code == 200
    # Refusals carry the API's message.
    api = svc.api("carol", "POST", "/v1/user/create", json={"email": "x@example.org", "password": PASSWORD})
    assert api.status_code == 403
    assert carol.error("user", "create", "--email", "x@example.org", stdin=PASSWORD + "\n") == api.json()["message"]
    api = svc.api("bob", "POST", f"/v1/user/update/{svc.users['bob']['id']}", json={"active": 0})
    assert api.status_code == 403 and bob.error("user", "update", "bob", "--inactive") == api.json()["message"]
    assert carol.error("user", "show", "Daniel") == "no user named 'Daniel' that you can see"
    assert alice.error("user", "update", "Daniel") == \
        "nothing to change: give --email, --new-name or --active/--inactive"


def test_an_ambiguous_user_name_lists_both(svc, alice):
    ids = [alice.ok("--json", "user", "create", "--email", f"sam{i}@example.org", "--name", "Sam",
                    stdin="Sam-password-2026\n")["id"] for i in (1, 2)]
    msg = alice.error("user", "show", "Sam")
    assert msg.startswith("user name 'Sam' is ambiguous, use an id: ") and all(i in msg for i in ids)
    assert alice.ok("--json", "user", "show", ids[1])["email"] == "sam2@example.org"


def test_limits_for_oneself_a_managed_user_and_refused_for_others(svc, alice, carol, admin):
    mine = alice.ok("--json", "limits")
    assert mine == svc.api("alice", "GET", "/v1/limits").json()["data"][0]
    assert set(mine) == {"cloudauth-id", "instances", "vcpus", "memory_mb", "groups", "managed_users"}
    assert mine["managed_users"]["used"] >= 1  # bob
    table = alice.ok("limits").splitlines()
    assert table[0].split() == ["LIMIT", "USED", "OF"] and [r.split()[0] for r in table[1:]] == [
        "instances", "vcpus", "memory_mb", "groups", "managed_users"]
    assert alice.ok("--json", "limits", "--user", "bob")["cloudauth-id"] == svc.users["bob"]["id"]
    assert admin.ok("--json", "limits", "--user", "alice@example.org") == mine
    assert carol.error("limits", "--user", "alice@example.org") == "no user named 'alice@example.org' that you can see"


def test_usage_errors_exit_2_and_keep_json_one_document(svc, alice):
    proc = alice.run("--json", "server", "create", "--flavor", "small")
    assert proc.returncode == 2 and "Missing option '--image'" in json.loads(proc.stdout)["error"]
    proc = alice.run("server", "frobnicate")
    assert proc.returncode == 2 and "No such command" in proc.stderr


def test_server_actions_shows_the_history_the_api_answers(svc, alice, carol):
    made = alice.ok("--json", "server", "create", "--image", "Debian 12", "--flavor", "small")
    host, sid = made["hostname"], made["id"]
    headers = {**svc.token("alice"), "X-Request-Id": "cli-stop-1"}
    r = requests.put(f"{svc.base}/v1/server-instance/{sid}", json={"task": {"what": "power-off"}}, headers=headers,
                     timeout=30)
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "cli-stop-1"
    refused = svc.api("alice", "PUT", f"/v1/server-instance/{sid}", json={"task": {"what": "reboot"}})
    assert refused.status_code == 409
    mine = alice.ok("--json", "server", "actions", host)
    assert mine == svc.api("alice", "GET", f"/v1/server-instance/{sid}/actions").json()["data"]
    assert [(a["action"], a["result"], a["request-id"]) for a in mine[:2]] == [
        ("create", "success", mine[0]["request-id"]), ("power-off", "success", "cli-stop-1")]
    assert (mine[2]["action"], mine[2]["result"], mine[2]["message"]) == ("reboot", "error", refused.json()["msg"])
    assert mine[2]["request-id"] == refused.headers["X-Request-Id"]
    table = alice.ok("server", "actions", sid[:8]).splitlines()
    assert table[0].split() == ["TIME", "ACTION", "RESULT", "REQUESTER", "REQUEST-ID", "MESSAGE"]
    assert [row.split()[1:5] for row in table[1:3]] == [
        ["create", "success", "alice@example.org", mine[0]["request-id"]],  # the requester by email
        ["power-off", "success", "alice@example.org", "cli-stop-1"]]
    not_found = svc.api("carol", "GET", f"/v1/server-instance/{sid}/actions")
    assert not_found.status_code == 404 and carol.error("server", "actions", sid) == not_found.json()["msg"]
    alice.ok("server", "delete", host)
    # Kept after the delete: named by its full id.
    after = alice.ok("--json", "server", "actions", sid)
    assert after[:3] == mine and after[-1]["action"] == "delete" and after[-1]["result"] == "success"
