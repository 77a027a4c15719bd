"""What the portal's pages look like beyond their content: times said as people say them, the
status badges' contrast, the skip link (the widths on a phone are measured in the browser
tests, tests/portal/test_portal_browser.py)."""

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from api.portal.render import ago

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


def _luminance(hex_color: str) -> float:
    channels = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_every_status_badge_has_a_contrast_of_at_least_4_5():
    variables = dict(re.findall(r"--([a-z]+): (#[0-9a-f]{6})", CSS))
    base_background = re.search(r"\.status \{[^}]*background: (#[0-9a-f]{6})", CSS)[1]
    checked = 0
    for status in ("running", "building", "paused", "shutoff", "crashed", "error"):
        rule = next(body for names, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS)
                    if re.search(rf"\.status-{status}\b", names))
        background = re.search(r"background: (#[0-9a-f]{6})", rule)
        color = re.search(r"color: (#[0-9a-f]{6}|var\(--([a-z]+)\))", rule)
        fg = color[1] if color and color[1].startswith("#") else variables[color[2] if color else "ink"]
        ratio = _contrast(fg, background[1] if background else base_background)
        assert ratio >= 4.5, (status, fg, ratio)
        checked += 1
    assert checked == 6


def test_every_page_starts_with_a_skip_link_to_its_main(cctx):
    from falcon import testing

    from api.app import create_app

    client = testing.TestClient(create_app(cctx, interfaces=("controller", "user", "portal")))
    page = client.simulate_get("/portal/login").text
    assert page.index('<a class="skip" href="#main">') < page.index("<header") and '<main id="main">' in page
