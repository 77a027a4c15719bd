"""The portal at cloud auth showing two clusters, in a real browser (Debian's chromium,
headless, through Debian's chromedriver): cloud auth (also cluster 1, hpc1) and a
controller following it (cluster 2, hpc2): two real `cloud-agent serve` processes
on the loopback, each with its own database.

One portal login; a home volume and a server made on each cluster from its own pages (the
effect read back from each controller's API); a group on hpc2; the overview with both
clusters side by side. hpc2 SIGSTOPped: the overview answers within `timeout_seconds`
with hpc2's card unreachable, and hpc1's pages work. On every new page the portal's
headers hold, a POST without the session's CSRF value or from another origin changes
nothing, and a forged cross-site form is refused. Logging out revokes the session's token
on hpc2 within `poll_seconds` and a request."""

import configparser
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from controller.portal.sessions import token_of
from tests.fixtures.agent import agent_ok
from tests.fixtures.clouds import cloud_of, until
from tests.portal.test_portal_browser import COOKIE, Forger, _browser

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

PASSWORD = "Two-clusters-2026"
TIMEOUT = 2  # [cloud_auth] timeout_seconds at cloud auth: the portal's calls to hpc2
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


@pytest.fixture
def two(tmp_path):
    with cloud_of(tmp_path, PASSWORD, ids=(2,), timeout_seconds=1,
                  auth_keys={"controller": {"name": "hpc1"}, "cloud_auth": {"timeout_seconds": TIMEOUT}}) as cloud:
        auth, hpc2 = cloud["auth"], cloud["clusters"][2]
        admin = cloud["admin"]
        status, _, token = auth.call("POST", "/v1/auth/token", {"api_key": admin["api_key"],
                                                               "api_secret": admin["api_secret"]})
        assert status == 200, token
        as_admin = {"X-Auth-Token": token["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}
        status, _, made = auth.call("POST", "/v1/user/create", {"email": "alice@example.org", "password": PASSWORD},
                                    headers=as_admin)
        assert status == 200, made
        for config in (cloud["auth_config"], hpc2["config"]):
            agent_ok(config, "image", "add", "--name", "Debian 12", "--os-name", "debian", "--os-major", "12",
                     "--os-minor", "7", "--min-disk", "1", "--min-ram", "256")
            agent_ok(config, "flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
        # hpc2 learns alice from the feed before its account is made there.
        assert until(lambda: any(u["email"] == "alice@example.org"
                                  for u in agent_ok(hpc2["config"], "user", "list")["users"]), 10)
        agent_ok(cloud["auth_config"], "account", "enable", "alice@example.org", "--username", "alice")
        agent_ok(hpc2["config"], "account", "enable", "alice@example.org", "--username", "alice")
        cloud["alice"] = made["data"]["userid"]
        yield cloud


def _api(cluster_http, token: str, user_id: str, path: str):
    got = requests.get(cluster_http.base + path, timeout=10,
                       headers={"X-Auth-Token": token, "X-Auth-Cloudauth-Id": user_id})
    return got.status_code, got.json() if got.headers.get("Content-Type", "").startswith("application/json") else {}


def test_one_portal_two_clusters_in_chromium(two, shots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.ui import WebDriverWait

    auth, hpc2 = two["auth"], two["clusters"][2]
    hpc2_api, base = hpc2["http"], auth.base
    login = requests.post(base + "/v1/auth/token", json={"email": "alice@example.org", "password": PASSWORD},
                          timeout=10).json()["data"]
    api_token, alice = login["token"], two["alice"]
    driver = _browser()
    logs: list[dict] = []

    def visit(path: str) -> None:
        driver.get(base + path)
        logs.extend(driver.get_log("browser"))
        assert driver.execute_script("return document.cookie") == ""
        name = path.strip("/").replace("/", "_") or "overview"
        driver.save_screenshot(str(shots / f"clusters-{name}.png"))

    def submit(form_action: str) -> None:
        button = driver.find_element(By.CSS_SELECTOR, f'form[action="{form_action}"] button[type="submit"]')
        button.click()
        WebDriverWait(driver, 10).until(staleness_of(button))  # the next page has loaded
        logs.extend(driver.get_log("browser"))

    try:
        visit("/portal/login")
        driver.find_element(By.NAME, "email").send_keys("alice@example.org")
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        WebDriverWait(driver, 10).until(lambda d: not d.current_url.endswith("/login"))
        assert driver.current_url.rstrip("/") == base + "/portal", \
            [e.text for e in driver.find_elements(By.CSS_SELECTOR, "p.error")]
        cookie = driver.get_cookie(COOKIE)["value"]

        # The overview: both clusters side by side, each with alice's account there.
        cards = {c.get_attribute("data-cluster"): c.text for c in driver.find_elements(By.CSS_SELECTOR, "section.cluster")}
        assert set(cards) == {"1", "2"}, cards
        assert all("alice" in text and "Limits" in text for text in cards.values()), cards

        # A home volume on each cluster (1 GB on hpc1, 2 GB on hpc2), from its pages.
        for cid, http, gb in (("1", auth, 1), ("2", hpc2_api, 2)):
            visit(f"/portal/c/{cid}/volume")
            size = driver.find_element(By.NAME, "size")
            size.clear()
            size.send_keys(str(gb))
            submit(f"/portal/c/{cid}/volume")
            status, body = _api(http, api_token, alice, "/v1/storage-volume")
            assert [(v["cloudauth-id"], v["volume-size"]) for v in body["data"]] == [(alice, gb)], body

        # A server on each cluster from its own pages.
        made = {}
        for cid, http in (("1", auth), ("2", hpc2_api)):
            visit(f"/portal/c/{cid}/servers/new")
            submit(f"/portal/c/{cid}/servers/new")
            errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "p.error")]
            assert f"/portal/c/{cid}/servers/" in driver.current_url and not errors, (driver.current_url, errors)
            assert driver.current_url.endswith("?done=server-created")
            made[cid] = driver.current_url.split("?")[0].rsplit("/", 1)[1]
            assert "Server " in driver.find_element(By.TAG_NAME, "h1").text
            status, body = _api(http, api_token, alice, "/v1/server-instance")
            assert status == 200 and [s["id"] for s in body["data"]] == [made[cid]], body
        # hpc1's server is not on hpc2 and the other way round.
        assert made["1"] != made["2"]

        # A group on hpc2, from its pages.
        visit("/portal/c/2/groups")
        driver.find_element(By.NAME, "name").send_keys("alicelab")
        submit("/portal/c/2/groups")
        status, body = _api(hpc2_api, api_token, alice, "/v1/group")
        assert [(g["group-name"], g["group-members"]) for g in body["data"]] == [("alicelab", ["alice"])], body

        # The overview again: each cluster counts its own server and shows its own volume.
        visit("/portal/")
        cards = {c.get_attribute("data-cluster"): c.text for c in driver.find_elements(By.CSS_SELECTOR, "section.cluster")}
        assert "None yet." not in cards["1"] and "None yet." not in cards["2"], cards
        assert "1 GB" in cards["1"] and "2 GB" in cards["2"], cards

        # Every new page: 200 with the portal's headers (read with the browser's session cookie).
        jar = {"Cookie": f"{COOKIE}={cookie}"}
        for path in ("/portal/", "/portal/c/2", "/portal/c/2/servers", "/portal/c/2/servers/new",
                     f"/portal/c/2/servers/{made['2']}", f"/portal/c/2/servers/{made['2']}/delete",
                     "/portal/c/2/volume", "/portal/c/2/groups", "/portal/c/1/servers"):
            got = requests.get(base + path, headers=jar, timeout=10, allow_redirects=False)
            assert got.status_code == 200, (path, got.status_code, got.text[:500])
            assert {k: got.headers.get(k) for k in HEADERS} == HEADERS, path
        # A cluster the portal does not show: 404 in the portal's page, with its headers.
        got = requests.get(base + "/portal/c/9/servers", headers=jar, timeout=10)
        assert got.status_code == 404 and got.headers["X-Frame-Options"] == "DENY"

        # POSTs to hpc2's pages without the session's CSRF value, or from another origin: 403, nothing made.
        form = {"image": "x", "flavor": "x"}
        got = requests.post(base + "/portal/c/2/servers/new", data=form, headers=jar, timeout=10)
        assert got.status_code == 403 and got.headers["Cache-Control"] == "no-store"
        got = requests.post(base + f"/portal/c/2/servers/{made['2']}/delete", timeout=10,
                            data={"csrf": driver.find_element(By.NAME, "csrf").get_attribute("value")},
                            headers={**jar, "Origin": "http://127.0.0.2:8000"})
        assert got.status_code == 403
        forger = Forger(base + f"/portal/c/2/servers/{made['2']}/delete", {"csrf": "guessed"})
        try:
            driver.get(forger.url)
            time.sleep(1.5)
        finally:
            forger.close()
        status, body = _api(hpc2_api, api_token, alice, "/v1/server-instance")
        assert [s["id"] for s in body["data"]] == [made["2"]], body  # still there

        # hpc2 hung: the overview answers within the timeout, its card unreachable, hpc1's current.
        os.kill(hpc2["proc"].pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            visit("/portal/")
            took = time.monotonic() - started
            assert took < TIMEOUT + 2, took
            cards = {c.get_attribute("data-cluster"): c for c in driver.find_elements(By.CSS_SELECTOR, "section.cluster")}
            assert "Unreachable" in cards["2"].text and "hpc2" in cards["2"].text, cards["2"].text
            assert "Unreachable" not in cards["1"].text and "alice" in cards["1"].text
            visit("/portal/c/1/servers")
            assert made["1"] in driver.page_source or driver.find_elements(By.CSS_SELECTOR, "table tbody tr")
            started = time.monotonic()
            got = requests.get(base + "/portal/c/2/servers", headers=jar, timeout=10)
            assert got.status_code == 503 and time.monotonic() - started < TIMEOUT + 2
            assert "hpc2" in got.text and got.headers["Retry-After"]
        finally:
            os.kill(hpc2["proc"].pid, signal.SIGCONT)

        # Its pages come back by themselves.
        visit("/portal/c/2/servers")
        assert driver.find_elements(By.CSS_SELECTOR, "table tbody tr")

        # Log out: the session's token (used on hpc2 by the pages above) is revoked there.
        session_token = token_of(cookie)
        assert _api(hpc2_api, session_token, alice, "/v1/server-instance")[0] == 200
        driver.find_element(By.CSS_SELECTOR, 'form[action="/portal/logout"] button').click()
        ended = time.monotonic()
        assert until(lambda: _api(hpc2_api, session_token, alice, "/v1/server-instance")[0] == 401, 5)
        assert time.monotonic() - ended < 2.5
        # The API token alice got by herself is another login: it works on.
        assert _api(hpc2_api, api_token, alice, "/v1/server-instance")[0] == 200

        # Neither the session's cookie id nor its token, in hpc2's database or log, nor at cloud auth
        # (which keeps their hashes only).
        for config, log in ((hpc2["config"], two["logs"] / "hpc2.log"), (two["auth_config"], two["logs"] / "auth.log")):
            parser = configparser.ConfigParser(interpolation=None)
            parser.read(config)
            database = Path(parser.get("database", "path"))
            stored = b"".join(Path(f"{database}{suffix}").read_bytes() for suffix in ("", "-wal")
                              if Path(f"{database}{suffix}").exists()) + log.read_bytes()
            assert cookie.encode() not in stored and session_token.encode() not in stored, config

        violations = [e for e in logs if "Content Security Policy" in e.get("message", "")]
        assert violations == [], violations
    finally:
        driver.quit()
