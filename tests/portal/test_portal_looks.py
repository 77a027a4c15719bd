"""What the portal's pages look like beyond their content: times said as people say them (past
and to come), the status and lease badges' contrast, the skip link (the widths on a phone are measured in the browser
tests, tests/portal/test_portal_browser.py)."""

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from api.portal.render import ago, until

CSS = (Path(__file__).parents[2] / "api" / "portal" / "static" / "portal.css").read_text()
NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("value, said", [
    ("2026-12-02T11:59:50Z", "just now"), ("2026-12-02T11:59:00Z", "1 minute ago"),
    ("2026-12-02T11:55:00Z", "5 minutes ago"), ("2026-12-02T09:00:00Z", "3 hours ago"),
    ("2026-11-30T12:00:00Z", "2 days ago"), ("2026-09-01T12:00:00Z", "2026-09-01")])
def test_times_are_said_as_people_say_them_with_the_exact_time_on_hover(value, said):
    assert str(ago(value, NOW)) == f'<time datetime="{value}" title="{value}">{said}</time>'


def test_a_value_that_is_not_a_time_is_shown_as_it_is_escaped():
    assert str(ago("<b>then</b>", NOW)) == "&lt;b&gt;then&lt;/b&gt;" and str(ago(None, NOW)) == ""


@pytest.mark.parametrize("value, said", [
    ("2026-12-02T12:00:00Z", "now"), ("2026-12-02T11:00:00Z", "now"), ("2026-12-02T12:00:40Z", "in under a minute"),
    ("2026-12-02T12:40:30Z", "in 40 min"), ("2026-12-02T17:00:00Z", "in 5 h"), ("2026-12-04T11:59:00Z", "in 47 h"),
    ("2026-12-05T12:00:00Z", "in 3 days"), ("2030-01-01T00:00:00Z", "on 2030-01-01")])
def test_times_to_come_are_said_as_people_say_them_with_the_exact_time_on_hover(value, said):
    assert str(until(value, NOW)) == f'<time datetime="{value}" title="{value}">{said}</time>'
    assert str(until("<b>then</b>", NOW)) == "&lt;b&gt;then&lt;/b&gt;" and str(until(None, NOW)) == ""


def _luminance(hex_color: str) -> float:
    channels = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


# Every badge: a server's status, then its lease (templates/macros.html, lease_badge).
BADGES = ("status-running", "status-building", "status-paused", "status-shutoff", "status-crashed", "status-error",
          "lease-active", "lease-expiring", "lease-expired")


def test_every_status_and_lease_badge_has_a_contrast_of_at_least_4_5():
    variables = dict(re.findall(r"--([a-z]+): (#[0-9a-f]{6})", CSS))
    base_background = re.search(r"\.status \{[^}]*background: (#[0-9a-f]{6})", CSS)[1]
    checked = 0
    for badge in BADGES:
        rule = next(body for names, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS)
                    if re.search(rf"\.{badge}\b", names))
        background = re.search(r"background: (#[0-9a-f]{6})", rule)
        color = re.search(r"color: (#[0-9a-f]{6}|var\(--([a-z]+)\))", rule)
        fg = color[1] if color and color[1].startswith("#") else variables[color[2] if color else "ink"]
        ratio = _contrast(fg, background[1] if background else base_background)
        assert ratio >= 4.5, (badge, fg, ratio)
        checked += 1
    assert checked == len(BADGES)


def test_each_lease_badge_is_drawn_as_a_badge_by_the_template():
    """The classes the contrast above is checked for are the ones the lease badge uses."""
    from api.portal.render import _env

    macro = _env.from_string('{% from "macros.html" import lease_badge %}{{ lease_badge(s) }}')
    for lease in ("active", "expiring", "expired"):
        drawn = macro.render(s={"lease": lease, "expires_at": "2030-01-01T00:00:00Z"})
        assert f'<span class="status lease lease-{lease}">' in drawn and 'datetime="2030-01-01T00:00:00Z"' in drawn
    assert macro.render(s={"lease": "none", "expires_at": None}) == ""


def test_every_page_starts_with_a_skip_link_to_its_main(cctx):
    from falcon import testing

    from api.app import create_app

    client = testing.TestClient(create_app(cctx, interfaces=("controller", "user", "portal")))
    page = client.simulate_get("/portal/login").text
    assert page.index('<a class="skip" href="#main">') < page.index("<header") and '<main id="main">' in page
