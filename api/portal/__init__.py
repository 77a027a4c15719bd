"""The cloud portal: server-rendered pages under /portal/ for cluster users (issue 26).

Its own room of the API floor: `guard.py` (the security headers, the session and the
CSRF checks of every /portal/ request, in one middleware), `render.py` (Jinja2 with
autoescaping, the error page), `forms.py` (form bodies), `text.py` (what may be
shown of guest console text), and the pages, each resource as thin as a JSON one:
read the session's requester, call one service function (controller/portal/views.py
to read, the JSON resources' own service functions to act), render or 303 to a GET
page. The portal decides no access itself: the service functions do, as for the API.
"""

import time

from api.portal import account_pages, guard, render, server_pages, static_files, storage_pages, user_pages
from controller.context import Context

PREFIX = guard.PREFIX


def middleware(ctx: Context, *, clock=time.time) -> guard.PortalGuard:
    return guard.PortalGuard(ctx, clock=clock)


def answer_error(req, resp, status: int, message: str) -> bool:
    """The error page for the portal's paths (api/error_responses.py asks); False elsewhere."""
    if not guard.is_portal(req.path):
        return False
    render.error_page(req, resp, status, message)
    return True


def add_routes(app, ctx: Context, *, clock=time.time) -> None:
    account_pages.add_routes(app, ctx, clock=clock)
    server_pages.add_routes(app, ctx)
    storage_pages.add_routes(app, ctx)
    user_pages.add_routes(app, ctx)
    static_files.add_routes(app)
