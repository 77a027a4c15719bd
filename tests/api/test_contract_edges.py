"""Black-box tests of the published contract (the API spec, the README and docs/): more edges: rate
limit, escalation attempts, odd input, OpenAPI methods.

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import calendar
import configparser
import json
import shutil
import subprocess
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.fixtures.blackbox import (
    PASSWORD, User, _seq, boot, cc_err, cc_ok, ids, make_group, ready_user, ui_err, ui_ok, unique, user_obj,
)


# ===========================================================================
# More edges: rate limit, escalation attempts, odd input, OpenAPI methods
# ===========================================================================

def test_token_endpoint_edges(env):
    ui_err(env.call("POST", "/v1/auth/token", json_body={}), 400)
    ui_err(env.call("POST", "/v1/auth/token", json_body={"email": "x@example.org"}), 400)
    r = env.call("GET", "/v1/auth/token")
    ui_err(r, 405)
    assert "POST" in r.allow()
    d = ui_ok(env.token(api_key=env.admin.api_key, api_secret=env.admin.api_secret))
    cp = configparser.ConfigParser()
    cp.read(env.config)
    ttl = cp.getint("auth", "token_ttl_seconds")
    expires = calendar.timegm(time.strptime(d["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert abs(expires - (time.time() + ttl)) < 120, (d["expires_at"], ttl)


def test_token_repeated_failures_are_limited_per_email(env):
    u, other = env.users({"login": False}, {"login": False})
    statuses, slow = [], False
    for _ in range(15):
        t0 = time.monotonic()
        r = env.token(email=u.email, password="Wrong-password-1")
        slow = slow or time.monotonic() - t0 > 1.0
        statuses.append(r.status)
        assert r.status in (401, 429), r.status
        if r.status == 429:
            ui_err(r, 429)
            break
    assert 429 in statuses or slow, statuses
    ui_ok(env.token(email=other.email, password=other.password))  # others are not locked out

    key_user = env.user()
    statuses = [env.token(api_key=key_user.api_key, api_secret="wrong-secret").status for _ in range(15)]
    assert set(statuses) <= {401, 429} and 429 in statuses, statuses
    key, secret = other_key(env, other)
    ui_ok(env.token(api_key=key, api_secret=secret))  # nor are other keys


def other_key(env, u):
    key = user_obj(env, env.admin, u)["api_key"]
    return key, ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]


def test_update_cannot_escalate_or_change_other_fields(env):
    u, other = env.users({}, {"login": False})
    before = user_obj(env, env.admin, u)
    for body in ({"roles": ["superuser"]}, {"owner_userid": other.id}, {"api_key": "ak_mine"},
                 {"password": "Changed-pass-77"}, {"registration_source": "forged"}, {"id": str(uuid.uuid4())}):
        r = env.call("POST", f"/v1/user/update/{u.id}", who=u, json_body=body)
        assert r.status in (200, 400, 403), (body, r.status, r.body)
        r = env.call("POST", f"/v1/user/update/{u.id}", who=u, form=body if "roles" not in body else
                     {"roles": "superuser"})
        assert r.status in (200, 400, 403), (body, r.status, r.body)
    after = user_obj(env, env.admin, u)
    assert after == before
    ui_ok(env.token(email=u.email, password=u.password))

    creator = env.user(roles=["create_user"])
    r = env.call("POST", "/v1/user/create", who=creator,
                 json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD, "roles": ["superuser"]})
    assert r.status in (200, 400), r.body
    if r.status == 200:
        made = ui_ok(env.call("GET", f"/v1/user/view/{r.body['data']['userid']}", who=env.admin))["user"]
        assert made["roles"] == [] and made["owner_userid"] == creator.id


def test_create_and_update_odd_values(env):
    r = env.call("POST", "/v1/user/create", who=env.admin,
                 json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                            "owner_userid": str(uuid.uuid4())})
    assert r.status in (400, 404), r.body
    ui_err(r, r.status)
    u = env.user(login=False)
    ui_err(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, json_body={"active": "no"}), 400)
    ui_err(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, form={"active": "x"}), 400)
    ui_err(env.call("POST", "/v1/user/create", who=env.admin,
                    data=("[" * 50000 + "]" * 50000).encode(), content_type="application/json"), 400)


def test_delete_by_email_with_plus_and_case(env):
    email = f"{unique('x')}+tag@example.org"
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin, json_body={"email": email, "password": PASSWORD}))
    ui_ok(env.call("POST", f"/v1/user/delete/{urllib.parse.quote(email)}", who=env.admin), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin), 404)


def test_search_is_exact(env):
    u = env.user(account=True, login=False)
    assert ui_ok(env.call("GET", "/v1/user/search", who=env.admin,
                          query={"email": u.email[:-4]}))["users"] == []
    assert ui_ok(env.call("GET", "/v1/user/search", who=env.admin,
                          query={"username": u.username[:-1]}))["users"] == []


def test_list_for_role_holders_is_still_self_and_owned(env):
    viewer = env.user(roles=["view_user", "update_user", "view_user_secret"])
    kept, _ = env.users({"owner": viewer, "login": False}, {"login": False})
    d = ui_ok(env.call("GET", "/v1/user/list", who=viewer))
    assert ids(d["users"]) == {viewer.id, kept.id} and d["total"] == 2


def test_openapi_methods_match_the_interfaces(env):
    doc = env.call("GET", "/v1/openapi.json").body
    verbs = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}

    def methods(path):
        return {m for m in doc["paths"][path] if m in verbs}

    assert methods("/v1/server-image") == {"get"}
    assert methods("/v1/server-flavor") == {"get"}
    assert methods("/v1/server-instance") == {"get", "post"}
    assert methods("/v1/storage-volume") == {"get", "post"}
    assert methods("/v1/group") == {"get", "post"}
    assert methods("/v1/user/list") == {"get", "post"}
    assert methods("/v1/user/search") == {"get", "post"}
    assert methods("/v1/user/create") == {"post"}
    volume_item = [p for p in doc["paths"] if p.startswith("/v1/storage-volume/{")]
    assert volume_item and methods(volume_item[0]) == {"get", "delete"}
    instance_item = [p for p in doc["paths"] if p.startswith("/v1/server-instance/{")]
    assert instance_item and methods(instance_item[0]) == {"get", "put", "delete"}


def test_controller_never_5xx_on_junk(env):
    u = env.user(account=True)
    junk = [
        ("POST", "/v1/storage-volume", json.dumps({"volume-size": 10 ** 30,
                                                   "volume-type": {"visibility": "cluster"}}).encode()),
        ("POST", "/v1/storage-volume", b"null"),
        ("POST", "/v1/storage-volume", b"\xff\xfe{"),
        ("POST", "/v1/storage-volume", ("[" * 50000 + "]" * 50000).encode()),
        ("POST", "/v1/storage-volume", json.dumps({"volume-size": None, "volume-type": None}).encode()),
        ("POST", "/v1/group", json.dumps({"group-name": "\u00e9t\u00e9"}).encode()),
        ("POST", "/v1/group", json.dumps({"group-name": None}).encode()),
        ("POST", "/v1/group", json.dumps({"group-name": unique("g"), "group-members": [None, 3]}).encode()),
        ("POST", "/v1/server-instance", json.dumps({"server-image": "x" * 10000, "server-flavor": "1"}).encode()),
        ("POST", "/v1/server-instance", json.dumps({"server-image": None, "server-flavor": None}).encode()),
        ("PUT", f"/v1/group/{uuid.uuid4()}", json.dumps({"action": "add", "group-members": []}).encode()),
        ("PUT", f"/v1/server-instance/{uuid.uuid4()}", json.dumps({"task": {"what": "reboot"}}).encode()),
    ]
    for method, path, body in junk:
        r = env.call(method, path, who=u, data=body, content_type="application/json")
        assert 400 <= r.status < 500, (method, path, body[:60], r.status, r.body)
        cc_err(r, r.status)
    for query in ({"cloudauth-id": ""}, {"cloudauth-id": "'; drop table users; --"}):
        cc_err(env.call("GET", "/v1/server-instance", who=u, query=query), 400)
    r = env.call("GET", "/v1/group", who=u, query={"group-name": "'; --"})
    assert r.status in (200, 400)
    # a JSON content type with parameters is still JSON
    r = env.call("POST", "/v1/storage-volume", who=u, content_type="application/json; charset=utf-8",
                 data=json.dumps({"volume-size": 1, "volume-type": {"visibility": "cluster"}}).encode())
    cc_ok(r, 201)


def test_volume_recreate_after_delete_and_managed_cannot_delete_owners(env):
    owner = env.user(account=True)
    managed = env.user(owner=owner, account=True)
    vol = env.volume(owner)
    cc_err(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=managed), 404)
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=owner)) == []
    again = env.volume(owner)
    assert again["volume-id"] != vol["volume-id"] and env.home(owner.username).is_dir()


def test_instance_access_grant_does_not_widen_visibility(env, contract_catalog):
    owner = ready_user(env)
    managed = env.user(owner=owner, account=True)
    inst = cc_ok(boot(env, owner, contract_catalog, users=[managed.account_uuid]), 201)[0]
    # spec 4.1: a requester with no managed users sees only own instances
    cc_err(env.call("GET", f"/v1/server-instance/{inst['id']}", who=managed), 404)
    assert cc_ok(env.call("GET", "/v1/server-instance", who=managed)) == []


def test_group_membership_does_not_widen_visibility(env):
    owner = env.user(account=True)
    managed = env.user(owner=owner, account=True)
    g = make_group(env, owner, unique("g"), [managed.username])
    cc_err(env.call("GET", f"/v1/group/{g['group-id']}", who=managed), 404)


def test_sandbox_config_layout(env):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    assert Path(cp.get("database", "path")).parent == env.sandbox
    assert cp.get("libvirt", "uri") == "test:///default"
    assert Path(cp.get("volumes", "home_root")) == env.sandbox / "home"
    assert cp.get("volumes", "quota_backend") == "none"
    assert Path(cp.get("unix", "root")) == env.sandbox / "sysroot"


def test_concurrent_creates_keep_the_rules(env):
    u = env.user(account=True)
    vol = {"volume-size": 1, "volume-type": {"visibility": "cluster"}}
    name = unique("g")
    email = f"{unique('same-')}@example.org"
    with ThreadPoolExecutor(max_workers=6) as pool:
        vols = list(pool.map(lambda _: env.call("POST", "/v1/storage-volume", who=u, json_body=vol).status,
                             range(6)))
        groups = list(pool.map(lambda _: env.call("POST", "/v1/group", who=u,
                                                  json_body={"group-name": name}).status, range(6)))
        users = list(pool.map(lambda _: env.call("POST", "/v1/user/create", who=env.admin,
                                                 json_body={"email": email, "password": PASSWORD}).status,
                              range(6)))
    assert sorted(vols) == [201] + [409] * 5, vols
    assert sorted(groups) == [201] + [409] * 5, groups
    assert sorted(users) == [200] + [409] * 5, users
    assert len(cc_ok(env.call("GET", "/v1/storage-volume", who=u))) == 1


def test_account_enable_uid_and_refusals(env):
    a, b, c = env.users({"login": False}, {"login": False}, {"login": False})
    uid = 40000 + next(_seq)
    acct = env.agent("account", "enable", a.email, "--username", unique("n"), "--uid", str(uid))
    line = [x for x in (env.sandbox / "sysroot" / "etc" / "passwd").read_text().splitlines()
            if x.startswith(acct["username"] + ":")]
    assert line and line[0].split(":")[2] == str(uid)

    before = (env.sandbox / "sysroot" / "etc" / "passwd").read_text()
    for bad in ("bad;name", "root"):
        rc, doc = env.agent("account", "enable", b.email, "--username", bad, ok=False)
        assert rc != 0 and isinstance(doc, dict), (bad, doc)
    assert (env.sandbox / "sysroot" / "etc" / "passwd").read_text() == before
    assert user_obj(env, env.admin, b)["system_accounts"] == []

    env.enable(c)
    env.volume(User(id=c.id, email=c.email, password="", token=ui_ok(
        env.token(email=c.email, password=c.password))["token"]))
    rc, doc = env.agent("account", "disable", c.email, "--yes", ok=False)
    assert rc != 0, doc
    assert len(user_obj(env, env.admin, c)["system_accounts"]) == 1


def test_instance_grants_between_manager_and_managed(env, contract_catalog):
    manager = env.user(account=True)
    managed = ready_user(env, owner=manager)
    inst = cc_ok(boot(env, managed, contract_catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"
    # a managed user may not grant its manager (neither is, owns, nor superuser)
    cc_err(boot(env, managed, contract_catalog, users=[manager.account_uuid]), 403)
    cc_err(env.call("PUT", path, who=managed, json_body={"task": {"what": "modify-users", "how": "add",
                                                                  "users": [manager.account_uuid]}}), 403)
    # the owner's owner may mutate, and may grant itself
    data = cc_ok(env.call("PUT", path, who=manager, json_body={"task": {"what": "modify-users", "how": "add",
                                                                         "users": [manager.account_uuid]}}))
    assert sorted(data[0]["users"]) == sorted([managed.account_uuid, manager.account_uuid])
    assert data[0]["cloudauth-id"] == managed.id
    assert cc_ok(env.call("PUT", path, who=manager, json_body={"task": {"what": "power-off"}}))[0]["status"] == \
        "shutoff"


def test_image_add_that_fails_leaves_no_image(env, tmp_path):
    src = tmp_path / "not-an-image.raw"
    src.write_bytes(b"\0" * 4096)
    name = unique("bad-src-")
    rc, doc = env.agent("image", "add", "--name", name, "--os-name", "debian", "--os-major", "12", "--os-minor",
                        "8", "--min-disk", "1", "--min-ram", "256", "--source", str(src), ok=False)
    assert rc != 0 and isinstance(doc, dict)
    assert name not in {i["name"] for i in cc_ok(env.call("GET", "/v1/server-image", who=env.admin))}


def test_image_add_from_a_source_file(env, contract_catalog, tmp_path):
    qemu_img = shutil.which("qemu-img")
    assert qemu_img, "qemu-img is missing: run scripts/setup-host.sh"
    src = tmp_path / "base.qcow2"
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", str(src), "1G"], check=True)
    img = env.agent("image", "add", "--name", unique("src-"), "--os-name", "debian", "--os-major", "12",
                    "--os-minor", "8", "--min-disk", "1", "--min-ram", "256", "--source", str(src))
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]
    u = ready_user(env)
    inst = cc_ok(env.call("POST", "/v1/server-instance", who=u,
                          json_body={"server-image": img["id"], "server-flavor": contract_catalog["small"]["id"]}), 201)
    assert inst[0]["status"] == "running"


def test_volume_and_group_delete_when_already_gone_on_the_host(env):
    u = env.user(account=True)
    vol = env.volume(u)
    g = make_group(env, u, unique("g"), [u.username])
    shutil.rmtree(env.home(u.username))
    for fname in ("group", "gshadow"):
        path = env.sandbox / "sysroot" / "etc" / fname
        lines = [line for line in path.read_text().splitlines() if not line.startswith(g["group-name"] + ":")]
        path.write_text("".join(line + "\n" for line in lines))
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=u)) == []
    assert cc_ok(env.call("DELETE", f"/v1/group/{g['group-id']}", who=u)) == []
    assert cc_ok(env.call("GET", "/v1/storage-volume", who=u)) == []


def test_email_is_free_again_after_delete_and_disable_removes_the_account(env):
    u = env.user(account=True, login=False)
    passwd = env.sandbox / "sysroot" / "etc" / "passwd"
    assert any(line.startswith(u.username + ":") for line in passwd.read_text().splitlines())
    cp = env.agent_raw("account", "disable", u.email, "--yes")
    assert cp.returncode == 0, cp.stderr
    assert not any(line.startswith(u.username + ":") for line in passwd.read_text().splitlines())
    assert user_obj(env, env.admin, u)["system_accounts"] == []
    ui_ok(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), data=False)
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin, json_body={"email": u.email, "password": PASSWORD}))
    assert d["userid"] != u.id


def test_tokens_expire_and_host_failures_are_503(ttl_service):
    """The second service: a 2 s token TTL, and a system root that goes away."""
    e = ttl_service.result(timeout=60)
    u = e.extra_user
    expires = calendar.timegm(time.strptime(u.extra["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    time.sleep(max(0.0, expires + 1.05 - time.time()))
    ui_err(e.call("GET", f"/v1/user/view/{u.id}", who=u), 401)  # the token expired
    cc_err(e.call("GET", "/v1/group", who=u), 401)
    u2 = User(id=u.id, email=u.email, password="", token=ui_ok(
        e.token(api_key=u.api_key, api_secret=u.api_secret))["token"])
    assert e.call("GET", f"/v1/user/view/{u.id}", who=u2).status == 200

    shutil.rmtree(e.sandbox / "sysroot")
    # /healthz answers from the last round of checks, run every [health] refresh_seconds
    # (2 s) and each bounded by check_timeout_seconds (5 s): the change shows within those.
    deadline = time.monotonic() + 2 + 5 + 3
    while (r := e.call("GET", "/healthz")).status == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status == 503, (r.status, r.body)
    assert "system" in json.dumps(r.body).lower() or "root" in json.dumps(r.body).lower(), r.body
    u2.token = ui_ok(e.token(api_key=u.api_key, api_secret=u.api_secret))["token"]
    r = e.call("POST", "/v1/group", who=u2, json_body={"group-name": unique("g")})
    assert r.status == 503, (r.status, r.body)
    cc_err(r, 503)
    rc, doc = e.agent("check", ok=False)
    assert rc == 1 and doc["ok"] is False
    assert [c for c in doc["checks"] if not c["ok"]], doc


def test_no_secret_in_plain_text_at_rest_or_in_the_log(env):
    """Authentication (docs/api.md): slow hashes for passwords, API secrets encrypted at rest; no secret in logs."""
    u = env.user()
    cp = configparser.ConfigParser()
    cp.read(env.config)
    db = Path(cp.get("database", "path"))
    blobs = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())
    log = (env.root / "serve.log").read_bytes()
    for secret in (PASSWORD, "Superuser-pass-1", env.admin.api_secret, u.api_secret, env.admin.token, u.token):
        assert secret.encode() not in blobs, "a secret is stored in plain text"
        assert secret.encode() not in log, "a secret is in the server log"


def test_agent_reconcile_reports_and_fixes_a_removed_home(env):
    # Everything the suite did went through the API or the agent: no drift.
    rc, doc = env.agent("reconcile", ok=False)
    assert (rc, doc) == (0, {"drift": []}), doc

    u = env.user(account=True)
    env.volume(u)
    home = env.home(u.username)
    (home / "file").write_text("data")
    subprocess.run(["rm", "-rf", str(home)], check=True)

    rc, doc = env.agent("reconcile", ok=False)
    assert rc == 1 and set(doc) == {"drift"} and isinstance(doc["drift"], list)
    mine = [d for d in doc["drift"] if u.username in json.dumps(d)]
    assert mine, doc

    rc, doc = env.agent("reconcile", "--fix", ok=False)
    assert rc == 0 and set(doc) == {"drift"}
    assert [d for d in doc["drift"] if u.username in json.dumps(d)], doc
    assert home.is_dir()
    st = home.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (u.uid, u.gid, 0o700)

    rc, doc = env.agent("reconcile", ok=False)
    assert not [d for d in doc["drift"] if u.username in json.dumps(d)], doc


def test_agent_reconcile_reports_and_fixes_a_removed_group(env):
    u = env.user(account=True)
    name = unique("g")
    make_group(env, u, name, [u.username])
    for fname in ("group", "gshadow"):  # as a hand-made `groupdel` would
        path = env.sandbox / "sysroot" / "etc" / fname
        lines = [line for line in path.read_text().splitlines() if not line.startswith(name + ":")]
        path.write_text("".join(line + "\n" for line in lines))

    rc, doc = env.agent("reconcile", ok=False)
    assert rc == 1 and [d for d in doc["drift"] if name in json.dumps(d)], doc
    rc, doc = env.agent("reconcile", "--fix", ok=False)
    assert rc == 0, doc
    assert env.group_line(name) is not None and env.group_line(name)[1] == [u.username]
    assert env.agent("reconcile", ok=False) == (0, {"drift": []})
