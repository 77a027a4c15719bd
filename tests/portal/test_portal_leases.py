"""Instance leases in the cloud portal through HTTP (falcon.testing, fake host adapters), with
leases on ([leases] default = 36h, max = 7d): the lease badge on the servers list, the
overview and the server's page in each state, the renew form (the stored end moved, the
confirmation, a refusal in place with the hours kept, the CSRF check), and an expired
server's page (said plainly, no power-on offered, the API's refusal if one is sent anyway)."""

import re
import time

import pytest

from controller.instances.lease_terms import rfc3339
from tests.fixtures.api import config_values_for, enable, make_caller
from tests.portal.test_portal_pages import Browser, alice, browser, client, clock, world  # noqa: F401 (fixtures)

BADGE = re.compile(r'<span class="status lease lease-([a-z]+)">([a-z ]+)<time datetime="([0-9TZ:-]+)" '
                   r'title="([0-9TZ:-]+)">([^<]*)</time></span>')
BUTTONS = re.compile(r'<button type="submit" name="task" value="([a-z]+)">')


@pytest.fixture
def config_values(tmp_path):
    values = config_values_for(tmp_path)
    values["leases"] = {"default": "36h", "max": "7d"}
    return values


def _expires_at(ctx, instance_id: str) -> str | None:
    return ctx.store.get_instance(instance_id, visible_to=None)["expires_at"]


def _within(expires_at: str, before: float, after: float, seconds: int) -> bool:
    return rfc3339(before + seconds) <= expires_at <= rfc3339(after + seconds)


# Each state: the end set, the badge's words, what its time says, and whether the overview lists it.
STATES = {
    "active": (lambda: "2030-01-01T00:00:00Z", "ends ", "on 2030-01-01", False),
    "expiring": (lambda: rfc3339(time.time() + 2 * 3600 + 600), "expires ", "in 2 h", True),
    "expired": (lambda: rfc3339(time.time() - 3 * 3600 - 600), "expired ", "3 hours ago", True),
}


def test_a_new_server_gets_the_default_lease_and_its_badge(cctx, browser, world):
    assert _within(_expires_at(cctx, world["id"]), time.time() - 60, time.time(), 36 * 3600)
    page = browser.get(f"/portal/servers/{world['id']}").text
    assert [b[:2] for b in BADGE.findall(page)] == [("active", "ends ")]
    assert 'action="/portal/servers/' + world["id"] + '/lease"' in page and 'name="hours" value=""' in page


@pytest.mark.parametrize("state", STATES)
def test_the_lease_badge_on_the_list_the_overview_and_the_servers_page(cctx, browser, world, state):
    end, words, said, listed = STATES[state]
    expires_at = end()
    assert cctx.store.set_instance_lease(world["id"], expires_at)
    for path in ("/portal/servers", f"/portal/servers/{world['id']}"):
        page = browser.get(path).text
        assert BADGE.findall(page) == [(state, words, expires_at, expires_at, said)], path
    overview = browser.get("/portal/").text
    if listed:
        # The overview lists the server, linked, with its badge.
        assert "<h3>Leases ending</h3>" in overview
        assert f'<a href="/portal/servers/{world["id"]}">' in overview
        assert BADGE.findall(overview) == [(state, words, expires_at, expires_at, said)]
    else:
        assert "Leases ending" not in overview and not BADGE.findall(overview)
    page = browser.get(f"/portal/servers/{world['id']}").text
    assert ("This server's lease ended at" in page) == (state == "expired")


def test_no_lease_no_badge_and_no_renew_form(cctx, browser, world):
    assert cctx.store.set_instance_lease(world["id"], None)
    for path in ("/portal/", "/portal/servers", f"/portal/servers/{world['id']}"):
        page = browser.get(path).text
        assert "lease-" not in page and "Renew lease" not in page, path


def test_the_renew_form_moves_the_stored_end(cctx, browser, world):
    base = f"/portal/servers/{world['id']}"
    cctx.store.set_instance_lease(world["id"], STATES["expiring"][0]())
    browser.get(base)
    before = time.time()
    r = browser.post(f"{base}/lease", {"hours": "100"})
    assert r.status_code == 303 and r.headers["location"] == f"{base}?done=lease-renewed"
    assert _within(_expires_at(cctx, world["id"]), before, time.time(), 100 * 3600)
    page = browser.get(r.headers["location"]).text
    assert "Lease renewed" in page and [b[:2] for b in BADGE.findall(page)] == [("active", "ends ")]
    assert "<td>renew</td><td>alice@example.org</td><td>success</td>" in page
    # Empty: the default lease (36 h) from now.
    before = time.time()
    assert browser.post(f"{base}/lease", {"hours": ""}).status_code == 303
    assert _within(_expires_at(cctx, world["id"]), before, time.time(), 36 * 3600)


@pytest.mark.parametrize("hours, said, status", [
    ("200", "hours 200 is beyond the longest lease allowed: 168 hours ([leases] max)", 400),
    ("soon", "hours must be a number above 0, or empty for the default lease", 400),
    ("-1", "hours: -1.0 is less than or equal to the minimum of 0", 400)])
def test_a_refused_renewal_is_shown_in_place_with_the_hours_kept_and_changes_nothing(cctx, browser, world, hours,
                                                                                     said, status):
    base = f"/portal/servers/{world['id']}"
    kept = _expires_at(cctx, world["id"])
    browser.get(base)
    r = browser.post(f"{base}/lease", {"hours": hours})
    assert r.status_code == status and said in r.text
    assert '<p class="error" role="alert">' in r.text and "<h1>Server " in r.text
    assert f'name="hours" value="{hours}"' in r.text
    assert _expires_at(cctx, world["id"]) == kept


def test_a_renewal_without_the_csrf_value_is_refused_and_changes_nothing(cctx, browser, world):
    base = f"/portal/servers/{world['id']}"
    kept = _expires_at(cctx, world["id"])
    browser.get(base)
    for sent in ({"hours": "100"}, {"hours": "100", "csrf": "0" * 64}):
        r = browser.post(f"{base}/lease", sent, csrf=False)
        assert r.status_code == 403
    assert browser.post(f"{base}/lease", {"hours": "100"}, csrf=True, headers={"Sec-Fetch-Site": "cross-site"}
                        ).status_code == 403
    assert _expires_at(cctx, world["id"]) == kept


def test_an_expired_servers_page_says_so_and_offers_no_power_on(cctx, browser, world):
    base = f"/portal/servers/{world['id']}"
    assert browser.post(f"{base}/power", {"task": "stop"}).status_code == 303
    ended = STATES["expired"][0]()
    cctx.store.set_instance_lease(world["id"], ended)
    page = browser.get(base).text
    assert ("This server's lease ended at " f'<time datetime="{ended}">{ended}</time>: it was powered off. '
            "Renew it to power it on again; unless renewed it is deleted after the site's keep period. "
            "Files in your home are not affected.") in page
    # Stopped and expired: no Start (the API would refuse it), no "start it to log in".
    assert BUTTONS.findall(page) == [] and "start it to log in" not in page and "Renew lease" in page
    # Sent anyway: the API's refusal on the page itself.
    r = browser.post(f"{base}/power", {"task": "start"})
    assert r.status_code == 409 and f"lease expired at {ended}; renew it first" in r.text
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "shutoff"
    # Renewed: Start again, and it starts.
    assert browser.post(f"{base}/lease", {"hours": "2"}).status_code == 303
    page = browser.get(base).text
    assert BUTTONS.findall(page) == ["start"] and "lease ended" not in page
    assert browser.post(f"{base}/power", {"task": "start"}).status_code == 303
    assert cctx.adapters.hypervisor.instances[world["id"]].status == "running"


def test_a_running_expired_server_offers_stop_alone(cctx, browser, world):
    cctx.store.set_instance_lease(world["id"], STATES["expired"][0]())
    assert BUTTONS.findall(browser.get(f"/portal/servers/{world['id']}").text) == ["stop"]


def test_leases_off_the_renewal_is_the_apis_409_and_anothers_server_404(cctx, client, browser, world):
    base = f"/portal/servers/{world['id']}"
    eve = make_caller(cctx, "eve@example.org")
    enable(cctx, eve, username="eve")
    other = Browser(client)
    other.login(eve.email)
    other.get("/portal/")
    kept = _expires_at(cctx, world["id"])
    r = other.post(f"{base}/lease", {"hours": "1"})
    assert r.status_code == 404 and _expires_at(cctx, world["id"]) == kept
    cctx.config = cctx.config.with_values({"leases": {"default": "", "max": ""}})
    browser.get(base)
    r = browser.post(f"{base}/lease", {"hours": "1"})
    assert r.status_code == 409 and "leases are off on this cluster" in r.text and 'name="hours" value="1"' in r.text
    assert _expires_at(cctx, world["id"]) == kept


def test_the_overview_lists_the_soonest_ends_and_counts_the_rest():
    from controller.portal.views import ENDING_SHOWN, ending_leases

    servers = [{"id": f"i{n:02d}", "expires_at": f"2026-12-{n + 1:02d}T00:00:00Z",
                "lease": ("expired", "expiring", "active", "none")[n % 4]} for n in range(28)]
    shown = ending_leases(list(reversed(servers)))
    assert [s["id"] for s in shown["ending"]] == [s["id"] for s in servers if s["lease"] in ("expired", "expiring")
                                                  ][:ENDING_SHOWN]
    assert shown["ending_more"] == 14 - ENDING_SHOWN
