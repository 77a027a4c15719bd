"""The cloud portal in a real browser: Debian's chromium, headless, driven by Selenium through
Debian's chromedriver (both paths given: Selenium Manager downloads nothing), against a real
`cloud-agent serve` on the sandbox profile.

One journey a cluster user takes: log in; rotate the API secret and log in with the new one at
/v1/auth/token while the old one is refused; make a home volume and a server and read its
page (console, readiness, the ssh line); groups; the owner's managed users; a forged
auto-submitting form from another origin (127.0.0.2) that changes nothing; log out, and the
old cookie replayed is refused. A server's lease: its badge on its page, renewed through the
form (leases are on: [leases] default 36h, max 7d). Over the whole journey the browser logs no CSP violation and
`document.cookie` stays empty. A screenshot of each page is saved (CC_PORTAL_SCREENSHOTS names
the folder; else the test's temporary folder) to look at."""

import configparser
import http.server
import json
import re
import subprocess
import threading
import time

import pytest
import requests

from controller.instances.lease_terms import rfc3339
from tests.fixtures.agent import agent_ok
from tests.fixtures.server import sandbox_with_admin, served

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PASSWORD = "Alice-pass-2026"
COOKIE = "__Host-cc_portal"


def _browser(*extra: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--disable-extensions", "--no-first-run", *extra):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver's path given: Selenium Manager is never asked to fetch one.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class Forger:
    """Another origin (127.0.0.2) serving a page whose form posts itself to the portal."""

    def __init__(self, target: str, fields: dict):
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
        page = (f'<!doctype html><form id="f" method="post" action="{target}">{inputs}</form>'
                '<script>document.getElementById("f").submit()</script>').encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        # Threads of their own: a connection the browser opens ahead and leaves idle holds
        # no other request, nor the shutdown.
        self.server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.2:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def portal():
    state, config, admin = sandbox_with_admin("portal-browser-", PASSWORD)
    try:
        # Leases on: every server made here has one, so each page is seen with its lease.
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(config)
        parser["leases"] = {"default": "36h", "max": "7d"}
        with open(config, "w") as f:
            parser.write(f)
        with served(config, state / "serve.log") as http_:
            token = requests.post(http_.base + "/v1/auth/token", timeout=10,
                                  json={"api_key": admin["api_key"], "api_secret": admin["api_secret"]}).json()
            auth = {"X-Auth-Token": token["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}
            made = requests.post(http_.base + "/v1/user/create", headers=auth, timeout=10,
                                 json={"email": "alice@example.org", "password": PASSWORD, "name": "Alice"}).json()
            agent_ok(config, "account", "enable", "alice@example.org", "--username", "alice")
            agent_ok(config, "user", "grant", "alice@example.org", "create_user")
            agent_ok(config, "image", "add", "--name", "Debian 12", "--os-name", "debian", "--os-major", "12",
                     "--os-minor", "7", "--min-disk", "1", "--min-ram", "256")
            agent_ok(config, "flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
            yield {"base": http_.base, "alice": made["data"]["userid"], "admin": auth}
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=False)


def test_a_users_journey_in_chromium(portal, shots):
    from selenium.webdriver.common.by import By
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    base = portal["base"]
    driver = _browser()
    logs: list[dict] = []

    def visit(path: str, shot: str | None = None):
        driver.get(base + path)
        settle(shot)

    def settle(shot: str | None):
        logs.extend(driver.get_log("browser"))
        assert driver.execute_script("return document.cookie") == ""
        if shot:
            driver.save_screenshot(str(shots / f"{shot}.png"))

    def fill(fields: dict, button: str | None = None, form: str = "main form"):
        for name, value in fields.items():
            box = driver.find_element(By.CSS_SELECTOR, f"{form} [name='{name}']")
            box.clear()
            box.send_keys(value)
        target = driver.find_element(By.XPATH, f"//main//button[normalize-space()='{button}']") if button else \
            driver.find_element(By.CSS_SELECTOR, f"{form} button[type=submit]")
        click(target)

    def arrive(condition: str):
        """Wait until a loaded page meets a JavaScript condition.

        While a page is being replaced, chromedriver may answer a call with an error about
        the old page's nodes ("Node with given id does not belong to the document"), which
        selenium's staleness_of does not expect (it failed CI once): such an answer means
        "not there yet", and only the bound's expiry is a failure.
        """
        def loaded(d) -> bool:
            try:
                return bool(d.execute_script(f"return document.readyState === 'complete' && ({condition})"))
            except WebDriverException:
                return False
        WebDriverWait(driver, 30).until(loaded)

    def click(element):
        """Click, then wait for the page it leads to (the POST, its 303 and the GET) to load.

        The old page carries a mark in its window; the new page has none.
        """
        driver.execute_script("window.ccLeaving = true")
        element.click()
        arrive("window.ccLeaving === undefined")

    def text() -> str:
        return driver.find_element(By.TAG_NAME, "main").text

    try:
        # Log in (from a page that needs it: back there after).
        visit("/portal/servers")
        assert driver.current_url == base + "/portal/login?next=/portal/servers"
        settle("01-login")
        fill({"email": "alice@example.org", "password": "wrong-password-1"})
        assert "Log in failed" in text()
        settle("02-login-failed")
        fill({"email": "alice@example.org", "password": PASSWORD})
        assert driver.current_url == base + "/portal/servers"
        cookie = driver.get_cookie(COOKIE)
        # Chromium keeps a Secure, __Host- cookie from http://127.0.0.1 (a secure context).
        assert cookie and cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/" and "expiry" not in cookie  # a session cookie: no Max-Age
        visit("/portal/", "03-overview-empty")
        assert "alice" in text() and "No home volume yet" in text()

        # Rotate the API secret; the new one logs in at /v1/auth/token, the old one no more.
        visit("/portal/credentials", "04-credentials")
        key = re.search(r"ak_[0-9a-f]{32}", text())[0]
        line = driver.find_element(By.CSS_SELECTOR, "pre.command").text
        assert line == f"cloud login --url {base} --api-key {key} --keep"
        old_secret = requests.get(f"{base}/v1/user/view_api_secret/{portal['alice']}", headers=portal["admin"],
                                  timeout=10).json()["data"]["api_secret"]
        assert requests.post(base + "/v1/auth/token", timeout=10,
                             json={"api_key": key, "api_secret": old_secret}).status_code == 200
        fill({"password": PASSWORD})
        assert driver.current_url == base + "/portal/credentials/new", text()
        secret = driver.find_element(By.CSS_SELECTOR, "code.secret").text
        settle("05-new-secret")
        assert requests.post(base + "/v1/auth/token", timeout=10,
                             json={"api_key": key, "api_secret": secret}).status_code == 200
        assert requests.post(base + "/v1/auth/token", timeout=10,
                             json={"api_key": key, "api_secret": old_secret}).status_code == 401
        driver.refresh()
        settle(None)
        assert secret not in driver.page_source and "already shown" in text()

        # A home volume, then a server; its page shows the console, readiness and the ssh line.
        visit("/portal/volume", "06-volume-none")
        fill({"size": "5"})
        assert "5 GB" in text()
        settle("07-volume")
        visit("/portal/servers/new", "08-server-new")
        fill({}, "Create server")
        assert re.fullmatch(re.escape(base) + r"/portal/servers/[0-9a-f-]{36}\?done=server-created", driver.current_url)
        server_url = driver.current_url.split("?")[0]
        settle("09-server")
        page = text()
        assert "Server created" in page
        assert "Status" in page and "running" in page and "Ready" in page and "Console" in page
        # The sandbox runs no guest: it says so, offers no ssh line and does not reload forever.
        assert "never in the sandbox" in page and "nothing to log in to" in page
        assert not driver.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
        assert "create alice@example.org success" in page.replace("\n", " ")
        fill({}, "Stop", form="main form.inline")
        assert "shutoff" in text() and "Server stopped." in text()
        # Stopped: only Start (and the delete link) offered, no readiness, no ssh line.
        assert [b.text for b in driver.find_elements(By.CSS_SELECTOR, "main form.inline button")] == ["Start"]
        assert "Ready" not in text() and "ssh " not in text()
        settle("09b-server-stopped")
        fill({}, "Start", form="main form.inline")
        assert "running" in text()
        visit("/portal/servers", "10-servers")
        assert "Debian 12" in text() and "small" in text()

        # Groups.
        visit("/portal/groups")
        fill({"name": "proj", "members": "alice"}, "Create the group")
        assert "proj" in text()
        settle("11-groups")

        # The owner's managed users.
        visit("/portal/users")
        fill({"email": "dan@example.org", "name": "Dan", "password": "Dan-pass-2026xx",
              "password_again": "Dan-pass-2026xx"}, "Create the user")
        assert "dan@example.org" in text()
        settle("12-users")
        click(driver.find_element(By.LINK_TEXT, "dan@example.org"))
        fill({"name": "Daniel"}, "Save")
        assert "Daniel" in text()

        # A forged form from another origin: the browser sends no cookie (SameSite=Strict) and
        # says cross-site; the portal refuses it and the server stays.
        forger = Forger(server_url + "/delete", {"csrf": "x"})
        try:
            driver.get(forger.url)
            arrive(f"location.href.startsWith({json.dumps(base + '/portal/')})")
            settle(None)
            assert "Not allowed" in driver.find_element(By.TAG_NAME, "h1").text
            settle("13-forged-refused")
        finally:
            forger.close()
        visit(server_url[len(base):])
        assert "running" in text()
        forger = Forger(base + "/portal/credentials/rotate", {"password": PASSWORD})
        try:
            driver.get(forger.url)
            arrive(f"location.href.startsWith({json.dumps(base + '/portal/')})")
            settle(None)
            assert "Not allowed" in driver.find_element(By.TAG_NAME, "h1").text
        finally:
            forger.close()
        assert requests.post(base + "/v1/auth/token", timeout=10,
                             json={"api_key": key, "api_secret": secret}).status_code == 200

        # Delete the server after its confirmation page.
        visit(server_url[len(base):] + "/delete", "14-server-delete")
        fill({}, "Delete the server")
        assert "No servers yet." in text()
        visit("/portal/password", "15-password")
        visit("/portal/", "16-overview")

        # Log out; the old cookie replayed opens nothing.
        old_cookie = driver.get_cookie(COOKIE)["value"]
        click(driver.find_element(By.CSS_SELECTOR, "form.logout button"))
        assert driver.current_url == base + "/portal/login?done=logged-out" and "You are logged out." in text()
        assert driver.get_cookie(COOKIE) is None
        settle(None)
        replay = requests.get(base + "/portal/", cookies={COOKIE: old_cookie}, allow_redirects=False, timeout=10)
        assert replay.status_code == 303 and replay.headers["Location"].startswith("/portal/login")
        replay = requests.post(base + "/portal/logout", cookies={COOKIE: old_cookie}, allow_redirects=False,
                               timeout=10)
        assert replay.status_code == 403
    finally:
        driver.quit()
    violations = [e for e in logs if "Content Security Policy" in e.get("message", "")]
    assert violations == []
    assert sorted(p.name for p in shots.glob("*.png"))[:3] == ["01-login.png", "02-login-failed.png",
                                                                "03-overview-empty.png"]


# Every page a user can reach, as paths from what test_every_page_fits_a_phone_and_a_laptop makes.
PAGES = ["/portal/", "/portal/servers", "/portal/servers/new", "/portal/servers/{server}",
         "/portal/servers/{server}/delete", "/portal/volume", "/portal/groups", "/portal/groups/{group}/delete",
         "/portal/users", "/portal/users/{user}", "/portal/credentials", "/portal/password",
         "/portal/servers/no-such-server"]


def _alice_with_a_server(base: str):
    """alice's API caller (method, path, body -> data) over HTTP, with her home made if it is
    not yet; a new server of hers (its id); her auth headers; her user id."""
    login = requests.post(base + "/v1/auth/token", json={"email": "alice@example.org", "password": PASSWORD},
                          timeout=10).json()["data"]
    alice = {"X-Auth-Token": login["token"], "X-Auth-Cloudauth-Id": login["userid"]}

    def api(method, path, body=None):
        return requests.request(method, base + path, json=body, headers=alice, timeout=30).json()["data"]

    if not api("GET", "/v1/storage-volume"):
        api("POST", "/v1/storage-volume", {"volume-size": 1, "volume-type": {"visibility": "cluster"}})
    image = api("GET", "/v1/server-image")[0]["id"]
    flavor = api("GET", "/v1/server-flavor")[0]["id"]
    server = api("POST", "/v1/server-instance", {"server-image": image, "server-flavor": flavor})[0]["id"]
    return api, server, alice, login["userid"]


def test_every_page_fits_a_phone_and_a_laptop(portal, shots):
    """At 390x844 (a phone) no page is wider than the screen; a screenshot of each page at
    1280 and at 390 pixels is saved to look at."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base = portal["base"]
    api, server, alice, alice_id = _alice_with_a_server(base)
    group = api("POST", "/v1/group", {"group-name": "phones", "group-members": ["alice"]})[0]["group-id"]
    managed = requests.post(base + "/v1/user/create", headers=alice, timeout=10, json={
        "email": "mo@example.org", "password": PASSWORD, "owner_userid": alice_id}).json()["data"]["userid"]
    driver = _browser()
    try:
        driver.get(base + "/portal/login")
        driver.find_element(By.NAME, "email").send_keys("alice@example.org")
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
        WebDriverWait(driver, 10).until(lambda d: not d.current_url.endswith("/login"))
        too_wide = {}
        for path in ["/portal/login?x"] + PAGES:
            path = path.format(server=server, group=group, user=managed)
            name = re.sub(r"[^a-z0-9]+", "-", path.split("?")[0].replace(server, "server").replace(
                group, "group").replace(managed, "user")).strip("-")
            for width, height in ((1280, 900), (390, 844)):
                driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})
                driver.get(base + path)
                wide = driver.execute_script("return document.documentElement.scrollWidth")
                if width == 390 and wide > 390:
                    too_wide[path] = wide
                driver.save_screenshot(str(shots / f"width-{width}-{name}.png"))
        assert too_wide == {}, too_wide
    finally:
        driver.quit()


def test_a_plain_http_login_at_a_host_name_says_why_it_cannot_stay(portal, shots):
    """Over plain HTTP at a name that is not loopback the browser drops the __Host- cookie: the
    login page says so, before and after a good login. The name is mapped to 127.0.0.1 inside
    the browser alone (no traffic leaves the machine)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    port = portal["base"].rsplit(":", 1)[1]
    driver = _browser("--host-resolver-rules=MAP cluster.test 127.0.0.1")
    try:
        driver.get(f"http://cluster.test:{port}/portal/login")
        notice = driver.find_element(By.CSS_SELECTOR, "main p.error").text
        assert "This portal needs HTTPS, or localhost" in notice and "cluster.test" in notice
        driver.find_element(By.NAME, "email").send_keys("alice@example.org")
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
        WebDriverWait(driver, 10).until(lambda d: "next=" in d.current_url)  # back at the login page
        assert driver.get_cookie(COOKIE) is None
        assert "This portal needs HTTPS, or localhost" in driver.find_element(By.CSS_SELECTOR, "main p.error").text
        driver.save_screenshot(str(shots / "plain-http-login.png"))
    finally:
        driver.quit()


def test_a_lease_badge_and_its_renewal_in_chromium(portal, shots):
    """A server whose lease ends within the first warning shows it on its page; the renew form
    (hours left empty: the default, 36 h) moves the stored end and the badge says so."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base = portal["base"]
    api, server, _alice, _alice_id = _alice_with_a_server(base)
    ending = api("POST", f"/v1/server-instance/{server}/lease", {"hours": 2})[0]
    assert ending["lease"] == "expiring"
    driver = _browser()
    try:
        driver.get(base + f"/portal/login?next=/portal/servers/{server}")
        driver.find_element(By.NAME, "email").send_keys("alice@example.org")
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
        WebDriverWait(driver, 10).until(lambda d: d.current_url.endswith(f"/portal/servers/{server}"))
        badge = driver.find_element(By.CSS_SELECTOR, "main dd .lease-expiring")
        assert badge.text == "expires in 1 h"
        assert badge.find_element(By.TAG_NAME, "time").get_attribute("datetime") == ending["expires-at"]
        driver.save_screenshot(str(shots / "lease-expiring.png"))
        driver.find_element(By.CSS_SELECTOR, "form.renew [name='hours']").clear()
        before = time.time()
        driver.find_element(By.XPATH, "//main//button[normalize-space()='Renew lease']").click()
        WebDriverWait(driver, 10).until(lambda d: d.current_url.endswith("?done=lease-renewed"))
        after = time.time()
        assert "Lease renewed" in driver.find_element(By.TAG_NAME, "main").text
        assert re.fullmatch(r"ends in 3[56] h", driver.find_element(By.CSS_SELECTOR, "main dd .lease-active").text)
        driver.save_screenshot(str(shots / "lease-renewed.png"))
    finally:
        driver.quit()
    renewed = api("GET", f"/v1/server-instance/{server}")[0]
    assert renewed["lease"] == "active"
    assert rfc3339(before - 1 + 36 * 3600) <= renewed["expires-at"] <= rfc3339(after + 1 + 36 * 3600)
    api("DELETE", f"/v1/server-instance/{server}")
