"""One cloud auth and two controllers, three real `cloud-agent serve` processes on the
loopback, each with its own database: one login used on both clusters, the visibility
rules on a controller, accounts registered at cloud auth and listed there, a username
another user holds on one cluster refused, revocations reaching a controller within
`poll_seconds` and a request, and cloud auth stopped: tokens already seen go on working,
an unknown token is 503 with Retry-After, never a 401.
"""

import configparser
import os
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.agent import agent_call, agent_ok
from tests.fixtures.clouds import cloud_of, until
from tests.fixtures.server import start_server

PASSWORD = "Three-processes-1"


def headers(login: dict) -> dict:
    return {"X-Auth-Token": login["token"], "X-Auth-Cloudauth-Id": login["userid"]}


@pytest.fixture
def cloud(tmp_path):
    """Cloud auth (a sandbox that is also controller 1) and controllers 2 and 3 following it."""
    with cloud_of(tmp_path, PASSWORD) as state:
        yield state


def login(auth, email: str, password: str = PASSWORD) -> dict:
    status, _, body = auth.call("POST", "/v1/auth/token", {"email": email, "password": password})
    assert status == 200, body
    return body["data"]


def make_user(cloud, email: str, owner: str | None = None) -> dict:
    admin = login(cloud["auth"], "admin@example.org")
    body = {"email": email, "password": PASSWORD, **({"owner_userid": owner} if owner else {})}
    status, _, made = cloud["auth"].call("POST", "/v1/user/create", body, headers=headers(admin))
    assert status == 200, made
    return {"email": email, "id": made["data"]["userid"]}


def test_one_login_on_two_clusters(cloud):
    auth, (hpc2, hpc3) = cloud["auth"], (cloud["clusters"][2], cloud["clusters"][3])
    alice = make_user(cloud, "alice@example.org")
    make_user(cloud, "bob@example.org", owner=alice["id"])  # alice manages bob
    # The controllers learn the new users from the feed.
    time.sleep(1.5)
    token = login(auth, "alice@example.org")
    for cluster in (hpc2, hpc3):
        status, _, body = cluster["http"].call("GET", "/v1/server-instance", headers=headers(token))
        assert (status, body["data"]) == (200, []), body
        # A controller serves the controller interface alone: no user interface, no portal.
        status, _, _ = cluster["http"].call("GET", "/v1/user/list", headers=headers(token))
        assert status == 404
    # A wrong token for alice: 401 on a controller (cloud auth said so).
    status, _, body = hpc2["http"].call("GET", "/v1/server-instance",
                                        headers={"X-Auth-Token": "x" * 43, "X-Auth-Cloudauth-Id": alice["id"]})
    assert status == 401, body

    # Accounts: registered at cloud auth first, listed there with their cluster.
    agent_ok(hpc2["config"], "account", "enable", "alice@example.org", "--username", "alice")
    agent_ok(hpc3["config"], "account", "enable", "bob@example.org", "--username", "alice")  # another cluster
    agent_ok(hpc2["config"], "account", "enable", "bob@example.org", "--username", "bob")
    status, _, body = auth.call("GET", f"/v1/user/view/{alice['id']}", headers=headers(token))
    assert [(a["cloud_controller_id"], a["username"]) for a in body["data"]["user"]["system_accounts"]] == \
        [(2, "alice")]
    listed = {c["id"]: c for c in agent_ok(cloud["auth_config"], "controller", "list")["controllers"]}
    assert (listed[2]["accounts"], listed[3]["accounts"]) == (2, 1)
    assert listed[2]["last_seen"] and listed[3]["last_seen"]
    # The username bob holds on cluster 3... is refused for carol there, at cloud auth or here.
    carol = make_user(cloud, "carol@example.org")
    time.sleep(1.5)
    code, out = agent_call(hpc3["config"], "account", "enable", "carol@example.org", "--username", "alice")
    assert code == 1 and "alice" in out["error"], out
    code, out = agent_call(hpc2["config"], "account", "enable", "carol@example.org", "--username", "bob")
    assert code == 1 and "bob" in out["error"], out
    # A name cloud auth holds for another user on cluster 2 that cluster 2 has not recorded:
    # refused by cloud auth, and nothing is made here (no account, no directory entry).
    erin = make_user(cloud, "erin@example.org")
    status, _, held = auth.call("PUT", "/v1/auth/accounts/2/dave",
                                {"user_id": erin["id"], "uuid": "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c99", "uid": 29999},
                                headers={"Authorization": f"Controller 2:{hpc2['secret']}"})
    assert status == 200, held
    code, out = agent_call(hpc2["config"], "account", "enable", "carol@example.org", "--username", "dave")
    assert code == 1 and "another user" in out["error"], out
    listed = {u["email"]: u for u in agent_ok(hpc2["config"], "user", "list")["users"]}
    assert listed["carol@example.org"]["system_accounts"] == []
    code, out = agent_call(hpc2["config"], "account", "enable", "carol@example.org", "--username", "dave2")
    assert code == 0, out  # the directory kept nothing of the refused try

    # Visibility on a controller: alice sees what bob (hers) makes; bob does not see alice's.
    bob_token = login(auth, "bob@example.org")
    status, _, made = hpc2["http"].call("POST", "/v1/storage-volume",
                                        {"volume-size": 1, "volume-type": {"visibility": "cluster"}},
                                        headers=headers(bob_token))
    assert status == 201, made
    volume_id = made["data"][0]["volume-id"]
    status, _, seen = hpc2["http"].call("GET", f"/v1/storage-volume/{volume_id}", headers=headers(token))
    assert status == 200, seen
    status, _, mine = hpc2["http"].call("POST", "/v1/storage-volume",
                                        {"volume-size": 1, "volume-type": {"visibility": "cluster"}},
                                        headers=headers(token))
    assert status == 201, mine
    status, _, _ = hpc2["http"].call("GET", f"/v1/storage-volume/{mine['data'][0]['volume-id']}",
                                     headers=headers(bob_token))
    assert status == 404
    assert carol  # made for the refusal above

    # reconcile compares what cloud auth lists for this cluster with the accounts recorded
    # here: dave (erin's at cloud auth, not recorded on cluster 2) and alice (recorded here,
    # her registration lost at cloud auth) are found, then repaired.
    as_hpc2 = {"Authorization": f"Controller 2:{hpc2['secret']}"}
    status, _, _ = auth.call("DELETE", "/v1/auth/accounts/2/alice", headers=as_hpc2)
    assert status == 200
    code, out = agent_call(hpc2["config"], "reconcile")
    assert code == 1, out
    found = {(d["kind"], d["target"]) for d in out["drift"] if d["kind"].startswith("account-")}
    assert found == {("account-unregistered", "alice"), ("account-registered-only", "dave")}, out
    agent_ok(hpc2["config"], "reconcile", "--fix")
    status, _, body = auth.call("GET", f"/v1/user/view/{alice['id']}", headers=headers(token))
    assert [(a["cloud_controller_id"], a["username"]) for a in body["data"]["user"]["system_accounts"]] == \
        [(2, "alice")]
    status, _, body = auth.call("GET", f"/v1/user/view/{erin['id']}", headers=headers(login(auth, "admin@example.org")))
    assert body["data"]["user"]["system_accounts"] == [], body
    # hpc3, which lost nothing, finds no account drift.
    code, out = agent_call(hpc3["config"], "reconcile")
    assert not [d for d in out["drift"] if d["kind"].startswith("account")], out


def test_revocations_reach_the_controllers(cloud):
    auth, hpc2 = cloud["auth"], cloud["clusters"][2]
    admin = login(auth, "admin@example.org")
    alice = make_user(cloud, "alice@example.org")
    time.sleep(1.5)

    def works(login_):
        status, _, _ = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(login_))
        return status == 200

    def ends_within(login_, change, seconds=2.0) -> float:
        assert works(login_)
        start = time.monotonic()
        change()
        assert until(lambda: not works(login_), seconds + 1), "still accepted"
        took = time.monotonic() - start
        assert took <= seconds, f"took {took:.2f} s"
        return took

    # A password set at cloud auth ends the password logins.
    token = login(auth, "alice@example.org")
    ends_within(token, lambda: auth.call("POST", f"/v1/user/set_password/{alice['id']}",
                                         {"password": PASSWORD + "x"}, headers=headers(admin)))
    # Deactivation ends them all.
    token = login(auth, "alice@example.org", PASSWORD + "x")
    ends_within(token, lambda: auth.call("POST", f"/v1/user/update/{alice['id']}", {"active": 0},
                                         headers=headers(admin)))
    status, _, body = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(token))
    assert status == 401, body


def test_cloud_auth_stopped(cloud):
    auth, hpc2 = cloud["auth"], cloud["clusters"][2]
    make_user(cloud, "alice@example.org")
    time.sleep(1.5)
    seen = login(auth, "alice@example.org")
    unseen = login(auth, "alice@example.org")
    status, _, _ = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(seen))
    assert status == 200
    os.kill(cloud["auth_proc"].pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # a poll or two fail
        started = time.monotonic()
        status, got_headers, body = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(seen))
        assert status == 200 and time.monotonic() - started < 1, body
        started = time.monotonic()
        status, got_headers, body = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(unseen))
        waited = time.monotonic() - started
        assert status == 503 and "Retry-After" in got_headers, body
        assert waited <= 1 + 0.5, waited  # timeout_seconds + 0.5
        status, _, health = hpc2["http"].call("GET", "/healthz")
        assert status == 200, health  # within the grace
    finally:
        os.kill(cloud["auth_proc"].pid, signal.SIGCONT)
    # Cloud auth back: the unknown token is checked and works, with no restart.
    assert until(lambda: hpc2["http"].call("GET", "/v1/server-instance", headers=headers(unseen))[0] == 200, 5)
    # No raw token, password, password hash or API secret in the controller's log or database
    # (only token hashes, and placeholders where cloud auth has a secret).
    log = (cloud["logs"] / "hpc2.log").read_text()
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(hpc2["config"])
    database = Path(parser.get("database", "path"))
    stored = b"".join(Path(f"{database}{suffix}").read_bytes() for suffix in ("", "-wal")
                      if Path(f"{database}{suffix}").exists())
    api_secret = cloud["admin"]["api_secret"]
    for secret in (seen["token"], unseen["token"], PASSWORD, api_secret):
        assert secret not in log and secret.encode() not in stored
    assert b"$argon2" not in stored and b"$argon2" not in log.encode()
    assert b"cloud-auth:" in stored  # the copy is there (its users' placeholder API keys)


def test_a_flood_of_unknown_tokens_on_a_hung_cloud_auth_leaves_cached_tokens_fast(cloud):
    from concurrent.futures import ThreadPoolExecutor

    auth, hpc2 = cloud["auth"], cloud["clusters"][2]
    alice = make_user(cloud, "alice@example.org")
    time.sleep(1.5)
    seen = login(auth, "alice@example.org")
    assert hpc2["http"].call("GET", "/v1/server-instance", headers=headers(seen))[0] == 200
    unknown = [{"token": f"{i:043d}", "userid": alice["id"]} for i in range(200)]
    os.kill(cloud["auth_proc"].pid, signal.SIGSTOP)  # hung: connections open, no answer
    try:
        def unknown_call(login_):
            return hpc2["http"].call("GET", "/v1/server-instance", headers=headers(login_), timeout=30)[0]

        def cached_call(_):
            started = time.monotonic()
            status = hpc2["http"].call("GET", "/v1/server-instance", headers=headers(seen), timeout=30)[0]
            return status, time.monotonic() - started

        with ThreadPoolExecutor(max_workers=48) as pool:
            flood = [pool.submit(unknown_call, u) for u in unknown]
            cached = list(pool.map(cached_call, range(100)))
            statuses = [f.result() for f in flood]
    finally:
        os.kill(cloud["auth_proc"].pid, signal.SIGCONT)
    assert set(statuses) == {503}, sorted(set(statuses))  # never a 401, never a 500
    times = sorted(t for _, t in cached)
    assert {s for s, _ in cached} == {200}
    assert times[98] < 0.1, times[-5:]  # p99


def test_cloud_auth_killed_and_restored_from_an_older_backup(cloud, tmp_path):
    auth, hpc2 = cloud["auth"], cloud["clusters"][2]
    make_user(cloud, "alice@example.org")
    time.sleep(1.5)
    before = login(auth, "alice@example.org")
    assert hpc2["http"].call("GET", "/v1/server-instance", headers=headers(before))[0] == 200
    backup = tmp_path / "auth-backup.db"
    agent_ok(cloud["auth_config"], "backup", str(backup))
    after = login(auth, "alice@example.org")  # a token the backup does not hold
    assert hpc2["http"].call("GET", "/v1/server-instance", headers=headers(after))[0] == 200
    make_user(cloud, "bob@example.org")  # the feed moves on past the backup
    time.sleep(1.5)
    # SIGKILL, then the older database put back, then started again on the same address.
    cloud["auth_proc"].send_signal(signal.SIGKILL)
    cloud["auth_proc"].wait(timeout=10)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cloud["auth_config"])
    database = Path(parser.get("database", "path"))
    for suffix in ("-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    database.write_bytes(backup.read_bytes())
    port = int(auth.base.rsplit(":", 1)[1])
    proc, _ = start_server(cloud["auth_config"], cloud["logs"] / "auth-again.log", port=port)
    cloud["auth_proc"] = proc
    # The controller reads a snapshot (its number is ahead of the restored feed): the token made
    # after the backup is gone, the one before it works, bob is gone; no restart of the controller.
    assert until(lambda: hpc2["http"].call("GET", "/v1/server-instance", headers=headers(after))[0] == 401, 5)
    assert hpc2["http"].call("GET", "/v1/server-instance", headers=headers(before))[0] == 200
    listed = {u["email"] for u in agent_ok(hpc2["config"], "user", "list")["users"]}
    assert "bob@example.org" not in listed and "alice@example.org" in listed


def test_the_cloud_command_on_several_clusters(cloud, tmp_path):
    from tests.fixtures.cloud import Cloud

    auth, hpc2 = cloud["auth"], cloud["clusters"][2]
    make_user(cloud, "alice@example.org")
    time.sleep(1.5)
    agent_ok(hpc2["config"], "account", "enable", "alice@example.org", "--username", "alice")
    alice = Cloud(tmp_path / "alice")
    alice.ok("login", "--url", auth.base, "--email", "alice@example.org", stdin=PASSWORD + "\n")
    listed = alice.ok("--json", "cluster", "list")
    assert [(c["id"], c["name"], c["enabled"]) for c in listed] == [(1, "cluster-1", True), (2, "hpc2", True),
                                                                    (3, "hpc3", True)]
    assert listed[0]["url"] == auth.base and listed[1]["url"] == hpc2["http"].base
    assert listed[1]["account"]["username"] == "alice" and listed[2]["account"] is None
    # A volume made on cluster 2 by name, seen there by id, and not on cluster 3 (CC_CLUSTER).
    made = alice.ok("--cluster", "hpc2", "--json", "volume", "create", "--size", "1")
    assert [v["volume-id"] for v in alice.ok("--cluster", "2", "--json", "volume", "list")] == [made["volume-id"]]
    assert alice.ok("--json", "volume", "list", env={"CC_CLUSTER": "hpc3"}) == []
    message = alice.error("--cluster", "nope", "volume", "list")
    assert "no cluster 'nope'" in message and "hpc2 (2)" in message
