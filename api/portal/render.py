"""Pages from Jinja2 templates (autoescaping on for every template, never `|safe`), and the
portal's error page: the status and message the service decided, in the site's layout."""

from datetime import datetime, timezone
from pathlib import Path

import falcon
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from api.error_responses import status_of
from controller.errors import ControllerError, ServerBusy, TooManyRequests

_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


# The one-line confirmation a page shows after an action (its `done` parameter names one of
# these: no text of the URL is ever shown).
DONE = {
    "server-created": "Server created: it is starting. This page follows it until it is ready.",
    "server-started": "Server started.", "server-stopped": "Server stopped.", "server-rebooted": "Server rebooted.",
    "server-deleted": "Server deleted.", "users-changed": "Who may log in was changed.",
    "volume-created": "Home volume created.", "volume-deleted": "Home volume deleted.",
    "group-created": "Group created.", "group-changed": "Group members changed.", "group-deleted": "Group deleted.",
    "user-created": "User created: they can log in with the password you gave.", "user-saved": "User saved.",
    "logged-out": "You are logged out.", "lease-renewed": "Lease renewed: its new end is shown below.",
}


def _utc(value: str | None) -> "datetime | Markup":
    """The time an RFC 3339 UTC value says, or what to show instead: nothing for no value,
    the value itself (escaped) when it is not such a time."""
    if not value:
        return Markup("")
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return escape(value)


def ago(value: str | None, now: datetime | None = None) -> Markup:
    """An RFC 3339 UTC time as "5 minutes ago", the exact time on hover (its title) and in its
    datetime attribute; a value that is not such a time is shown as it is."""
    at = _utc(value)
    if not isinstance(at, datetime):
        return at
    seconds = max(0, int(((now or datetime.now(timezone.utc)) - at).total_seconds()))
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            n = seconds // size
            said = f"{n} {unit}{'s' if n != 1 else ''} ago"
            break
    else:
        said = "just now"
    if seconds >= 30 * 86400:
        said = at.strftime("%Y-%m-%d")
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(value, said)


def until(value: str | None, now: datetime | None = None) -> Markup:
    """ago's counterpart for a time to come (a lease's end): "in 40 min", "in 5 h", "in 3 days",
    a date past 30 days ("on 2030-01-01"), "now" once it has passed; the exact time on hover
    and in its datetime attribute. A value that is not such a time is shown as it is."""
    at = _utc(value)
    if not isinstance(at, datetime):
        return at
    seconds = int((at - (now or datetime.now(timezone.utc))).total_seconds())
    if seconds <= 0:
        said = "now"
    elif seconds < 60:
        said = "in under a minute"
    elif seconds < 3600:
        said = f"in {seconds // 60} min"
    elif seconds < 48 * 3600:
        said = f"in {seconds // 3600} h"
    elif seconds < 30 * 86400:
        said = f"in {seconds // 86400} days"
    else:
        said = at.strftime("on %Y-%m-%d")
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(value, said)


_env.filters["ago"] = ago
_env.filters["until"] = until


def _common(req) -> dict:
    session = req.context.get("session")
    cluster = req.context.get("cluster")
    return {
        "session": session,
        "csrf": session.csrf if session is not None else "",
        "email": session.email if session is not None else "",
        "may_manage_users": bool(session and session.requester.has("create_user")),
        "path": req.path,
        # The cluster a page shows (its links' prefix), and every cluster when there are several.
        "base": cluster.base if cluster is not None else "/portal",
        "cluster_name": cluster.name if cluster is not None else "",
        "clusters": req.context.get("clusters") or [],
        "several": bool(req.context.get("clusters")),
        "done": DONE.get(req.get_param("done") or "", "") if req.method == "GET" else "",
    }


def page(req, resp, template: str, *, status: int = 200, **values) -> None:
    resp.status = status
    resp.content_type = "text/html; charset=utf-8"
    resp.text = _env.get_template(template).render(**{**_common(req), "error": "", **values})


def form_error(req, resp, template: str, error: ControllerError, **values) -> None:
    """The form again with the service's message, under the status the API would answer."""
    if isinstance(error, (TooManyRequests, ServerBusy)):
        resp.set_header("Retry-After", str(error.retry_after))
    page(req, resp, template, status=status_of(error), error=error.message, **values)


def see_other(resp, location: str) -> None:
    """After a POST: 303 to the GET page that shows its result."""
    resp.status = falcon.HTTP_303
    resp.location = location


def error_page(req, resp, status: int, message: str) -> None:
    page(req, resp, "error.html", status=status, status_code=status, message=message)
