"""Black-box tests of the published contract: the spec, CONTRACT.md and the README.

Nothing here imports the project. The product is driven only as an outside
suite would drive it: the `cloud-agent` command next to the interpreter (with
`--config` or `CLOUD_CONTROLLER_CONFIG`, and `--json`) and HTTP against
`cloud-agent serve` on a sandbox made by `cloud-agent init --sandbox DIR`.
One server serves the whole module (a second one, started in the background,
has a 2 s token TTL and loses its system root); every test makes its own users.
"""

import calendar
import configparser
import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

AGENT = Path(sys.executable).parent / "cloud-agent"
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
PASSWORD = "Blackbox-pass-1"  # 15 characters, three classes

INSTANCE_FIELDS = {"id", "cloudauth-id", "users", "server-image", "server-flavor", "creation-date",
                   "status", "hostname", "public-ip", "private-ip"}
INSTANCE_REQUIRED = {"id", "cloudauth-id", "users", "server-image", "server-flavor", "creation-date", "status"}
IMAGE_FIELDS = {"id", "name", "public", "operating-system", "min-disk", "min-ram", "creation-date", "active"}
FLAVOR_FIELDS = {"id", "name", "memory", "disk", "vcpu"}
VOLUME_FIELDS = {"volume-id", "cloudauth-id", "volume-size", "volume-type", "creation-date", "volume-name"}
VOLUME_REQUIRED = VOLUME_FIELDS - {"volume-name"}
GROUP_FIELDS = {"group-id", "cloudauth-id", "group-name", "group-members"}
SUPERUSER_FIELDS = {"api_key", "num_owned_accounts", "roles", "registration_source"}
INSTANCE_STATUSES = {"building", "running", "paused", "shutoff", "crashed", "error"}

_seq = itertools.count(1)


def unique(prefix="u"):
    """A short unique token that is also a valid POSIX name."""
    return f"{prefix}{next(_seq)}{uuid.uuid4().hex[:6]}"


def is_uuid(value):
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def keys_anywhere(doc):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from keys_anywhere(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from keys_anywhere(v)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Response:
    status: int
    headers: dict
    body: object
    raw: bytes

    def allow(self):
        return {m.strip().upper() for m in self.headers.get("allow", "").split(",") if m.strip()}


@dataclass
class User:
    id: str
    email: str
    password: str
    token: str = ""
    username: str = ""
    account_uuid: str = ""
    uid: int = -1
    gid: int = -1
    api_key: str = ""
    api_secret: str = ""
    extra: dict = field(default_factory=dict)


class Env:
    def __init__(self, root: Path):
        self.root = root
        self.sandbox = root / "sandbox"
        self.config = root / "controller.ini"
        self.base = ""
        self.proc = None
        self.admin: User | None = None
        self.extra_user: User | None = None  # the TTL service's user

    # -- the agent --------------------------------------------------------
    def agent_raw(self, *args, use_env=False, timeout=60):
        env = dict(os.environ)
        env.pop("CLOUD_CONTROLLER_CONFIG", None)
        argv = [str(AGENT)]
        if use_env:
            env["CLOUD_CONTROLLER_CONFIG"] = str(self.config)
        else:
            argv += ["--config", str(self.config)]
        argv += ["--json", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def agent(self, *args, ok=True, use_env=False):
        """Run a command with --json; stdout must be exactly one JSON document."""
        cp = self.agent_raw(*args, use_env=use_env)
        if ok:
            assert cp.returncode == 0, f"cloud-agent {args}: rc={cp.returncode}\n{cp.stdout}\n{cp.stderr}"
        doc = json.loads(cp.stdout)  # raises if there is not exactly one document
        assert "password" not in set(keys_anywhere(doc))
        return doc if ok else (cp.returncode, doc)

    # -- HTTP -------------------------------------------------------------
    def call(self, method, path, *, who=None, json_body=None, form=None, data=None,
             content_type=None, query=None, headers=None):
        url = self.base + path
        if query is not None:
            url += "?" + urllib.parse.urlencode(query)
        hdrs = dict(headers or {})
        if who is not None:
            hdrs["X-Auth-Token"] = who.token
            hdrs["X-Auth-Cloudauth-Id"] = who.id
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif form is not None:
            body = urllib.parse.urlencode(form).encode()
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif data is not None:
            body = data
        if content_type is not None:
            hdrs["Content-Type"] = content_type
        if body is None and method in ("POST", "PUT"):
            body = b""
        req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, rh, raw = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            status, rh, raw = err.code, err.headers, err.read()
        parsed = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
        # The contract: `password` never appears in any response (the schema document describes it).
        assert path == "/v1/openapi.json" or "password" not in set(keys_anywhere(parsed)), (method, path, parsed)
        assert PASSWORD.encode() not in raw
        assert b"Traceback" not in raw
        return Response(status, {k.lower(): v for k, v in rh.items()}, parsed, raw)

    def token(self, *, email=None, password=None, api_key=None, api_secret=None):
        if email is not None:
            body = {"email": email, "password": password}
        else:
            body = {"api_key": api_key, "api_secret": api_secret}
        return self.call("POST", "/v1/auth/token", json_body=body)

    # -- users ------------------------------------------------------------
    def user(self, *, owner=None, roles=(), account=False, password=PASSWORD, login="key", **params):
        """A fresh user made by the superuser (owned by `owner` when given).

        login: "key" (a token from its API key and secret: fast), "password"
        (a token from email and password: a slow hash check), or False.
        """
        email = f"{unique('bb-')}@example.org"
        body = {"email": email, "password": password, **params}
        if owner is not None:
            body["owner_userid"] = owner.id
        r = self.call("POST", "/v1/user/create", who=self.admin, json_body=body)
        assert r.status == 200, r.body
        u = User(id=r.body["data"]["userid"], email=email, password=password)
        for role in roles:
            self.agent("user", "grant", email, role)
        if account:
            self.enable(u)
        if login == "password":
            t = self.token(email=email, password=password)
        elif login:
            v = self.call("GET", f"/v1/user/view/{u.id}", who=self.admin)
            s = self.call("GET", f"/v1/user/view_api_secret/{u.id}", who=self.admin)
            assert v.status == 200 and s.status == 200, (v.body, s.body)
            u.api_key, u.api_secret = v.body["data"]["user"]["api_key"], s.body["data"]["api_secret"]
            t = self.token(api_key=u.api_key, api_secret=u.api_secret)
        if login:
            assert t.status == 200, t.body
            u.token = t.body["data"]["token"]
        return u

    def users(self, *specs):
        """Several fresh users at once (each spec: the keyword arguments of `user`).

        Made concurrently to keep the suite fast; the product must cope with that.
        """
        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            return list(pool.map(lambda spec: self.user(**spec), specs))

    def enable(self, u, username=None):
        u.username = username or unique("a")
        acct = self.agent("account", "enable", u.email, "--username", u.username)
        u.account_uuid = acct["uuid"]
        for line in (self.sandbox / "sysroot" / "etc" / "passwd").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == u.username:
                u.uid, u.gid = int(parts[2]), int(parts[3])
        assert u.uid >= 0, "account not in the system root's passwd"
        return acct

    def volume(self, who, size=1, **extra):
        r = self.call("POST", "/v1/storage-volume", who=who,
                      json_body={"volume-size": size, "volume-type": {"visibility": "cluster"}, **extra})
        assert r.status == 201, r.body
        return r.body["data"][0]

    def group_line(self, name):
        """(gid, members) of a group in the sandbox system root, or None."""
        for line in (self.sandbox / "sysroot" / "etc" / "group").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == name:
                return int(parts[2]), sorted(m for m in parts[3].split(",") if m)
        return None

    def home(self, username):
        return self.sandbox / "home" / username


def start_service(root: Path, *, tune=None):
    """A sandbox made by `cloud-agent init --sandbox`, a superuser, and `cloud-agent serve` on a free port.

    `tune(config_parser)` may change the written config before the server starts.
    """
    assert AGENT.exists(), f"cloud-agent is not installed next to {sys.executable}"
    e = Env(root)
    assert e.agent("init", "--sandbox", str(e.sandbox)) == {"config": str(e.config)}
    if tune is not None:
        cp = configparser.ConfigParser()
        cp.read(e.config)
        tune(cp)
        with open(e.config, "w") as f:
            cp.write(f)
    su = e.agent("user", "create-superuser", "--email", "root-bb@example.org", "--password", "Superuser-pass-1")
    assert set(su) == {"userid", "api_key", "api_secret"}
    port = free_port()
    e.base = f"http://127.0.0.1:{port}"
    with open(e.root / "serve.log", "wb") as log:
        e.proc = subprocess.Popen([str(AGENT), "--config", str(e.config), "serve", "--host", "127.0.0.1",
                                   "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert e.proc.poll() is None, (e.root / "serve.log").read_text()
            try:
                if e.call("GET", "/healthz").status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "server did not answer /healthz within 30 s"
            time.sleep(0.1)
        t = e.token(api_key=su["api_key"], api_secret=su["api_secret"])
        assert t.status == 200, t.body
        e.admin = User(id=su["userid"], email="root-bb@example.org", password="Superuser-pass-1",
                       token=t.body["data"]["token"], api_key=su["api_key"], api_secret=su["api_secret"])
    except BaseException:
        stop_service(e)
        raise
    return e


def stop_service(e):
    """SIGTERM to the server's PID (only the process this module started)."""
    if e.proc is None or e.proc.poll() is not None:
        return
    os.kill(e.proc.pid, signal.SIGTERM)
    try:
        e.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.kill(e.proc.pid, signal.SIGKILL)
        e.proc.wait()


@contextlib.contextmanager
def sandbox_service(root: Path, *, tune=None):
    e = start_service(root, tune=tune)
    try:
        yield e
    finally:
        stop_service(e)


def _ttl_service(root):
    """A second service with a 2 s token TTL, and a token issued right away (it expires while the suite runs)."""
    def tune(cp):
        cp.set("auth", "token_ttl_seconds", "2")

    e = start_service(root, tune=tune)
    try:
        u = e.user(login=False)
        e.enable(u)
        e.admin.token = ui_ok(e.token(api_key=e.admin.api_key, api_secret=e.admin.api_secret))["token"]
        u.api_key = user_obj(e, e.admin, u)["api_key"]
        u.api_secret = ui_ok(e.call("GET", f"/v1/user/view_api_secret/{u.id}", who=e.admin))["api_secret"]
        d = ui_ok(e.token(api_key=u.api_key, api_secret=u.api_secret))
        u.token = d["token"]
        assert e.call("GET", f"/v1/user/view/{u.id}", who=u).status == 200
        u.extra["expires_at"] = d["expires_at"]
        e.extra_user = u
    except BaseException:
        stop_service(e)
        raise
    return e


@pytest.fixture(scope="module", autouse=True)
def ttl_service(tmp_path_factory):
    """Started in the background when the module starts, so its token has expired by the time it is checked."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(_ttl_service, tmp_path_factory.mktemp("blackbox-ttl"))
    try:
        yield future
    finally:
        try:
            stop_service(future.result(timeout=60))
        finally:
            pool.shutdown()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with sandbox_service(tmp_path_factory.mktemp("blackbox")) as e:
        yield e


@pytest.fixture(scope="module")
def catalog(env):
    """Images and flavors made with the agent, shared by the controller tests."""
    def image(*flags, min_disk=1, min_ram=256):
        return env.agent("image", "add", "--name", unique("img-"), "--os-name", "debian", "--os-major", "12",
                         "--os-minor", "7", "--min-disk", str(min_disk), "--min-ram", str(min_ram), *flags)

    def flavor(memory, disk, vcpu=1):
        return env.agent("flavor", "add", "--name", unique("fl-"), "--memory", str(memory), "--disk", str(disk),
                         "--vcpu", str(vcpu))

    makers = {
        "public": lambda: image(),
        "private": lambda: image("--private"),
        "inactive": lambda: image("--inactive"),
        "big-disk": lambda: image(min_disk=5),  # more than the small flavor's disk
        "small": lambda: flavor(512, 2),
        "tiny": lambda: flavor(128, 1),  # below the images' min-ram
    }
    with ThreadPoolExecutor(max_workers=len(makers)) as pool:
        futures = {key: pool.submit(make) for key, make in makers.items()}
        return {key: f.result() for key, f in futures.items()}


def max_size_gb(env):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    return cp.getint("volumes", "max_size_gb")


# -- envelope checks -------------------------------------------------------

def ui_ok(r, *, data=True):
    assert r.status == 200, (r.status, r.body)
    assert set(r.body) == ({"data", "message", "success", "version"} if data else
                           {"message", "success", "version"}), r.body
    assert r.body["success"] is True and r.body["message"] == "" and r.body["version"] == "1", r.body
    if data:
        assert isinstance(r.body.get("data"), dict), r.body
        return r.body["data"]
    assert "data" not in r.body, r.body
    return None


def ui_err(r, status):
    assert r.status == status, (r.status, r.body)
    assert set(r.body) == {"message", "success", "version"}, r.body
    assert r.body["success"] is False, r.body
    assert isinstance(r.body["message"], str) and r.body["message"], r.body
    assert r.body["version"] == "1", r.body
    assert "data" not in r.body, r.body


def cc_ok(r, status=200):
    assert r.status == status, (r.status, r.body)
    assert set(r.body) == {"data", "msg", "success"}, r.body
    assert r.body["success"] is True and r.body["msg"] == "" and isinstance(r.body["data"], list), r.body
    return r.body["data"]


def cc_err(r, status):
    assert r.status == status, (r.status, r.body)
    assert set(r.body) == {"data", "msg", "success"}, r.body
    assert r.body["success"] is False and r.body["data"] == [], r.body
    assert isinstance(r.body["msg"], str) and r.body["msg"], r.body


def user_obj(env, who, target):
    return ui_ok(env.call("GET", f"/v1/user/view/{target.id}", who=who))["user"]


# ===========================================================================
# Service endpoints
# ===========================================================================

def test_healthz(env):
    r = env.call("GET", "/healthz")
    assert r.status == 200 and r.body == {"status": "ok"}


def test_openapi_document_lists_both_interfaces(env):
    r = env.call("GET", "/v1/openapi.json")
    assert r.status == 200
    doc = r.body
    assert str(doc["openapi"]).startswith("3.")
    paths = set(doc["paths"])
    for p in ("/v1/server-instance", "/v1/server-image", "/v1/server-flavor", "/v1/storage-volume", "/v1/group",
              "/v1/user/list", "/v1/user/create", "/v1/user/search", "/v1/auth/token"):
        assert p in paths, p
    for prefix in ("/v1/server-instance/{", "/v1/storage-volume/{", "/v1/group/{", "/v1/user/view/{",
                   "/v1/user/update/{", "/v1/user/delete/{", "/v1/user/set_password/{"):
        assert any(p.startswith(prefix) for p in paths), prefix


# ===========================================================================
# Tokens and the header check (CONTRACT 2)
# ===========================================================================

def test_token_by_api_key_and_by_password(env):
    r = env.token(api_key=env.admin.api_key, api_secret=env.admin.api_secret)
    d = ui_ok(r)
    assert set(d) == {"token", "expires_at", "userid"}
    assert d["userid"] == env.admin.id and d["token"]
    assert DATE_TIME.match(d["expires_at"]), d["expires_at"]

    u = env.user(login=False)
    d = ui_ok(env.token(email=u.email, password=u.password))
    assert d["userid"] == u.id and DATE_TIME.match(d["expires_at"])
    u.token = d["token"]
    assert ui_ok(env.call("GET", f"/v1/user/view/{u.id}", who=u))["user"]["id"] == u.id


def test_token_by_key_of_a_managed_user(env):
    u = env.user()
    api_key = user_obj(env, env.admin, u)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    d = ui_ok(env.token(api_key=api_key, api_secret=secret))
    assert d["userid"] == u.id


def test_token_401_cases(env):
    u = env.user()
    ui_err(env.token(email=u.email, password="Wrong-password-1"), 401)
    ui_err(env.token(email=f"{unique('nobody-')}@example.org", password=PASSWORD), 401)
    api_key = user_obj(env, env.admin, u)["api_key"]
    ui_err(env.token(api_key=api_key, api_secret="not-the-secret"), 401)
    ui_err(env.token(api_key="ak_" + uuid.uuid4().hex, api_secret="x"), 401)

    inactive = env.user(login=False, active=0)
    ui_err(env.token(email=inactive.email, password=PASSWORD), 401)

    nulled = env.user(login=False)
    key = user_obj(env, env.admin, nulled)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{nulled.id}", who=env.admin))["api_secret"]
    assert env.token(api_key=key, api_secret=secret).status == 200
    env.call("POST", f"/v1/user/reset_api_secret/{nulled.id}", who=env.admin, json_body={"set_to_null": True})
    ui_err(env.token(api_key=key, api_secret=secret), 401)


def test_header_check_on_both_interfaces(env):
    a, b = env.users({}, {"login": False})
    for path, err in (("/v1/user/list", ui_err), ("/v1/server-image", cc_err)):
        err(env.call("GET", path), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": a.token}), 401)
        err(env.call("GET", path, headers={"X-Auth-Cloudauth-Id": a.id}), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": "garbage", "X-Auth-Cloudauth-Id": a.id}), 401)
        # a real token presented under someone else's id
        err(env.call("GET", path, headers={"X-Auth-Token": a.token, "X-Auth-Cloudauth-Id": b.id}), 401)
        err(env.call("GET", path, headers={"X-Auth-Token": a.token, "X-Auth-Cloudauth-Id": "not-a-uuid"}), 401)
        assert env.call("GET", path, who=a).status == 200


def test_null_api_secret_locks_the_user_out(env):
    u = env.user(login="password")
    ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, json_body={"set_to_null": True}))
    ui_err(env.token(email=u.email, password=u.password), 401)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=u), 401)
    cc_err(env.call("GET", "/v1/server-image", who=u), 401)


def test_tokens_die_on_password_set_secret_reset_and_deactivation(env):
    u = env.user(login="password")
    pw_token = u.token
    key = user_obj(env, env.admin, u)["api_key"]
    secret = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    key_token = ui_ok(env.token(api_key=key, api_secret=secret))["token"]
    as_key = User(id=u.id, email=u.email, password="", token=key_token)

    ui_ok(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin,
                   json_body={"password": "Another-pass-22"}), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=u), 401)  # password token died
    assert env.call("GET", f"/v1/user/view/{u.id}", who=as_key).status == 200  # key token lives

    pw_token = ui_ok(env.token(email=u.email, password="Another-pass-22"))["token"]
    as_pw = User(id=u.id, email=u.email, password="", token=pw_token)
    new = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin))["api_secret"]
    assert isinstance(new, str) and new and new != secret
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=as_key), 401)
    assert env.call("GET", f"/v1/user/view/{u.id}", who=as_pw).status == 200  # a reset kills key tokens only
    ui_err(env.token(api_key=key, api_secret=secret), 401)
    key_token = ui_ok(env.token(api_key=key, api_secret=new))["token"]
    as_key.token = key_token

    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, json_body={"active": 0}), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{u.id}", who=as_key), 401)


# ===========================================================================
# User interface: create (spec 4.6, CONTRACT 3 and 4)
# ===========================================================================

def test_create_by_json_and_by_form(env):
    email = f"{unique('bb-')}@example.org"
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       json_body={"email": email, "password": PASSWORD, "name": "Jay Son"}))
    assert set(d) == {"userid"} and is_uuid(d["userid"])
    obj = ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]
    assert obj["email"] == email and obj["name"] == "Jay Son"
    assert type(obj["active"]) is int and obj["active"] == 1  # default 1
    assert obj["system_accounts"] == [] and DATE_TIME.match(obj["created_at_utc"])

    email2 = f"{unique('bb-')}@example.org"
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       form={"email": email2, "password": PASSWORD, "owner_userid": env.admin.id,
                             "active": "0", "registration_source": "form"}))
    obj = ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]
    assert obj["email"] == email2 and obj["active"] == 0
    assert obj["owner_userid"] == env.admin.id and obj["registration_source"] == "form"


def test_create_bad_input_and_duplicate_email(env):
    def create(**body):
        return env.call("POST", "/v1/user/create", who=env.admin, json_body=body)

    ui_err(create(password=PASSWORD), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org"), 400)
    for bad in ("not-an-address", "a@", "@example.org", "a b@example.org", ""):
        ui_err(create(email=bad, password=PASSWORD), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org", password=PASSWORD, active="yes"), 400)
    ui_err(create(email=f"{unique('bb-')}@example.org", password=PASSWORD, owner_userid="not-a-uuid"), 400)

    email = f"{unique('Dup-')}@Example.org"
    ui_ok(create(email=email, password=PASSWORD))
    ui_err(create(email=email, password=PASSWORD), 409)
    ui_err(create(email=email.lower(), password=PASSWORD), 409)
    ui_err(env.call("POST", "/v1/user/create", who=env.admin, data=b"{not json",
                    content_type="application/json"), 400)


PASSWORD_CASES = [
    ("Abcdefghijkl1", False),                 # 13 characters
    ("Abcdefghijkl12", True),                 # 14: letters + digits
    ("Abcdefghijklmnopqrstuv12", True),       # 24
    ("Abcdefghijklmnopqrstuv123", False),     # 25
    ("abcdefghijklmnopq", False),             # letters only
    ("12345678901234567", False),             # digits only
    ("!@#$%^&*()-_=+[]{}", False),            # punctuation only
    ("1234567890!@#$", True),                 # digits + punctuation
    ("abcdefghijklm!", True),                 # letters + punctuation
]


def test_password_rule(env):
    for password, ok in PASSWORD_CASES:
        r = env.call("POST", "/v1/user/create", who=env.admin,
                     json_body={"email": f"{unique('bb-')}@example.org", "password": password})
        if ok:
            ui_ok(r)
        else:
            ui_err(r, 400)


def test_create_permission_and_ownership(env):
    plain = env.user()
    ui_err(env.call("POST", "/v1/user/create", who=plain,
                    json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD}), 403)

    creator, other = env.users({"roles": ["create_user"]}, {})
    d = ui_ok(env.call("POST", "/v1/user/create", who=creator,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD}))
    assert ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=env.admin))["user"]["owner_userid"] == creator.id
    d = ui_ok(env.call("POST", "/v1/user/create", who=creator,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                                  "owner_userid": creator.id}))
    assert ui_ok(env.call("GET", f"/v1/user/view/{d['userid']}", who=creator))["user"]["owner_userid"] == creator.id
    ui_err(env.call("POST", "/v1/user/create", who=creator,
                    json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                               "owner_userid": other.id}), 403)
    # the superuser may name any owner
    d = ui_ok(env.call("POST", "/v1/user/create", who=env.admin,
                       json_body={"email": f"{unique('bb-')}@example.org", "password": PASSWORD,
                                  "owner_userid": other.id}))
    assert user_obj(env, other, User(id=d["userid"], email="", password=""))["owner_userid"] == other.id


# ===========================================================================
# User interface: view, fields, superuser-only fields
# ===========================================================================

def test_view_permissions(env):
    owner = env.user()
    managed, stranger, viewer = env.users({"owner": owner}, {"login": False}, {"roles": ["view_user"]})
    grandchild = env.user(owner=managed, login=False)
    for path in (f"/v1/user/view/{owner.id}",):
        assert ui_ok(env.call("GET", path, who=owner))["user"]["id"] == owner.id
        assert ui_ok(env.call("POST", path, who=owner))["user"]["id"] == owner.id
    assert user_obj(env, owner, managed)["owner_userid"] == owner.id
    ui_err(env.call("GET", f"/v1/user/view/{stranger.id}", who=owner), 403)
    ui_err(env.call("GET", f"/v1/user/view/{owner.id}", who=managed), 403)  # not upward
    ui_err(env.call("GET", f"/v1/user/view/{stranger.id}", who=viewer), 403)  # role does not widen
    ui_err(env.call("GET", f"/v1/user/view/{grandchild.id}", who=owner), 403)  # only direct ownership
    ui_err(env.call("GET", f"/v1/user/view/{uuid.uuid4()}", who=env.admin), 404)
    ui_err(env.call("GET", "/v1/user/view/not-a-uuid", who=env.admin), 404)
    assert user_obj(env, env.admin, stranger)["id"] == stranger.id


def test_user_object_fields_and_superuser_only_fields(env):
    owner = env.user()
    managed, _ = env.users({"owner": owner, "name": "Managed One", "login": False}, {"owner": owner, "login": False})

    as_owner = user_obj(env, owner, managed)
    assert not (set(as_owner) & SUPERUSER_FIELDS), as_owner
    assert {"id", "email", "name", "active", "owner_userid", "system_accounts", "created_at_utc"} <= set(as_owner)
    assert as_owner["name"] == "Managed One" and isinstance(as_owner["active"], int)
    assert DATE_TIME.match(as_owner["created_at_utc"])
    assert not (set(user_obj(env, owner, owner)) & SUPERUSER_FIELDS)

    as_admin = user_obj(env, env.admin, owner)
    assert SUPERUSER_FIELDS <= set(as_admin)
    assert as_admin["num_owned_accounts"] == 2
    assert isinstance(as_admin["roles"], list) and isinstance(as_admin["api_key"], str) and as_admin["api_key"]

    for u in ui_ok(env.call("GET", "/v1/user/list", who=owner))["users"]:
        assert not (set(u) & SUPERUSER_FIELDS), u


def test_system_accounts_in_user_object(env):
    u = env.user()
    acct = env.enable(u)
    assert set(acct) == {"id", "username", "uuid", "cloud_controller_id"}
    assert type(acct["id"]) is int and is_uuid(acct["uuid"]) and acct["username"] == u.username
    cp = configparser.ConfigParser()
    cp.read(env.config)
    assert acct["cloud_controller_id"] == cp.getint("controller", "id")
    assert user_obj(env, u, u)["system_accounts"] == [acct]
    assert user_obj(env, env.admin, u)["system_accounts"] == [acct]


# ===========================================================================
# User interface: update
# ===========================================================================

def test_update(env):
    owner = env.user()
    managed, stranger = env.users({"owner": owner}, {"login": False})

    new_email = f"{unique('upd-')}@example.org"
    ui_ok(env.call("POST", f"/v1/user/update/{owner.id}", who=owner,
                   json_body={"email": new_email, "name": "New Name"}), data=False)
    obj = user_obj(env, owner, owner)
    assert obj["email"] == new_email and obj["name"] == "New Name"

    ui_ok(env.call("POST", f"/v1/user/update/{managed.id}", who=owner, form={"name": "Form Name"}), data=False)
    obj = user_obj(env, owner, managed)
    assert obj["name"] == "Form Name" and obj["email"] == managed.email  # only given properties change

    ui_err(env.call("POST", f"/v1/user/update/{stranger.id}", who=owner, json_body={"name": "x"}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=managed, json_body={"name": "x"}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"active": 1}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{managed.id}", who=owner, json_body={"active": 0}), 403)
    ui_err(env.call("POST", f"/v1/user/update/{uuid.uuid4()}", who=env.admin, json_body={"name": "x"}), 404)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"email": "nope"}), 400)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner, json_body={"email": stranger.email}), 409)
    ui_err(env.call("POST", f"/v1/user/update/{owner.id}", who=owner,
                    json_body={"email": stranger.email.upper()}), 409)
    r = env.call("GET", f"/v1/user/update/{owner.id}", who=owner)
    ui_err(r, 405)
    assert "POST" in r.allow() and "GET" not in r.allow()


def test_update_role_holder_does_not_reach_strangers(env):
    updater, stranger = env.user(roles=["update_user"]), env.user(login=False)
    ui_err(env.call("POST", f"/v1/user/update/{stranger.id}", who=updater, json_body={"name": "x"}), 403)


def test_active_by_superuser_json_and_form(env):
    u = env.user(login=False)
    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, form={"active": "0"}), data=False)
    assert user_obj(env, env.admin, u)["active"] == 0
    ui_err(env.token(email=u.email, password=u.password), 401)
    ui_ok(env.call("POST", f"/v1/user/update/{u.id}", who=env.admin, json_body={"active": 2}), data=False)
    assert user_obj(env, env.admin, u)["active"] > 0
    ui_ok(env.token(email=u.email, password=u.password))


# ===========================================================================
# User interface: list and show_inactive
# ===========================================================================

def ids(users):
    return {u["id"] for u in users}


def test_list_for_non_superuser_is_self_and_owned(env):
    owner = env.user()
    m1, m2, _ = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False}, {"login": False})
    env.user(owner=m1, login=False)  # owned by a managed user, not by owner
    for r in (env.call("GET", "/v1/user/list", who=owner), env.call("POST", "/v1/user/list", who=owner),
              env.call("POST", "/v1/user/list", who=owner, json_body={})):
        d = ui_ok(r)
        assert d["total"] == len(d["users"])
        assert ids(d["users"]) == {owner.id, m1.id, m2.id}


def test_list_inactive_and_show_inactive(env):
    owner = env.user()
    active_m, inactive_m = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False, "active": 0})

    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin))
    assert d["total"] == len(d["users"])
    assert {owner.id, active_m.id} <= ids(d["users"]) and inactive_m.id not in ids(d["users"])

    for value in ("1", "true", "yes", ""):
        d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"show_inactive": value}))
        assert inactive_m.id in ids(d["users"]), value
    for value in ("0", "false"):
        d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"show_inactive": value}))
        assert inactive_m.id not in ids(d["users"]), value
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, form={"show_inactive": "1"}))
    assert inactive_m.id in ids(d["users"])
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"show_inactive": True}))
    assert inactive_m.id in ids(d["users"])
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"show_inactive": False}))
    assert inactive_m.id not in ids(d["users"])

    # the owner never gets the inactive managed user; it may not ask
    assert inactive_m.id not in ids(ui_ok(env.call("GET", "/v1/user/list", who=owner))["users"])
    ui_err(env.call("GET", "/v1/user/list", who=owner, query={"show_inactive": "1"}), 403)


def test_list_superuser_filters(env):
    owner = env.user()
    m1, m2 = env.users({"owner": owner, "login": False}, {"owner": owner, "login": False, "active": 0})
    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin, query={"owner_userid": owner.id}))
    assert ids(d["users"]) == {m1.id} and d["total"] == 1
    d = ui_ok(env.call("GET", "/v1/user/list", who=env.admin,
                       query={"owner_userid": owner.id, "show_inactive": "1"}))
    assert ids(d["users"]) == {m1.id, m2.id} and d["total"] == 2

    source = unique("src-")
    tagged = env.user(registration_source=source, login=False)
    d = ui_ok(env.call("POST", "/v1/user/list", who=env.admin, json_body={"registration_source": source}))
    assert ids(d["users"]) == {tagged.id}
    for u in d["users"]:
        assert DATE_TIME.match(u["created_at_utc"]) and SUPERUSER_FIELDS <= set(u)

    for q in ({"owner_userid": owner.id}, {"registration_source": source}, {"show_inactive": "1"},
              {"owner_userid": m1.id}):
        ui_err(env.call("GET", "/v1/user/list", who=owner, query=q), 403)


# ===========================================================================
# User interface: search
# ===========================================================================

def test_search_by_email_and_by_username(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True, "login": False},
                                  {"account": True, "login": False})

    for r in (env.call("GET", "/v1/user/search", who=owner, query={"email": managed.email}),
              env.call("POST", "/v1/user/search", who=owner, form={"email": managed.email}),
              env.call("POST", "/v1/user/search", who=owner, json_body={"email": managed.email})):
        d = ui_ok(r)
        assert ids(d["users"]) == {managed.id} and d["total"] == 1
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"username": managed.username}))
    assert ids(d["users"]) == {managed.id} and d["total"] == 1
    assert d["users"][0]["system_accounts"][0]["username"] == managed.username

    d = ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"username": stranger.username}))
    assert ids(d["users"]) == {stranger.id}
    assert SUPERUSER_FIELDS <= set(d["users"][0])
    d = ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"email": f"nobody-{uuid.uuid4().hex}@x.org"}))
    assert d["users"] == [] and d["total"] == 0

    # a user the requester may not view is not returned
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"email": stranger.email}))
    assert d["users"] == [] and d["total"] == 0
    d = ui_ok(env.call("GET", "/v1/user/search", who=owner, query={"username": stranger.username}))
    assert d["users"] == []

    ui_err(env.call("GET", "/v1/user/search", who=owner), 400)
    ui_err(env.call("POST", "/v1/user/search", who=owner, json_body={}), 400)


# ===========================================================================
# User interface: set_password, view/reset api secret, delete
# ===========================================================================

def test_set_password(env):
    u, owner = env.user(login=False), env.user()
    managed = env.user(owner=owner, login=False)
    ui_ok(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin,
                   form={"password": "Form-password-9"}), data=False)
    ui_err(env.token(email=u.email, password=PASSWORD), 401)
    ui_ok(env.token(email=u.email, password="Form-password-9"))

    ui_err(env.call("POST", f"/v1/user/set_password/{managed.id}", who=owner,
                    json_body={"password": "Owner-password-9"}), 403)
    ui_err(env.call("POST", f"/v1/user/set_password/{owner.id}", who=owner,
                    json_body={"password": "Owner-password-9"}), 403)
    ui_err(env.call("POST", f"/v1/user/set_password/{uuid.uuid4()}", who=env.admin,
                    json_body={"password": "Owner-password-9"}), 404)
    ui_err(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin, json_body={"password": "short1!"}), 400)
    ui_err(env.call("POST", f"/v1/user/set_password/{u.id}", who=env.admin, json_body={}), 400)
    r = env.call("GET", f"/v1/user/set_password/{u.id}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()


def test_view_api_secret(env):
    owner, stranger, keeper = env.users({}, {"login": False}, {"roles": ["view_user_secret"]})
    managed, kept = env.users({"owner": owner, "login": False}, {"owner": keeper, "login": False})

    s1 = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{managed.id}", who=env.admin))
    s2 = ui_ok(env.call("POST", f"/v1/user/view_api_secret/{managed.id}", who=env.admin))
    assert set(s1) == {"api_secret"} and isinstance(s1["api_secret"], str) and s1 == s2

    ui_err(env.call("GET", f"/v1/user/view_api_secret/{managed.id}", who=owner), 403)
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{owner.id}", who=owner), 403)
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{kept.id}", who=keeper))["api_secret"]
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{keeper.id}", who=keeper))["api_secret"]
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{stranger.id}", who=keeper), 403)
    ui_err(env.call("GET", f"/v1/user/view_api_secret/{uuid.uuid4()}", who=env.admin), 404)


def test_reset_api_secret(env):
    u, owner = env.user(login=False), env.user()
    managed = env.user(owner=owner, login=False)
    old = ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"]
    new = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, form={}))["api_secret"]
    assert isinstance(new, str) and new != old
    assert ui_ok(env.call("GET", f"/v1/user/view_api_secret/{u.id}", who=env.admin))["api_secret"] == new

    d = ui_ok(env.call("POST", f"/v1/user/reset_api_secret/{u.id}", who=env.admin, form={"set_to_null": "1"}))
    assert d["api_secret"] is None
    key = user_obj(env, env.admin, u)["api_key"]
    ui_err(env.token(api_key=key, api_secret=new), 401)

    ui_err(env.call("POST", f"/v1/user/reset_api_secret/{managed.id}", who=owner), 403)
    ui_err(env.call("POST", f"/v1/user/reset_api_secret/{uuid.uuid4()}", who=env.admin), 404)
    r = env.call("GET", f"/v1/user/reset_api_secret/{u.id}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()


def test_delete_user(env):
    owner = env.user()
    managed = env.user(owner=owner, login=False)
    victim = env.user()
    ui_err(env.call("POST", f"/v1/user/delete/{managed.email}", who=owner), 403)
    ui_err(env.call("POST", f"/v1/user/delete/{unique('gone-')}@example.org", who=env.admin), 404)
    r = env.call("GET", f"/v1/user/delete/{victim.email}", who=env.admin)
    ui_err(r, 405)
    assert "POST" in r.allow()

    ui_ok(env.call("POST", f"/v1/user/delete/{victim.email}", who=env.admin), data=False)
    ui_err(env.call("GET", f"/v1/user/view/{victim.id}", who=env.admin), 404)
    ui_err(env.call("GET", f"/v1/user/view/{victim.id}", who=victim), 401)  # its token died
    ui_err(env.call("POST", f"/v1/user/delete/{victim.email}", who=env.admin), 404)


def test_delete_user_409_while_volume_or_account(env):
    u = env.user(account=True)
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # system account
    vol = env.volume(u)
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # volume (and account)
    cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=u))
    ui_err(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), 409)  # still an account
    cp = env.agent_raw("account", "disable", u.email, "--yes")
    assert cp.returncode == 0, cp.stderr
    json.loads(cp.stdout)
    ui_ok(env.call("POST", f"/v1/user/delete/{u.email}", who=env.admin), data=False)


def test_user_interface_405_and_bad_bodies(env):
    u = env.user()
    r = env.call("PUT", "/v1/user/list", who=u)
    ui_err(r, 405)
    assert {"GET", "POST"} <= r.allow()
    r = env.call("GET", "/v1/user/create", who=u)
    ui_err(r, 405)
    assert "POST" in r.allow() and "GET" not in r.allow()
    ui_err(env.call("POST", "/v1/user/list", who=u, data=b"{oops", content_type="application/json"), 400)


# ===========================================================================
# Body limits and content types (CONTRACT 5)
# ===========================================================================

def test_413_on_both_interfaces(env):
    u = env.user(account=True)
    big = "x" * (1024 * 1024 + 10)
    r = env.call("POST", "/v1/storage-volume", who=u,
                 json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": big})
    cc_err(r, 413)
    r = env.call("POST", "/v1/user/create", who=env.admin,
                 json_body={"email": f"{unique('big-')}@example.org", "password": PASSWORD, "name": big})
    ui_err(r, 413)


def test_415_and_400_on_controller_bodies(env):
    u = env.user(account=True)
    body = json.dumps({"volume-size": 1, "volume-type": {"visibility": "cluster"}}).encode()
    cc_err(env.call("POST", "/v1/storage-volume", who=u, data=body, content_type="text/plain"), 415)
    cc_err(env.call("POST", "/v1/storage-volume", who=u, data=b"{not json", content_type="application/json"), 400)
    cc_err(env.call("POST", "/v1/storage-volume", who=u, json_body=[1, 2]), 400)


# ===========================================================================
# Images and flavors
# ===========================================================================

def test_images_visibility_and_fields(env, catalog):
    u = env.user()
    listed = {i["id"]: i for i in cc_ok(env.call("GET", "/v1/server-image", who=u))}
    assert catalog["public"]["id"] in listed
    assert catalog["inactive"]["id"] in listed and listed[catalog["inactive"]["id"]]["active"] is False
    assert catalog["private"]["id"] not in listed
    for img in listed.values():
        assert set(img) == IMAGE_FIELDS, img
        assert set(img["operating-system"]) == {"name", "major_version", "minor_version"}
        assert all(isinstance(v, str) for v in img["operating-system"].values())
        assert isinstance(img["min-disk"], int) and isinstance(img["min-ram"], int)
        assert isinstance(img["public"], bool) and isinstance(img["active"], bool)
        assert DATE_TIME.match(img["creation-date"])
    assert cc_ok(env.call("GET", f"/v1/server-image/{catalog['public']['id']}", who=u)) == [
        listed[catalog["public"]["id"]]]
    cc_err(env.call("GET", f"/v1/server-image/{catalog['private']['id']}", who=u), 404)
    cc_err(env.call("GET", f"/v1/server-image/{uuid.uuid4()}", who=u), 404)
    cc_err(env.call("GET", "/v1/server-image/not-a-uuid", who=u), 404)

    admin_list = {i["id"] for i in cc_ok(env.call("GET", "/v1/server-image", who=env.admin))}
    assert catalog["private"]["id"] in admin_list


def test_image_grant_activate_deactivate_match_api(env, catalog):
    u = env.user()
    img = env.agent("image", "add", "--name", unique("img-"), "--os-name", "rocky", "--os-major", "9",
                    "--os-minor", "3", "--min-disk", "1", "--min-ram", "256", "--private")
    assert img["public"] is False and img["active"] is True
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]
    cc_err(env.call("GET", f"/v1/server-image/{img['id']}", who=u), 404)

    granted = env.agent("image", "grant", img["id"], u.email)
    assert granted == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=u))[0]["id"] == img["id"]
    assert img["id"] in {i["id"] for i in cc_ok(env.call("GET", "/v1/server-image", who=u))}
    env.enable(u)
    env.volume(u)
    booted = cc_ok(env.call("POST", "/v1/server-instance", who=u,
                            json_body={"server-image": img["id"], "server-flavor": catalog["small"]["id"]}), 201)
    assert booted[0]["server-image"] == img["id"]

    off = env.agent("image", "deactivate", img["id"])
    assert off["active"] is False and off == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]
    on = env.agent("image", "activate", img["id"])
    assert on["active"] is True and on == cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin))[0]


def test_flavors(env, catalog):
    u = env.user()
    listed = {f["id"]: f for f in cc_ok(env.call("GET", "/v1/server-flavor", who=u))}
    small = catalog["small"]
    assert listed[small["id"]] == small
    for f in listed.values():
        assert set(f) == FLAVOR_FIELDS and isinstance(f["id"], str)
        assert all(isinstance(f[k], int) for k in ("memory", "disk", "vcpu"))
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{small['id']}", who=u)) == [small]
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{small['id']}", who=env.admin)) == [small]
    cc_err(env.call("GET", "/v1/server-flavor/987654", who=u), 404)


def test_images_and_flavors_are_read_only(env, catalog):
    u = env.user()
    for method, path in (("POST", "/v1/server-image"), ("DELETE", f"/v1/server-image/{catalog['public']['id']}"),
                         ("PUT", f"/v1/server-image/{catalog['public']['id']}"), ("POST", "/v1/server-flavor"),
                         ("DELETE", f"/v1/server-flavor/{catalog['small']['id']}")):
        r = env.call(method, path, who=u, json_body={} if method != "DELETE" else None)
        cc_err(r, 405)
        # OPTIONS/HEAD are HTTP metadata methods; nothing that changes state may be offered
        assert "GET" in r.allow() and r.allow() <= {"GET", "HEAD", "OPTIONS"}, (path, r.headers.get("allow"))


# ===========================================================================
# Storage volumes
# ===========================================================================

def test_volume_needs_account_and_one_per_user(env):
    no_account, u = env.users({}, {"account": True})
    cc_err(env.call("POST", "/v1/storage-volume", who=no_account,
                    json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)
    env.volume(u)
    cc_err(env.call("POST", "/v1/storage-volume", who=u,
                    json_body={"volume-size": 1, "volume-type": {"visibility": "cluster"}}), 409)


def test_volume_create_on_disk(env):
    u, other = env.users({"account": True}, {"account": True})
    vol = env.volume(u, size=3, **{"volume-name": "my home"})
    assert VOLUME_REQUIRED <= set(vol) <= VOLUME_FIELDS, vol
    assert is_uuid(vol["volume-id"]) and vol["cloudauth-id"] == u.id and vol["volume-size"] == 3
    assert vol["volume-name"] == "my home" and DATE_TIME.match(vol["creation-date"])
    home = env.home(u.username)
    assert vol["volume-type"] == {"visibility": "cluster", "mount-point": str(home)}
    st = home.stat()
    assert home.is_dir() and not home.is_symlink()
    assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
    assert st.st_mode & 0o7777 == 0o700
    got = cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))
    assert got == [vol]

    v2 = env.volume(other)
    assert v2.get("volume-name") is None


VOLUME_BAD_BODIES = [
    {"volume-size": 0, "volume-type": {"visibility": "cluster"}},
    {"volume-size": -1, "volume-type": {"visibility": "cluster"}},
    {"volume-size": "1", "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1.5, "volume-type": {"visibility": "cluster"}},
    {"volume-size": True, "volume-type": {"visibility": "cluster"}},
    {"volume-size": 1, "volume-type": {"visibility": "local"}},
    {"volume-size": 1, "volume-type": {}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster", "extra": 1}},
    {"volume-size": 1},
    {"volume-type": {"visibility": "cluster"}},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "colour": "red"},
    {"volume-size": 1, "volume-type": {"visibility": "cluster"}, "volume-name": 7},
]


def test_volume_bad_bodies(env):
    u = env.user(account=True)
    for body in VOLUME_BAD_BODIES:
        r = env.call("POST", "/v1/storage-volume", who=u, json_body=body)
        assert r.status == 400, (body, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", "/v1/storage-volume", who=u)) == []
    assert not env.home(u.username).exists()


def test_volume_size_bounds(env):
    top = max_size_gb(env)
    u, v = env.users({"account": True}, {"account": True})
    cc_err(env.call("POST", "/v1/storage-volume", who=u,
                    json_body={"volume-size": top + 1, "volume-type": {"visibility": "cluster"}}), 400)
    assert env.volume(u, size=top)["volume-size"] == top
    assert env.volume(v, size=1)["volume-size"] == 1


def test_volume_visibility_and_delete_rights(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True})
    grandchild = env.user(owner=managed, account=True)
    v_grandchild = env.volume(grandchild)
    v_owner, v_managed, v_stranger = env.volume(owner), env.volume(managed), env.volume(stranger)

    def listed(who, **query):
        return {v["volume-id"] for v in cc_ok(env.call("GET", "/v1/storage-volume", who=who, query=query or None))}

    assert listed(owner) == {v_owner["volume-id"], v_managed["volume-id"]}  # not the grandchild's
    assert listed(managed) == {v_managed["volume-id"], v_grandchild["volume-id"]}
    assert {v_owner["volume-id"], v_managed["volume-id"], v_stranger["volume-id"]} <= listed(env.admin)
    assert listed(env.admin, **{"cloudauth-id": managed.id}) == {v_managed["volume-id"]}
    assert listed(owner, **{"cloudauth-id": managed.id}) == {v_managed["volume-id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/storage-volume", who=owner, query={"cloudauth-id": "nope"}), 400)

    cc_err(env.call("GET", f"/v1/storage-volume/{v_owner['volume-id']}", who=stranger), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{v_owner['volume-id']}", who=managed), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{v_grandchild['volume-id']}", who=owner), 404)
    cc_err(env.call("DELETE", f"/v1/storage-volume/{v_owner['volume-id']}", who=stranger), 404)
    cc_err(env.call("GET", "/v1/storage-volume/not-a-uuid", who=owner), 404)
    cc_err(env.call("GET", f"/v1/storage-volume/{uuid.uuid4()}", who=owner), 404)

    r = env.call("PUT", f"/v1/storage-volume/{v_owner['volume-id']}", who=owner, json_body={"volume-size": 2})
    cc_err(r, 405)
    assert "PUT" not in r.allow() and {"GET", "DELETE"} <= r.allow()

    # the owner's owner may delete; the directory goes
    assert env.home(managed.username).is_dir()
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{v_managed['volume-id']}", who=owner)) == []
    assert not env.home(managed.username).exists()
    cc_err(env.call("GET", f"/v1/storage-volume/{v_managed['volume-id']}", who=env.admin), 404)


def test_volume_delete_does_not_follow_symlinks(env, tmp_path):
    u = env.user(account=True)
    vol = env.volume(u)
    home = env.home(u.username)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (home / "sub").mkdir()
    (home / "sub" / "data").write_text("user data")
    (home / "link").symlink_to(outside)
    (home / "sub" / "filelink").symlink_to(outside / "keep.txt")
    assert cc_ok(env.call("DELETE", f"/v1/storage-volume/{vol['volume-id']}", who=u)) == []
    assert not home.exists() and not home.is_symlink()
    assert (outside / "keep.txt").read_text() == "keep"


def test_volume_resize_by_agent_matches_api(env):
    u = env.user(account=True)
    vol = env.volume(u, size=2)
    out = env.agent("volume", "resize", vol["volume-id"], "5")
    assert out["volume-size"] == 5
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=env.admin)) == [out]
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))[0]["volume-size"] == 5


# ===========================================================================
# Server-instances
# ===========================================================================

def boot(env, who, catalog, **extra):
    return env.call("POST", "/v1/server-instance", who=who,
                    json_body={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"],
                               **extra})


def ready_user(env, **kw):
    u = env.user(account=True, **kw)
    env.volume(u)
    return u


def ready_users(env, *specs):
    users = env.users(*({"account": True, **spec} for spec in specs))
    for u in users:
        env.volume(u)
    return users


def test_instance_needs_account_and_volume(env, catalog):
    bare, enabled = env.users({}, {"account": True})
    cc_err(boot(env, bare, catalog), 409)
    cc_err(boot(env, enabled, catalog), 409)


def test_instance_create_fields_and_get(env, catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, catalog), 201)
    assert len(inst) == 1
    inst = inst[0]
    assert INSTANCE_REQUIRED <= set(inst) <= INSTANCE_FIELDS, inst
    assert is_uuid(inst["id"]) and inst["cloudauth-id"] == u.id
    assert inst["users"] == [u.account_uuid]
    assert inst["server-image"] == catalog["public"]["id"] and inst["server-flavor"] == catalog["small"]["id"]
    assert DATE_TIME.match(inst["creation-date"])
    assert inst["status"] == "running"  # 201 comes once the domain is started
    for key in ("public-ip", "private-ip"):
        if key in inst:
            ipaddress.ip_address(inst[key])
    if "hostname" in inst:
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", inst["hostname"]), inst["hostname"]
    assert cc_ok(env.call("GET", f"/v1/server-instance/{inst['id']}", who=u)) == [inst]
    second = cc_ok(boot(env, u, catalog), 201)[0]  # several instances per user
    listed = {i["id"] for i in cc_ok(env.call("GET", "/v1/server-instance", who=u))}
    assert listed == {inst["id"], second["id"]}


def instance_bad_body(catalog, case, u):
    body = {"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]}
    if case == "unknown-image":
        body["server-image"] = str(uuid.uuid4())
    elif case == "non-uuid-image":
        body["server-image"] = "debian"
    elif case == "inactive-image":
        body["server-image"] = catalog["inactive"]["id"]
    elif case == "private-image":
        body["server-image"] = catalog["private"]["id"]
    elif case == "unknown-flavor":
        body["server-flavor"] = "987654"
    elif case == "small-flavor":
        body["server-flavor"] = catalog["tiny"]["id"]
    elif case == "image-needs-more-disk":
        body["server-image"] = catalog["big-disk"]["id"]
    elif case == "extra-property":
        body["name"] = "vm"
    elif case == "missing-flavor":
        del body["server-flavor"]
    elif case == "users-not-array":
        body["users"] = u.account_uuid
    elif case == "image-not-string":
        body["server-image"] = 5
    elif case == "flavor-as-integer":  # spec 4.1: server-flavor is a string
        body["server-flavor"] = int(catalog["small"]["id"])
    return body


def test_instance_bad_requests(env, catalog):
    u = ready_user(env)
    for case in ("unknown-image", "non-uuid-image", "inactive-image", "private-image", "unknown-flavor",
                 "small-flavor", "image-needs-more-disk", "extra-property", "missing-flavor", "users-not-array",
                 "image-not-string", "flavor-as-integer"):
        r = env.call("POST", "/v1/server-instance", who=u, json_body=instance_bad_body(catalog, case, u))
        assert r.status == 400, (case, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", "/v1/server-instance", who=u)) == []


def test_instance_users_grants(env, catalog):
    owner = ready_user(env)
    managed, stranger = env.users({"owner": owner, "account": True, "login": False},
                                  {"account": True, "login": False})
    cc_err(boot(env, owner, catalog, users=[str(uuid.uuid4())]), 400)
    cc_err(boot(env, owner, catalog, users=[stranger.account_uuid]), 403)
    inst = cc_ok(boot(env, owner, catalog, users=[managed.account_uuid]), 201)[0]
    assert sorted(inst["users"]) == sorted([owner.account_uuid, managed.account_uuid])
    inst = cc_ok(boot(env, owner, catalog, users=[owner.account_uuid]), 201)[0]
    assert inst["users"] == [owner.account_uuid]

    admin_ready = ready_user(env, roles=["superuser"])
    inst = cc_ok(boot(env, admin_ready, catalog, users=[stranger.account_uuid]), 201)[0]
    assert sorted(inst["users"]) == sorted([admin_ready.account_uuid, stranger.account_uuid])


def test_instance_power_states(env, catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"

    def task(what, status=200):
        r = env.call("PUT", path, who=u, json_body={"task": {"what": what}})
        if status == 200:
            data = cc_ok(r)
            assert len(data) == 1 and data[0]["id"] == inst["id"]
            assert data[0]["status"] in INSTANCE_STATUSES
            return data[0]
        cc_err(r, status)
        return None

    assert task("reboot")["status"] == "running"
    assert task("power-off")["status"] == "shutoff"
    assert task("power-off")["status"] == "shutoff"  # already off: success, no change
    task("reboot", 409)
    assert cc_ok(env.call("GET", path, who=u))[0]["status"] == "shutoff"
    assert task("power-on")["status"] == "running"
    assert task("power-on")["status"] == "running"
    assert task("reboot")["status"] == "running"


INSTANCE_BAD_PUTS = [
    {},
    {"task": {"what": "explode"}},
    {"task": {"what": "reboot"}, "extra": 1},
    {"task": {"what": "reboot", "how": "add"}},
    {"task": {"what": "modify-users", "how": "add"}},
    {"task": {"what": "modify-users", "users": []}},
    {"task": {"what": "modify-users", "how": "merge", "users": []}},
    {"task": {"what": "modify-users", "how": "add", "users": [], "x": 1}},
    {"task": "reboot"},
]


def test_instance_put_bad_bodies(env, catalog):
    u = ready_user(env)
    inst = cc_ok(boot(env, u, catalog), 201)[0]
    for body in INSTANCE_BAD_PUTS:
        r = env.call("PUT", f"/v1/server-instance/{inst['id']}", who=u, json_body=body)
        assert r.status == 400, (body, r.status, r.body)
        cc_err(r, 400)
    assert cc_ok(env.call("GET", f"/v1/server-instance/{inst['id']}", who=u)) == [inst]


def test_instance_modify_users(env, catalog):
    owner = ready_user(env)
    m1, m2, stranger = env.users({"owner": owner, "account": True, "login": False},
                                 {"owner": owner, "account": True, "login": False},
                                 {"account": True, "login": False})
    inst = cc_ok(boot(env, owner, catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"

    def modify(how, users, status=200):
        r = env.call("PUT", path, who=owner, json_body={"task": {"what": "modify-users", "how": how, "users": users}})
        if status != 200:
            cc_err(r, status)
            return None
        data = cc_ok(r)
        assert len(data) == 1
        return sorted(data[0]["users"])

    o, a, b = owner.account_uuid, m1.account_uuid, m2.account_uuid
    assert modify("add", [a]) == sorted([o, a])
    assert modify("add", [b]) == sorted([o, a, b])
    assert modify("delete", [a]) == sorted([o, b])
    assert modify("delete", [o]) == sorted([o, b])  # the owner stays
    assert modify("replace", [a]) == sorted([o, a])
    assert modify("replace", []) == [o]
    modify("add", [str(uuid.uuid4())], 400)
    modify("add", [stranger.account_uuid], 403)
    assert sorted(cc_ok(env.call("GET", path, who=owner))[0]["users"]) == [o]


def test_instance_visibility_and_delete(env, catalog):
    owner = ready_user(env)
    managed, stranger = ready_users(env, {"owner": owner}, {})
    i_owner = cc_ok(boot(env, owner, catalog), 201)[0]
    i_managed = cc_ok(boot(env, managed, catalog), 201)[0]
    i_stranger = cc_ok(boot(env, stranger, catalog), 201)[0]

    def listed(who, **query):
        return {i["id"] for i in cc_ok(env.call("GET", "/v1/server-instance", who=who, query=query or None))}

    assert listed(managed) == {i_managed["id"]}
    assert listed(owner) == {i_owner["id"], i_managed["id"]}
    assert {i_owner["id"], i_managed["id"], i_stranger["id"]} <= listed(env.admin)
    assert listed(owner, **{"cloudauth-id": managed.id}) == {i_managed["id"]}
    assert listed(env.admin, **{"cloudauth-id": stranger.id}) == {i_stranger["id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/server-instance", who=owner, query={"cloudauth-id": "abc"}), 400)

    for method, body in (("GET", None), ("PUT", {"task": {"what": "power-off"}}), ("DELETE", None)):
        cc_err(env.call(method, f"/v1/server-instance/{i_owner['id']}", who=stranger, json_body=body), 404)
        cc_err(env.call(method, f"/v1/server-instance/{i_owner['id']}", who=managed, json_body=body), 404)
    cc_err(env.call("GET", "/v1/server-instance/not-a-uuid", who=owner), 404)
    cc_err(env.call("DELETE", f"/v1/server-instance/{uuid.uuid4()}", who=owner), 404)

    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_managed['id']}", who=owner)) == []
    cc_err(env.call("GET", f"/v1/server-instance/{i_managed['id']}", who=managed), 404)
    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_stranger['id']}", who=env.admin)) == []
    assert cc_ok(env.call("DELETE", f"/v1/server-instance/{i_owner['id']}", who=owner)) == []
    assert listed(owner) == set()


def test_controller_405_has_allow(env):
    u = env.user()
    r = env.call("PATCH", "/v1/server-instance", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "POST"} <= r.allow()
    r = env.call("POST", f"/v1/server-instance/{uuid.uuid4()}", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "PUT", "DELETE"} <= r.allow()
    r = env.call("PUT", "/v1/group", who=u, json_body={})
    cc_err(r, 405)
    assert {"GET", "POST"} <= r.allow()


# ===========================================================================
# Groups
# ===========================================================================

def make_group(env, who, name, members=None, status=201):
    body = {"group-name": name}
    if members is not None:
        body["group-members"] = members
    r = env.call("POST", "/v1/group", who=who, json_body=body)
    if status != 201:
        cc_err(r, status)
        return None
    data = cc_ok(r, 201)
    assert len(data) == 1
    return data[0]


def test_group_lifecycle_on_the_host(env):
    owner = env.user(account=True)
    m1, m2 = env.users({"owner": owner, "account": True, "login": False},
                       {"owner": owner, "account": True, "login": False})
    name = unique("g")
    g = make_group(env, owner, name, [owner.username])
    assert set(g) == GROUP_FIELDS
    assert is_uuid(g["group-id"]) and g["cloudauth-id"] == owner.id and g["group-name"] == name
    assert g["group-members"] == [owner.username]
    assert env.group_line(name)[1] == [owner.username]
    gid = env.group_line(name)[0]
    path = f"/v1/group/{g['group-id']}"

    def put(action, members):
        data = cc_ok(env.call("PUT", path, who=owner, json_body={"action": action, "group-members": members}))
        assert len(data) == 1 and data[0]["group-id"] == g["group-id"]
        line = env.group_line(name)
        assert line[0] == gid
        assert sorted(data[0]["group-members"]) == line[1]
        return line[1]

    assert put("add", [m1.username]) == sorted([owner.username, m1.username])
    assert put("add", [m2.username]) == sorted([owner.username, m1.username, m2.username])
    assert put("delete", [owner.username]) == sorted([m1.username, m2.username])
    assert put("replace", [owner.username]) == [owner.username]
    assert put("replace", []) == []
    assert cc_ok(env.call("GET", path, who=owner))[0]["group-members"] == []

    gshadow = (env.sandbox / "sysroot" / "etc" / "gshadow").read_text()
    assert any(line.startswith(name + ":") for line in gshadow.splitlines())  # made by the shadow tools
    assert cc_ok(env.call("DELETE", path, who=owner)) == []
    assert env.group_line(name) is None
    gshadow = (env.sandbox / "sysroot" / "etc" / "gshadow").read_text()
    assert not any(line.startswith(name + ":") for line in gshadow.splitlines())
    cc_err(env.call("GET", path, who=owner), 404)


def test_group_without_members(env):
    u = env.user(account=True)
    name = unique("g")
    g = make_group(env, u, name)
    assert g["group-members"] == [] and env.group_line(name)[1] == []


def test_group_name_rule(env):
    u = env.user(account=True)
    for name in ("bad;name", "Upper", "1abc", "-abc", "a" * 33, "with space", "", "a.b", "x$(id)", "../etc"):
        r = env.call("POST", "/v1/group", who=u, json_body={"group-name": name})
        assert r.status == 400, (name, r.status, r.body)
        cc_err(r, 400)
        assert env.group_line(name) is None


def test_group_name_edges_and_conflicts(env):
    u = env.user(account=True)
    long_name = (unique("_g") + "x" * 32)[:32]
    assert make_group(env, u, long_name)["group-name"] == long_name
    name = unique("g")
    make_group(env, u, name)
    make_group(env, u, name, status=409)
    make_group(env, env.user(account=True), name, status=409)  # names are global
    make_group(env, u, "root", status=409)         # exists in the system root
    make_group(env, u, u.username, status=409)     # the account's primary group
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-members": []}), 400)
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-name": unique("g"), "x": 1}), 400)
    cc_err(env.call("POST", "/v1/group", who=u, json_body={"group-name": unique("g"), "group-members": "a"}), 400)


def test_group_member_authority(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True, "login": False})
    make_group(env, owner, unique("g"), [stranger.username], status=403)
    make_group(env, owner, unique("g"), [unique("nouser")], status=400)
    make_group(env, managed, unique("g"), [owner.username], status=403)  # not upward
    g = make_group(env, owner, unique("g"), [managed.username])
    path = f"/v1/group/{g['group-id']}"
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": [stranger.username]}), 403)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": ["nouser" + "zz"]}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "merge", "group-members": []}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add"}), 400)
    cc_err(env.call("PUT", path, who=owner, json_body={"action": "add", "group-members": [], "group-name": "x"}),
           400)
    assert env.group_line(g["group-name"])[1] == [managed.username]
    # the superuser may add anyone
    g2 = make_group(env, env.admin, unique("g"), [stranger.username, owner.username])
    assert env.group_line(g2["group-name"])[1] == sorted([stranger.username, owner.username])


def test_group_visibility_and_queries(env):
    owner = env.user(account=True)
    managed, stranger = env.users({"owner": owner, "account": True}, {"account": True})
    g_owner = make_group(env, owner, unique("g"))
    g_managed = make_group(env, managed, unique("g"))
    g_stranger = make_group(env, stranger, unique("g"))

    def listed(who, **query):
        return {g["group-id"] for g in cc_ok(env.call("GET", "/v1/group", who=who, query=query or None))}

    assert listed(managed) == {g_managed["group-id"]}
    assert listed(owner) == {g_owner["group-id"], g_managed["group-id"]}
    assert {g_owner["group-id"], g_managed["group-id"], g_stranger["group-id"]} <= listed(env.admin)
    assert listed(owner, **{"group-name": g_managed["group-name"]}) == {g_managed["group-id"]}
    assert listed(owner, **{"group-name": g_stranger["group-name"]}) == set()
    assert listed(env.admin, **{"group-name": g_stranger["group-name"]}) == {g_stranger["group-id"]}
    assert listed(owner, **{"cloudauth-id": managed.id}) == {g_managed["group-id"]}
    assert listed(stranger, **{"cloudauth-id": owner.id}) == set()
    cc_err(env.call("GET", "/v1/group", who=owner,
                    query={"group-name": g_owner["group-name"], "cloudauth-id": owner.id}), 400)
    cc_err(env.call("GET", "/v1/group", who=owner, query={"cloudauth-id": "x"}), 400)

    p = f"/v1/group/{g_owner['group-id']}"
    cc_err(env.call("GET", p, who=stranger), 404)
    cc_err(env.call("PUT", p, who=stranger, json_body={"action": "replace", "group-members": []}), 404)
    cc_err(env.call("DELETE", p, who=stranger), 404)
    cc_err(env.call("GET", p, who=managed), 404)
    cc_err(env.call("GET", "/v1/group/not-a-uuid", who=owner), 404)
    assert cc_ok(env.call("GET", p, who=owner)) == cc_ok(env.call("GET", p, who=env.admin))
    # the owner's owner may change and delete
    pm = f"/v1/group/{g_managed['group-id']}"
    cc_ok(env.call("PUT", pm, who=owner, json_body={"action": "add", "group-members": [managed.username]}))
    assert cc_ok(env.call("DELETE", pm, who=owner)) == []
    assert env.group_line(g_managed["group-name"]) is None


# ===========================================================================
# The agent (CONTRACT 6)
# ===========================================================================

def test_agent_init_check_and_env_config(env):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    doc = env.agent("init")  # an existing config: creates or migrates its database
    assert doc == {"database": cp.get("database", "path")} and Path(doc["database"]).exists()
    for use_env in (False, True):
        chk = env.agent("check", use_env=use_env)
        assert chk["ok"] is True and isinstance(chk["checks"], list) and chk["checks"]


def test_agent_user_grant_revoke_match_api(env):
    u = env.user()
    out = env.agent("user", "grant", u.email, "view_user_secret")
    assert "view_user_secret" in out["roles"]
    assert out == user_obj(env, env.admin, u)
    out = env.agent("user", "grant", u.email, "superuser")
    assert {"superuser", "view_user_secret"} <= set(out["roles"])
    assert SUPERUSER_FIELDS <= set(user_obj(env, u, u))  # now a superuser requester
    out = env.agent("user", "revoke", u.email, "superuser")
    assert "superuser" not in out["roles"] and out == user_obj(env, env.admin, u)
    assert not (SUPERUSER_FIELDS & set(user_obj(env, u, u)))


def test_agent_account_image_flavor_match_api(env):
    u = env.user(login=False)
    acct = env.enable(u)
    assert user_obj(env, env.admin, u)["system_accounts"] == [acct]
    fl = env.agent("flavor", "add", "--name", unique("fl-"), "--memory", "1024", "--disk", "4", "--vcpu", "2")
    assert set(fl) == FLAVOR_FIELDS
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{fl['id']}", who=env.admin)) == [fl]
    img = env.agent("image", "add", "--name", unique("img-"), "--os-name", "alma", "--os-major", "9",
                    "--os-minor", "4", "--min-disk", "1", "--min-ram", "512", "--inactive")
    assert img["active"] is False and img["public"] is True
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]


def test_agent_create_superuser(env):
    email = f"{unique('su-')}@example.org"
    out = env.agent("user", "create-superuser", "--email", email, "--password", "Second-admin-1")
    assert set(out) == {"userid", "api_key", "api_secret"}
    d = ui_ok(env.token(api_key=out["api_key"], api_secret=out["api_secret"]))
    assert d["userid"] == out["userid"]
    who = User(id=out["userid"], email=email, password="", token=d["token"])
    assert "superuser" in user_obj(env, who, who)["roles"]


def test_agent_backup(env, tmp_path):
    dest = tmp_path / "copy.db"
    assert env.agent("backup", str(dest)) == {"backup": str(dest)}
    con = sqlite3.connect(dest)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
    finally:
        con.close()


def test_agent_options_after_the_command_and_json_errors(env):
    cp = subprocess.run([str(AGENT), "check", "--config", str(env.config), "--json"], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["ok"] is True
    rc, doc = env.agent("account", "enable", f"{unique('nobody-')}@example.org", "--username", unique("n"), ok=False)
    assert rc != 0 and isinstance(doc, dict)


def test_agent_usage_error_under_json_is_one_document(env):
    u = env.user(login=False)
    cp = env.agent_raw("user", "grant", u.email, "wizard")
    assert cp.returncode != 0
    json.loads(cp.stdout)


def test_agent_refusals_are_one_json_document_and_change_nothing(env):
    u = env.user(account=True)
    vol = env.volume(u, size=2)
    top = max_size_gb(env)
    for size in ("0", str(top + 1)):
        rc, doc = env.agent("volume", "resize", vol["volume-id"], size, ok=False)
        assert rc != 0 and isinstance(doc, dict), doc
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))[0]["volume-size"] == 2
    email = f"{unique('su-')}@example.org"
    rc, doc = env.agent("user", "create-superuser", "--email", email, ok=False)  # no terminal, no password
    assert rc != 0 and isinstance(doc, dict), doc
    rc, doc = env.agent("user", "create-superuser", "--email", email, "--password", "short-1", ok=False)
    assert rc != 0 and isinstance(doc, dict), doc
    assert ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"email": email}))["users"] == []


def test_agent_backup_matches_the_live_database(env, tmp_path):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    dest = tmp_path / "copy2.db"
    assert env.agent("backup", str(dest)) == {"backup": str(dest)}

    def shape(path):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        finally:
            con.close()

    live, copy = shape(cp.get("database", "path")), shape(dest)
    assert set(live) == set(copy)
    audit_like = {t for t in live if "audit" in t or "token" in t or "fail" in t}
    assert {t: n for t, n in live.items() if t not in audit_like} == \
        {t: n for t, n in copy.items() if t not in audit_like}


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


def test_ui_405_on_view(env):
    u = env.user()
    r = env.call("DELETE", f"/v1/user/view/{u.id}", who=u)
    ui_err(r, 405)
    assert {"GET", "POST"} <= r.allow()


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


def test_instance_access_grant_does_not_widen_visibility(env, catalog):
    owner = ready_user(env)
    managed = env.user(owner=owner, account=True)
    inst = cc_ok(boot(env, owner, catalog, users=[managed.account_uuid]), 201)[0]
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


def test_instance_grants_between_manager_and_managed(env, catalog):
    manager = env.user(account=True)
    managed = ready_user(env, owner=manager)
    inst = cc_ok(boot(env, managed, catalog), 201)[0]
    path = f"/v1/server-instance/{inst['id']}"
    # a managed user may not grant its manager (neither is, owns, nor superuser)
    cc_err(boot(env, managed, catalog, users=[manager.account_uuid]), 403)
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


def test_image_add_from_a_source_file(env, catalog, tmp_path):
    qemu_img = shutil.which("qemu-img")
    assert qemu_img, "qemu-img is missing: run scripts/setup-host.sh"
    src = tmp_path / "base.qcow2"
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", str(src), "1G"], check=True)
    img = env.agent("image", "add", "--name", unique("src-"), "--os-name", "debian", "--os-major", "12",
                    "--os-minor", "8", "--min-disk", "1", "--min-ram", "256", "--source", str(src))
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]
    u = ready_user(env)
    inst = cc_ok(env.call("POST", "/v1/server-instance", who=u,
                          json_body={"server-image": img["id"], "server-flavor": catalog["small"]["id"]}), 201)
    assert inst[0]["status"] == "running"


def test_images_and_flavors_accept_no_other_method(env, catalog):
    u = env.user()
    for path in ("/v1/server-image", f"/v1/server-flavor/{catalog['small']['id']}"):
        for method in ("OPTIONS", "PATCH"):
            r = env.call(method, path, who=u)
            assert r.status == 405, (method, path, r.status)


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
    """CONTRACT 2: slow hashes for passwords, API secrets encrypted at rest; no secret in logs."""
    u = env.user()
    cp = configparser.ConfigParser()
    cp.read(env.config)
    db = Path(cp.get("database", "path"))
    blobs = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-journal")) if p.exists())
    log = (env.root / "serve.log").read_bytes()
    for secret in (PASSWORD, "Superuser-pass-1", env.admin.api_secret, u.api_secret, env.admin.token, u.token):
        assert secret.encode() not in blobs, "a secret is stored in plain text"
        assert secret.encode() not in log, "a secret is in the server log"


def test_uuid_case_is_not_significant(env):
    u = env.user(account=True)
    vol = env.volume(u)
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id'].upper()}", who=u)) == [vol]
    r = env.call("GET", "/v1/storage-volume", headers={"X-Auth-Token": u.token, "X-Auth-Cloudauth-Id": u.id.upper()})
    assert r.status == 200


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
