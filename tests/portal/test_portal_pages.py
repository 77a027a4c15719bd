"""The cloud portal through HTTP (falcon.testing, fake host adapters): every page and every
refusal, the security headers on each answer, the session (cookie, timeouts on an injected
clock, its ends), CSRF refusals that change nothing, `next` open redirects, the new secret
shown once, and no secret in a log line or an audit row."""

import logging
import re
from urllib.parse import urlencode

import pytest
from falcon import testing

from api.app import create_app
from api.portal import render
from api.portal.guard import COOKIE, HEADERS, LOGIN_COOKIE
from api.portal.text import console_text
from controller.storage import images
from controller.users import users
from controller.config import config_from_dict, write_config
from controller.errors import InvalidInput
from controller.permissions import Requester
from controller.security.crypto import token_hash
from tests.fixtures.agent import run_agent
from tests.fixtures.api import PASSWORD, config_values_for, enable, make_caller

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
NEW_PASSWORD = "another-horse-77"


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


class Browser:
    """One browser: its cookie, and the csrf value of the last page it read."""

    def __init__(self, client: testing.TestClient):
        self.client = client
        self.cookie: str | None = None
        self.login_cookie: str | None = None  # the login form's double-submit value
        self.csrf = ""

    def headers(self, extra=None) -> dict:
        sent = dict(extra or {})
        jar = [f"{name}={value}" for name, value in ((COOKIE, self.cookie), (LOGIN_COOKIE, self.login_cookie))
               if value]
        if jar:
            sent["Cookie"] = "; ".join(jar)
        return sent

    def get(self, path: str, **kw):
        r = self.client.simulate_get(path, headers=self.headers(kw.pop("headers", None)), **kw)
        found = re.search(r'name="csrf" value="([^"]*)"', r.text)
        if found:
            self.csrf = found[1]
        return r

    def post(self, path: str, fields=(), *, csrf: bool = True, headers=None):
        pairs = list(fields.items() if isinstance(fields, dict) else fields)
        if csrf:
            pairs.append(("csrf", self.csrf))
        return self.client.simulate_post(path, body=urlencode(pairs), headers=self.headers({**FORM, **(headers or {})}))

    def login(self, email: str, password: str = PASSWORD, **fields):
        """As a browser logs in: the login page first (its cookie and csrf field), then its form."""
        form = self.get("/portal/login")
        if LOGIN_COOKIE in form.cookies:
            self.login_cookie = form.cookies[LOGIN_COOKIE].value
        r = self.post("/portal/login", {"email": email, "password": password, **fields}, csrf=True)
        if r.status_code == 303:
            self.cookie = r.cookies[COOKIE].value
        return r


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def client(cctx, clock):
    return testing.TestClient(create_app(cctx, interfaces=("controller", "user", "portal"), portal_clock=clock))


@pytest.fixture
def alice(cctx):
    caller = make_caller(cctx, "alice@example.org", roles=("create_user",))
    enable(cctx, caller, username="alice")
    return caller


@pytest.fixture
def browser(client, alice):
    b = Browser(client)
    assert b.login(alice.email).status_code == 303
    b.get("/portal/")
    return b


def assert_headers(r):
    for name, value in HEADERS.items():
        assert r.headers.get(name) == value, (r.status_code, name, r.headers)


def secret_of(ctx, user_id: str) -> str:
    return ctx.secret_box.decrypt(ctx.store.get_user(user_id)["api_secret_enc"])


# -- config -------------------------------------------------------------------------------
def test_portal_needs_the_user_interface_in_the_same_process(tmp_path):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = "controller,portal"
    with pytest.raises(InvalidInput, match=r"\[server\] interfaces: portal needs user"):
        config_from_dict(values)
    values["server"]["interfaces"] = "controller,user,portal,shop"
    with pytest.raises(InvalidInput, match="must name some of controller, user, portal"):
        config_from_dict(values)
    values["server"]["interfaces"] = "user,portal"
    values["portal"] = {"public_url": "https://cloud.example.org/"}
    config = config_from_dict(values)
    assert (config.server.interfaces, config.portal.public_url) == (("user", "portal"), "https://cloud.example.org")
    assert (config.portal.session_idle_seconds, config.portal.session_max_seconds) == (1800, 28800)
    for bad in ("cloud.example.org", "https://cloud.example.org/portal", "ftp://x"):
        values["portal"] = {"public_url": bad}
        with pytest.raises(InvalidInput, match=r"\[portal\] public_url"):
            config_from_dict(values)


@pytest.mark.parametrize("command", [("check",), ("serve", "--port", "1")])
def test_check_and_serve_refuse_the_portal_without_the_user_interface(tmp_path, command):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = "controller,portal"
    write_config(values, str(tmp_path / "controller.ini"))
    done = run_agent("--config", str(tmp_path / "controller.ini"), *command, timeout=60)
    assert done.returncode != 0
    assert "config [server] interfaces: portal needs user in the same process" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_sandbox_serves_the_portal(tmp_path):
    assert "portal" in config_from_dict(config_values_for(tmp_path)).server.interfaces


def test_no_portal_where_it_is_not_served(cctx):
    r = testing.TestClient(create_app(cctx)).simulate_get("/portal/login")
    assert r.status_code == 404 and r.json["success"] is False


# -- logging in ---------------------------------------------------------------------------
def test_login_sets_the_host_cookie_and_keeps_only_a_hash(client, alice, cctx):
    b = Browser(client)
    r = b.get("/portal/login")
    assert r.status_code == 200 and 'name="password"' in r.text
    assert_headers(r)
    r = b.login(alice.email)
    assert r.status_code == 303 and r.headers["location"] == "/portal/"
    assert_headers(r)
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    parts = {p.strip().split("=")[0].lower() for p in cookie.split(";")[1:]}
    assert parts == {"httponly", "path", "samesite", "secure"}, cookie  # no Max-Age, no Expires, no Domain
    assert "Path=/;" in cookie + ";" and "SameSite=Strict" in cookie
    assert len(b.cookie) >= 43  # 32 random bytes, base64
    rows = cctx.store.conn.execute("SELECT * FROM portal_sessions").fetchall()
    assert [r["id_hash"] for r in rows] == [token_hash(b.cookie)]
    assert b.cookie not in str([dict(r) for r in rows])
    assert b.get("/portal/").status_code == 200
    assert [(a["actor"], a["result"]) for a in cctx.store.list_audit() if a["action"] == "POST /portal/login"] == \
        [(alice.id, "303")]


def test_every_login_makes_a_new_id_and_ends_the_one_it_replaces(client, alice):
    b = Browser(client)
    b.login(alice.email)
    first = b.cookie
    b.login(alice.email)
    assert b.cookie != first
    assert b.get("/portal/").status_code == 200
    b.cookie = first
    assert b.get("/portal/").status_code == 303


@pytest.mark.parametrize("who", ["wrong password", "unknown email", "inactive", "empty"])
def test_a_failed_login_is_401_with_one_message_and_no_cookie(client, cctx, alice, who):
    make_caller(cctx, "carol@example.org", active=0)
    email, password = {"wrong password": (alice.email, "not-the-password-1"), "unknown email": ("x@example.org", PASSWORD),
                       "inactive": ("carol@example.org", PASSWORD), "empty": ("", "")}[who]
    r = Browser(client).login(email, password)
    assert r.status_code == 401
    assert "Log in failed: wrong email or password, or the account cannot use the cloud." in r.text
    assert "set-cookie" not in r.headers
    assert_headers(r)


def test_logins_are_throttled_as_the_api_throttles_them(client, cctx, alice):
    b = Browser(client)
    for _ in range(cctx.config.auth.max_failures):
        assert b.login(alice.email, "not-the-password-1").status_code == 401
    r = b.login(alice.email)  # the right password, locked out all the same
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    assert "set-cookie" not in r.headers
    # The API's own login with that email is locked too: one throttle.
    api = client.simulate_post("/v1/auth/token", json={"email": alice.email, "password": PASSWORD})
    assert api.status_code == 429


@pytest.mark.parametrize("given", [
    "//evil.example/", "https://evil.example/portal/", "/\\evil.example", "/portal/../v1/user/list", "/v1/user/list",
    "javascript:alert(1)", "http:/portal/", "/portal/\r\nSet-Cookie: x=1", "portal/servers", "///evil.example/portal/",
    "/portal/%2e%2e/x\t", "/portal/" + "a" * 3000,
])
def test_next_never_leaves_the_portal(client, alice, given):
    r = Browser(client).login(alice.email, next=given)
    assert r.status_code == 303 and r.headers["location"] == "/portal/"


def test_next_within_the_portal_is_followed(client, alice):
    b = Browser(client)
    r = b.get("/portal/servers/new?x=1")
    assert r.status_code == 303 and r.headers["location"] == "/portal/login?next=/portal/servers/new%3Fx%3D1"
    page = b.get(r.headers["location"]).text
    assert 'name="next" value="/portal/servers/new?x=1"' in page
    r = b.login(alice.email, next="/portal/servers/new?x=1")
    assert r.headers["location"] == "/portal/servers/new?x=1"


# -- without a session ---------------------------------------------------------------------
GET_PAGES = ["/portal/", "/portal/servers", "/portal/servers/new", "/portal/servers/{id}", "/portal/servers/{id}/delete",
             "/portal/volume", "/portal/groups", "/portal/groups/{group}/delete", "/portal/credentials", "/portal/credentials/new", "/portal/password",
             "/portal/users", "/portal/users/{user}"]
POSTS = ["/portal/logout", "/portal/servers/new", "/portal/servers/{id}/power", "/portal/servers/{id}/users",
         "/portal/servers/{id}/lease", "/portal/servers/{id}/delete", "/portal/volume", "/portal/volume/delete",
         "/portal/groups", "/portal/groups/{group}/members", "/portal/groups/{group}/delete",
         "/portal/credentials/rotate", "/portal/password", "/portal/users", "/portal/users/{user}"]


@pytest.fixture
def world(cctx, alice, browser):
    """alice with a volume, a group and a server (made through the portal)."""
    catalog = {"image": images.add_image(cctx, name="Debian 12", os_name="debian", os_major="12", os_minor="7",
                                         min_disk=1, min_ram=128),
               "flavor": images.add_flavor(cctx, name="small", memory=256, disk=1, vcpu=1)}
    browser.get("/portal/volume")
    assert browser.post("/portal/volume", {"size": "2"}).status_code == 303
    browser.get("/portal/groups")
    assert browser.post("/portal/groups", {"name": "proj", "members": "alice"}).status_code == 303
    browser.get("/portal/servers/new")
    r = browser.post("/portal/servers/new", {"image": catalog["image"]["id"], "flavor": catalog["flavor"]["id"]})
    assert r.status_code == 303, r.text
    assert r.headers["location"].endswith("?done=server-created")
    server_id = r.headers["location"].split("?")[0].rsplit("/", 1)[1]
    group_id = cctx.store.list_groups(visible_to=None)[0]["id"]
    return {"id": server_id, "group": group_id, "user": alice.id, **catalog}


def test_without_a_session_a_get_goes_to_login_and_a_post_is_refused(client, cctx, world):
    b = Browser(client)
    for path in GET_PAGES:
        path = path.format(**world)
        r = b.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/portal/login?next=/portal"), path
        assert_headers(r)
    before = cctx.store.list_instances(visible_to=None)
    for path in POSTS:
        r = b.post(path.format(**world), {"task": "stop", "size": "1", "name": "x"})
        assert r.status_code == 403, path
        assert_headers(r)
    assert cctx.store.list_instances(visible_to=None) == before
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "running"


# -- CSRF ----------------------------------------------------------------------------------
@pytest.mark.parametrize("refusal", [
    {"csrf": None}, {"csrf": "0" * 64}, {"headers": {"Sec-Fetch-Site": "cross-site"}},
    {"headers": {"Sec-Fetch-Site": "same-site"}}, {"headers": {"Origin": "http://127.0.0.2"}},
    {"headers": {"Origin": "https://evil.example"}},
])
def test_a_forged_post_is_refused_and_changes_nothing(cctx, browser, world, alice, refusal):
    secret = secret_of(cctx, alice.id)
    csrf = browser.csrf
    attempts = [("/portal/credentials/rotate", {"password": PASSWORD}),
                (f"/portal/servers/{world['id']}/power", {"task": "stop"}),
                (f"/portal/servers/{world['id']}/lease", {"hours": "1"}),
                (f"/portal/servers/{world['id']}/delete", {}),
                (f"/portal/groups/{world['group']}/delete", {}),
                ("/portal/logout", {})]
    for path, fields in attempts:
        sent = dict(fields)
        if refusal.get("csrf", csrf) is not None:
            sent["csrf"] = refusal.get("csrf", csrf)
        r = browser.post(path, sent, csrf=False, headers=refusal.get("headers"))
        assert r.status_code == 403, (path, r.text)
        assert_headers(r)
    assert secret_of(cctx, alice.id) == secret
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "running"
    assert [i["id"] for i in cctx.store.list_instances(visible_to=None)] == [world["id"]]
    assert len(cctx.store.list_groups(visible_to=None)) == 1
    assert browser.get("/portal/").status_code == 200  # the logout was refused too


@pytest.mark.parametrize("headers", [{}, {"Origin": "null"}, {"Origin": "http://falconframework.org"},
                                     {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}])
def test_a_post_from_the_portal_itself_passes(browser, world, cctx, headers):
    r = browser.post(f"/portal/servers/{world['id']}/power", {"task": "stop"}, headers=headers)
    assert r.status_code == 303, r.text
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "shutoff"


def test_public_url_is_the_origin_checked(cctx, clock, alice):
    ctx = cctx
    ctx.config = ctx.config.with_values({"portal": {"public_url": "https://cloud.example.org"}})
    b = Browser(testing.TestClient(create_app(ctx, interfaces=("controller", "user", "portal"), portal_clock=clock)))
    assert b.login(alice.email, headers=None).status_code == 303
    b.get("/portal/credentials")
    r = b.post("/portal/logout", headers={"Origin": "http://falconframework.org"})
    assert r.status_code == 403
    assert b.post("/portal/logout", headers={"Origin": "https://cloud.example.org"}).status_code == 303


def test_a_login_form_posted_from_another_site_is_refused(client, alice):
    r = client.simulate_post("/portal/login", body=urlencode({"email": alice.email, "password": PASSWORD}),
                             headers={**FORM, "Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.2"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


# -- the session's end ---------------------------------------------------------------------
def test_idle_and_absolute_timeouts_on_the_clock(client, alice, clock):
    b = Browser(client)
    b.login(alice.email)
    clock.now += 1799
    assert b.get("/portal/").status_code == 200
    clock.now += 1799
    assert b.get("/portal/").status_code == 200  # each request keeps it alive
    clock.now += 1800
    r = b.get("/portal/")
    assert r.status_code == 303 and r.headers["location"] == "/portal/login?next=/portal"

    b.login(alice.email)
    for _ in range(28800 // 1700):
        clock.now += 1700
        assert b.get("/portal/").status_code == 200
    clock.now += 28800 - (28800 // 1700) * 1700
    assert b.get("/portal/").status_code == 303  # 8 hours after the login, however active


@pytest.mark.parametrize("how", ["logout", "set_password", "deactivate", "delete", "null secret"])
def test_the_session_ends_with_the_user(client, cctx, alice, browser, how):
    admin = Requester(id="admin", roles=frozenset({"superuser"}))
    old = browser.cookie
    if how == "logout":
        r = browser.post("/portal/logout")
        assert r.status_code == 303 and r.headers["location"] == "/portal/login?done=logged-out"
        assert "You are logged out." in Browser(client).get(r.headers["location"]).text
        gone = r.headers["set-cookie"]
        assert gone.split(";")[0] in (f"{COOKIE}=", f'{COOKIE}=""') and "Path=/" in gone and "Secure" in gone and "1970" in gone
    elif how == "set_password":
        users.set_password(cctx, admin, alice.id, password=NEW_PASSWORD)
    elif how == "deactivate":
        cctx.store.update_user(alice.id, {"active": 0})
    elif how == "delete":
        cctx.store.conn.execute("DELETE FROM system_accounts WHERE user_id = ?", (alice.id,))
        cctx.store.delete_user(alice.id)
    else:
        users.reset_api_secret(cctx, admin, alice.id, set_to_null=True)
    browser.cookie = old  # the old cookie replayed
    r = browser.get("/portal/credentials")
    assert r.status_code == 303 and r.headers["location"].startswith("/portal/login")
    r = browser.post("/portal/credentials/rotate", {"password": PASSWORD})
    assert r.status_code == 403
    if how in ("logout", "set_password", "deactivate", "delete"):
        assert cctx.store.conn.execute("SELECT COUNT(*) FROM portal_sessions").fetchone()[0] == 0


# -- credentials ---------------------------------------------------------------------------
def test_credentials_page_and_the_new_secret_shown_once(client, cctx, alice, browser, clock, caplog):
    caplog.set_level(logging.DEBUG)
    r = browser.get("/portal/credentials")
    assert r.status_code == 200 and alice.api_key in r.text and "set (shown only once" in r.text
    assert f"cloud login --url http://falconframework.org --api-key {alice.api_key} --keep" in r.text
    assert alice.api_secret not in r.text

    r = browser.post("/portal/credentials/rotate", {"password": "not-the-password-1"})
    assert r.status_code == 401 and "wrong password or API secret" in r.text
    assert secret_of(cctx, alice.id) == alice.api_secret

    r = browser.post("/portal/credentials/rotate", {"password": PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/portal/credentials/new"
    new = secret_of(cctx, alice.id)
    assert new != alice.api_secret
    first = browser.get("/portal/credentials/new")
    assert first.status_code == 200 and new in first.text and alice.api_key in first.text
    assert_headers(first)
    again = browser.get("/portal/credentials/new")
    assert new not in again.text and "already shown" in again.text

    # The old secret logs in no more; the new one does.
    old_login = client.simulate_post("/v1/auth/token", json={"api_key": alice.api_key, "api_secret": alice.api_secret})
    assert old_login.status_code == 401
    assert client.simulate_post("/v1/auth/token", json={"api_key": alice.api_key, "api_secret": new}).status_code == 200

    # Too late: 60 s after the rotation, the page shows nothing.
    browser.post("/portal/credentials/rotate", {"password": PASSWORD})
    newer = secret_of(cctx, alice.id)
    clock.now += 60
    late = browser.get("/portal/credentials/new")
    assert newer not in late.text and "already shown" in late.text

    rows = str(cctx.store.list_audit())
    for secret in (alice.api_secret, new, newer, PASSWORD):
        assert secret not in caplog.text and secret not in rows
    actions = [row["action"] for row in cctx.store.list_audit()]
    assert "POST /portal/credentials/rotate" in actions


def test_another_session_does_not_see_the_new_secret(client, cctx, alice, browser):
    other = Browser(client)
    other.login(alice.email)
    browser.get("/portal/credentials")
    assert browser.post("/portal/credentials/rotate", {"password": PASSWORD}).status_code == 303
    assert secret_of(cctx, alice.id) not in other.get("/portal/credentials/new").text


def test_change_password_ends_the_sessions_and_the_new_one_logs_in(client, cctx, alice, browser):
    other = Browser(client)
    other.login(alice.email)
    browser.get("/portal/password")
    r = browser.post("/portal/password", {"password": PASSWORD, "new_password": NEW_PASSWORD,
                                          "new_password_again": "different-horse-88"})
    assert r.status_code == 400 and "the two new passwords differ" in r.text
    r = browser.post("/portal/password", {"password": "not-the-password-1", "new_password": NEW_PASSWORD,
                                          "new_password_again": NEW_PASSWORD})
    assert r.status_code == 401 and 'name="new_password"' in r.text
    r = browser.post("/portal/password", {"password": PASSWORD, "new_password": "short",
                                          "new_password_again": "short"})
    assert r.status_code == 400 and "password must" in r.text
    r = browser.post("/portal/password", {"password": PASSWORD, "new_password": NEW_PASSWORD,
                                          "new_password_again": NEW_PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/portal/login?changed=1"
    assert "Your password was changed" in browser.get(r.headers["location"]).text
    assert browser.get("/portal/").status_code == 303
    assert other.get("/portal/").status_code == 303
    assert Browser(client).login(alice.email).status_code == 401
    assert Browser(client).login(alice.email, NEW_PASSWORD).status_code == 303


def test_a_password_change_can_make_a_new_api_secret_in_the_same_step(client, cctx, alice, browser, caplog):
    page = browser.get("/portal/password").text
    assert "A password is 14 to 24 characters long and mixes at least two of" in page  # before any try
    assert 'minlength="14" maxlength="24"' in page and 'name="rotate_secret"' in page
    old_secret = secret_of(cctx, alice.id)
    # A refused new password changes neither.
    r = browser.post("/portal/password", {"password": PASSWORD, "new_password": "short", "new_password_again": "short",
                                          "rotate_secret": "1"})
    assert r.status_code == 400 and secret_of(cctx, alice.id) == old_secret and 'name="rotate_secret" value="1" checked' in r.text
    r = browser.post("/portal/password", {"password": PASSWORD, "new_password": NEW_PASSWORD,
                                          "new_password_again": NEW_PASSWORD, "rotate_secret": "1"})
    new_secret = secret_of(cctx, alice.id)
    assert r.status_code == 200 and new_secret != old_secret and new_secret in r.text
    assert "Password changed" in r.text and r.headers["Cache-Control"] == "no-store"
    assert new_secret not in caplog.text
    assert browser.get("/portal/").status_code == 303  # the session ended with the password
    assert Browser(client).login(alice.email, NEW_PASSWORD).status_code == 303


# -- pages ---------------------------------------------------------------------------------
def test_every_page_renders_with_the_headers(browser, world):
    for path in GET_PAGES + ["/portal/static/portal.css"]:
        r = browser.get(path.format(**world))
        assert r.status_code == 200, (path, r.text)
        assert_headers(r)
        if path.endswith(".css"):
            assert r.headers["content-type"].startswith("text/css")
        else:
            assert r.headers["content-type"] == "text/html; charset=utf-8"
            assert "<script" not in r.text and "style=" not in r.text and "<style" not in r.text
    r = browser.get("/portal/nothing-here")
    assert r.status_code == 404 and "Not found" in r.text
    assert_headers(r)
    assert browser.get("/portal/static/../../setup.cfg").status_code == 404


def test_overview_shows_account_volume_servers_and_limits(browser, world):
    page = browser.get("/portal/").text
    assert "<code>alice</code>" in page and "2 GB" in page
    assert re.search(r'status-running">running</span> 1', page)
    assert re.search(r'<td>Servers</td><td class="number">1</td><td class="number">\d{1,3}(,\d{3})*</td>', page)
    assert re.search(r'<td>Groups</td><td class="number">1</td><td class="number">\d{1,3}(,\d{3})*</td>', page)


def test_overview_counts_the_servers_by_their_recorded_status(cctx, browser, world):
    before = browser.get("/portal/").text
    cctx.store.conn.execute("UPDATE instances SET status = 'shutoff' WHERE id = ?", (world["id"],))
    after = browser.get("/portal/").text
    assert re.search(r'status-running">running</span> 1<', before) and "status-shutoff" not in before
    assert re.search(r'status-shutoff">shutoff</span> 1<', after) and "status-running" not in after


def test_paths_wrap_only_before_a_slash_and_stay_escaped(cctx, browser, world, alice):
    home = cctx.store.account_of_user(alice.id, cctx.config.controller_id)["home"]
    mount = cctx.store.volume_of_user(alice.id)["mount_point"]
    for path, paths in (("/portal/", [home, mount]), ("/portal/volume", [mount])):
        page = browser.get(path).text
        shown = re.findall(r'<code class="path">(.*?)</code>', page)
        assert [cell.replace("<wbr>", "") for cell in shown] == paths, path
        for cell in shown:
            assert "<wbr>" in cell
            # Only ever a break before a slash (none before the leading one): names stay whole.
            assert re.fullmatch(r"/[^/<]+(<wbr>/[^/<]+)*", cell), cell
    macro = render._env.from_string('{% from "macros.html" import file_path %}{{ file_path(p) }}')
    assert macro.render(p='/srv/<b>&"x"/a b') == '<code class="path">/srv<wbr>/&lt;b&gt;&amp;&#34;x&#34;<wbr>/a b</code>'
    assert macro.render(p="") == '<code class="path"></code>'


def test_server_detail_console_readiness_ssh_and_history(cctx, browser, world):
    fake = cctx.adapters.hypervisor.instances[world["id"]]
    hostile = "<script>alert(1)</script>\x1b[31mred\x1b[0m\x07bell\x00\u202eevil\r\n"
    fake.console += hostile.encode() + f"cloud-controller: instance {world['id']} finished its boot setup\n".encode()
    r = browser.get(f"/portal/servers/{world['id']}")
    assert r.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;redbellevil\n" in r.text
    assert "<script>" not in r.text and "\x1b" not in r.text and "\x07" not in r.text and "\u202e" not in r.text
    assert "ready: the guest has started" in r.text
    private_ip = cctx.store.get_instance(world["id"], visible_to=None)["private_ip"]
    assert f"ssh alice@{private_ip}" in r.text
    assert "<td>create</td><td>alice@example.org</td><td>success</td>" in r.text  # who did it, by email
    # Settled: no reload; "updated at" said.
    assert 'http-equiv="refresh"' not in r.text and "Updated at " in r.text


def test_a_server_page_reloads_itself_until_the_guest_is_ready(cctx, browser, world):
    fake = cctx.adapters.hypervisor.instances[world["id"]]
    fake.console = b"booting\n"  # running, its boot setup not finished
    r = browser.get(f"/portal/servers/{world['id']}?done=server-created")
    assert '<meta http-equiv="refresh" content="5">' in r.text and "reloads every 5 s until the server is ready" in r.text
    assert "Server created: it is starting." in r.text and "not yet" in r.text
    fake.console += f"cloud-controller: instance {world['id']} finished its boot setup\n".encode()
    r = browser.get(f"/portal/servers/{world['id']}")
    assert 'http-equiv="refresh"' not in r.text


def test_power_users_and_delete(cctx, alice, browser, world):
    bob = make_caller(cctx, "bob@example.org", owner=alice)
    bob_account = enable(cctx, bob, username="bob")
    fake = cctx.adapters.hypervisor.instances[world["id"]]
    base = f"/portal/servers/{world['id']}"
    page = browser.get(base).text
    assert f'value="{bob_account["uuid"]}"> bob' in page
    buttons = re.compile(r'<button type="submit" name="task" value="([a-z]+)">')
    # Running: Reboot and Stop, the ssh line; each action confirmed on the next page.
    assert buttons.findall(page) == ["reboot", "stop"] and "ssh alice@" in page
    for task, status, said in (("stop", "shutoff", "Server stopped."), ("start", "running", "Server started."),
                               ("reboot", "running", "Server rebooted.")):
        r = browser.post(f"{base}/power", {"task": task})
        assert r.status_code == 303 and r.headers["location"] == f"{base}?done=server-{task}{'p' if task == 'stop' else ''}ed"
        assert fake.status == status
        assert said in browser.get(r.headers["location"]).text
    browser.post(f"{base}/power", {"task": "stop"})
    # Stopped: Start alone, no ssh line, no readiness, no reload.
    page = browser.get(base).text
    assert buttons.findall(page) == ["start"] and "ssh alice@" not in page and "<dt>Ready</dt>" not in page
    assert 'http-equiv="refresh"' not in page and "The server is stopped" in page
    # A refused task stays on the server's page, the API's message above its forms.
    r = browser.post(f"{base}/power", {"task": "reboot"})
    assert r.status_code == 409 and "reboot needs a running server (this one is stopped)" in r.text  # the API's refusal
    assert "<h1>Server " in r.text and buttons.findall(r.text) == ["start"]
    r = browser.post(f"{base}/power", {"task": "explode"})
    assert r.status_code == 400
    r = browser.post(f"{base}/users", {"how": "add"})
    assert r.status_code == 400 and "choose at least one user" in r.text and "<h1>Server " in r.text
    assert "<h3>Who may log in</h3>" in r.text and "<h3>Who could be added</h3>" in r.text
    r = browser.post(f"{base}/users", {"how": "add", "users": bob_account["uuid"]})
    assert r.status_code == 303 and "Who may log in was changed." in browser.get(r.headers["location"]).text
    assert bob_account["uuid"] in cctx.store.get_instance(world["id"], visible_to=None)["users"]
    assert browser.post(f"{base}/users", {"how": "delete", "users": bob_account["uuid"]}).status_code == 303
    assert bob_account["uuid"] not in cctx.store.get_instance(world["id"], visible_to=None)["users"]
    confirm = browser.get(f"{base}/delete")
    assert confirm.status_code == 200 and "Delete the server" in confirm.text
    assert cctx.store.get_instance(world["id"], visible_to=None) is not None  # a GET deletes nothing
    r = browser.post(f"{base}/delete")
    assert r.status_code == 303 and r.headers["location"] == "/portal/servers?done=server-deleted"
    assert "Server deleted." in browser.get(r.headers["location"]).text
    assert cctx.store.get_instance(world["id"], visible_to=None) is None and world["id"] not in cctx.adapters.hypervisor.instances


def test_another_users_objects_are_404_and_the_api_decides(client, cctx, world):
    eve = make_caller(cctx, "eve@example.org")
    enable(cctx, eve, username="eve")
    b = Browser(client)
    b.login(eve.email)
    b.get("/portal/")
    for path in (f"/portal/servers/{world['id']}", f"/portal/servers/{world['id']}/delete", "/portal/servers/nope"):
        r = b.get(path)
        assert r.status_code == 404 and "not found" in r.text, path
        # The error page says what to do, not a status number.
        assert "It may have been deleted, or it is not yours to see" in r.text and "HTTP status" not in r.text
        assert_headers(r)
    for path, fields in ((f"/portal/servers/{world['id']}/power", {"task": "stop"}),
                         (f"/portal/servers/{world['id']}/delete", {}),
                         (f"/portal/groups/{world['group']}/delete", {})):
        assert b.post(path, fields).status_code == 404, path
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "running"
    assert len(cctx.store.list_groups(visible_to=None)) == 1
    # Managed users: eve may not create users (the API's permission), nor see alice.
    assert b.get("/portal/users").status_code == 200
    r = b.post("/portal/users", {"email": "x@example.org", "password": "p-" + PASSWORD, "password_again": "p-" + PASSWORD})
    assert r.status_code == 403 and "create_user" in r.text
    assert cctx.store.get_user_by_email("x@example.org") is None
    assert b.get(f"/portal/users/{world['user']}").status_code == 403


def test_volume_form_errors_and_delete_after_typing_the_username(cctx, alice, browser):
    page = browser.get("/portal/volume")
    assert page.status_code == 200 and "You have none yet." in page.text
    for size, message in (("lots", "size must be a whole number of GB"), ("0", "volume-size")):
        r = browser.post("/portal/volume", {"size": size})
        assert r.status_code == 400 and message in r.text and 'name="size"' in r.text
        assert f'value="{size}"' in r.text  # what was typed, kept
        assert cctx.store.volume_of_user(alice.id) is None
    assert browser.post("/portal/volume", {"size": "3", "name": "scratch"}).status_code == 303
    volume = cctx.store.volume_of_user(alice.id)
    assert volume["size_gb"] == 3 and volume["name"] == "scratch"
    page = browser.get("/portal/volume").text
    assert "Delete the volume" in page and "<dt>Used</dt><dd>0.0 GB of 3 GB (0 %)</dd>" in page
    cctx.adapters.homes.homes["alice"].used_bytes = 3 * 1073741824 // 2
    assert "<dt>Used</dt><dd>1.5 GB of 3 GB (50 %)</dd>" in browser.get("/portal/volume").text
    r = browser.post("/portal/volume", {"size": "3"})
    assert r.status_code == 409 and "you already have a home volume" in r.text
    assert "<h1>Home volume" in r.text  # on the page it was sent from
    r = browser.post("/portal/volume/delete", {"confirm": "alic"})
    assert r.status_code == 400 and "type your username" in r.text and 'name="confirm"' in r.text
    assert cctx.store.volume_of_user(alice.id) == volume
    r = browser.post("/portal/volume/delete", {"confirm": "alice"})
    assert r.status_code == 303 and r.headers["location"] == "/portal/volume?done=volume-deleted"
    assert cctx.store.volume_of_user(alice.id) is None


def test_groups_members_and_delete(cctx, alice, browser, world):
    bob = make_caller(cctx, "bob@example.org", owner=alice)
    enable(cctx, bob, username="bob")
    base = f"/portal/groups/{world['group']}"
    browser.get("/portal/groups")
    assert browser.post(f"{base}/members", {"action": "add", "members": "bob"}).status_code == 303
    assert cctx.store.list_groups(visible_to=None)[0]["members"] == ["alice", "bob"]
    assert "> bob</label>" in browser.get("/portal/groups").text
    assert browser.post(f"{base}/members", [("action", "delete"), ("member", "alice")]).status_code == 303
    assert cctx.store.list_groups(visible_to=None)[0]["members"] == ["bob"]
    r = browser.post("/portal/groups", {"name": "Bad Name", "members": "bob"})
    assert r.status_code == 400 and "group-name" in r.text and 'name="name"' in r.text
    assert 'value="Bad Name"' in r.text and 'name="members" value="bob"' in r.text  # what was typed, kept
    # An unknown member: refused on the groups page, the typed names kept in that group's box.
    r = browser.post(f"{base}/members", {"action": "add", "members": "nosuchuser"})
    assert r.status_code == 400 and "<h1>Groups" in r.text and 'value="nosuchuser"' in r.text
    assert cctx.store.list_groups(visible_to=None)[0]["members"] == ["bob"]
    # Delete asks first (a GET changes nothing), then says it is done.
    confirm = browser.get(f"{base}/delete")
    assert confirm.status_code == 200 and "Delete group" in confirm.text and "GID" in confirm.text
    assert cctx.store.list_groups(visible_to=None) != []
    r = browser.post(f"{base}/delete")
    assert r.status_code == 303 and r.headers["location"] == "/portal/groups?done=group-deleted"
    assert "Group deleted." in browser.get(r.headers["location"]).text
    assert cctx.store.list_groups(visible_to=None) == []


def test_managed_users_list_create_update(cctx, alice, browser):
    page = browser.get("/portal/users")
    assert page.status_code == 200 and "You manage no users yet." in page.text and ">Users</a>" in page.text
    r = browser.post("/portal/users", {"email": "dan@example.org", "name": "Dan", "password": NEW_PASSWORD,
                                       "password_again": NEW_PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/portal/users?done=user-created"
    dan = cctx.store.get_user_by_email("dan@example.org")
    assert dan["owner_userid"] == alice.id and dan["registration_source"] == "portal"
    assert "dan@example.org" in browser.get("/portal/users").text
    r = browser.post("/portal/users", {"email": "dan@example.org", "password": NEW_PASSWORD, "password_again": NEW_PASSWORD})
    assert r.status_code == 409 and 'value="dan@example.org"' in r.text
    assert browser.get(f"/portal/users/{dan['id']}").status_code == 200
    r = browser.post(f"/portal/users/{dan['id']}", {"email": "daniel@example.org", "name": "Daniel"})
    assert r.status_code == 303
    assert (cctx.store.get_user(dan["id"])["email"], cctx.store.get_user(dan["id"])["name"]) == ("daniel@example.org", "Daniel")


def test_a_superusers_new_user_is_theirs_to_manage(client, cctx):
    """Issue 41, defect 1: the form says "The new user is yours to manage"; a superuser's new
    user was owned by nobody and missing from the list."""
    root = make_caller(cctx, "root@example.org", roles=("superuser",))
    b = Browser(client)
    assert b.login(root.email).status_code == 303
    b.get("/portal/users")
    r = b.post("/portal/users", {"email": "erin@example.org", "name": "Erin", "password": NEW_PASSWORD,
                                 "password_again": NEW_PASSWORD})
    assert r.status_code == 303
    assert cctx.store.get_user_by_email("erin@example.org")["owner_userid"] == root.id
    assert "erin@example.org" in b.get("/portal/users").text


@pytest.mark.parametrize("host, scheme, told", [
    ("cluster.example.org", "http", True), ("10.1.2.3:8080", "http", True),
    ("localhost:8080", "http", False), ("127.0.0.1:8080", "http", False), ("127.0.0.2", "http", False),
    ("[::1]:8080", "http", False), ("portal.localhost", "http", False), ("cluster.example.org", "https", False)])
def test_the_login_page_says_when_a_browser_will_not_keep_the_session(client, alice, host, scheme, told):
    """Issue 41, defect 2: over plain HTTP at a name that is not loopback the browser drops the
    __Host- cookie, and a good login looped back to an empty form without a word."""
    r = client.simulate_get("/portal/login", headers={"Host": host}, protocol=scheme)
    assert r.status_code == 200
    assert ("This portal needs HTTPS, or localhost" in r.text) is told, r.text
    value = re.search(r'name="csrf" value="([^"]+)"', r.text)[1]
    assert r.cookies[LOGIN_COOKIE].value == value
    r = client.simulate_post("/portal/login", headers={**FORM, "Host": host, "Cookie": f"{LOGIN_COOKIE}={value}"},
                             protocol=scheme, body=f"email=alice%40example.org&password=wrong&csrf={value}")
    assert r.status_code == 401 and ("This portal needs HTTPS, or localhost" in r.text) is told


def test_an_admin_sees_owners_gids_and_how_to_make_an_account(client, cctx, world, browser):
    root = make_caller(cctx, "root@example.org", roles=("superuser",))
    admin = Browser(client)
    assert admin.login(root.email).status_code == 303
    page = admin.get("/portal/").text
    assert "cloud-agent account enable root@example.org --username NAME" in page
    assert "Ask an administrator" not in page
    servers = admin.get("/portal/servers").text
    assert "<th>Owner</th>" in servers and "<td>alice@example.org</td>" in servers
    groups = admin.get("/portal/groups").text
    gid = cctx.adapters.groups.gid("proj")
    assert "Owner: alice@example.org" in groups and gid is not None and f"GID {gid}" in groups
    # Alice's own lists name no owner: they are all hers.
    assert "<th>Owner</th>" not in browser.get("/portal/servers").text
    assert "Owner:" not in browser.get("/portal/groups").text
    # The overview names the cluster, not its number.
    assert f"<dt>Cluster</dt><dd>cluster-{cctx.config.controller_id}</dd>" in browser.get("/portal/").text


def test_the_login_form_carries_a_csrf_value_of_its_own(client, alice, cctx):
    """A login posted without the value its page set in the browser's cookie is refused, and
    nobody is logged in: a site cannot log a visitor in as the attacker's account."""
    b = Browser(client)
    page = b.get("/portal/login")
    value = page.cookies[LOGIN_COOKIE].value
    assert f'name="csrf" value="{value}"' in page.text and len(value) == 32
    cookie = page.cookies[LOGIN_COOKIE]
    assert cookie.secure and cookie.http_only and cookie.same_site == "Strict" and cookie.path == "/"
    fields = {"email": alice.email, "password": PASSWORD}
    # At a name where the browser keeps cookies (the test client's own name is not one: there
    # the page says no session can stay, and no value is asked).
    for jar, given in ((None, value), (value, None), (value, "x" * 32), ("y" * 32, value)):
        headers = {**FORM, "Host": "localhost", **({"Cookie": f"{LOGIN_COOKIE}={jar}"} if jar else {})}
        body = urlencode({**fields, **({"csrf": given} if given else {})})
        r = client.simulate_post("/portal/login", body=body, headers=headers)
        assert r.status_code == 403 and COOKIE not in r.cookies, (jar, given)
    r = client.simulate_post("/portal/login", body=urlencode({**fields, "csrf": value}),
                             headers={**FORM, "Host": "localhost", "Cookie": f"{LOGIN_COOKIE}={value}"})
    assert r.status_code == 303 and COOKIE in r.cookies  # the page's value, in the page's cookie


@pytest.mark.parametrize("given", ["/portal/%2e%2e/v1/user/list", "/portal/%252e%252e/healthz",
                                   "/portal/..%5c..%5cx", "%2f%2fevil.example/portal/"])
def test_next_is_decoded_before_it_is_checked(given):
    from api.portal.account_pages import safe_next

    assert safe_next(given) is None
    assert safe_next("/portal/servers%3Fx") == "/portal/servers%3Fx"


def test_console_text_keeps_newlines_and_tabs_only():
    assert console_text("a\tb\r\nc\x1b[1;31md\x1b]0;title\x07e\x9bf\x7f\u2066g\n") == "a\tb\ncdef" "g\n"
