"""Every /portal/ request goes through here: its security headers, its session, and for a POST
the CSRF checks, before any page resource runs.

- Headers on every answer under /portal/ (pages, redirects, errors, the style sheet).
- The session: the `__Host-cc_portal` cookie's id, looked up by its hash
  (controller/portal/sessions.py). A page without a live session: a GET is sent to the
  login page (303, `next` naming where it was going), a POST refused (403).
- A POST is refused (403) and nothing runs when `Sec-Fetch-Site` is present and not
  `same-origin` or `none`, when `Origin` is present, not `null`, and not the portal's
  origin (`[portal] public_url`, else the request's own), or when its `csrf` field is
  not the session's (the login form has no session yet; the header checks apply to it).
"""

import hmac
import ipaddress
import secrets
from datetime import datetime, timezone
from urllib.parse import quote, urlsplit

import falcon

from api.portal.forms import read_form
from controller.portal import clusters as portal_clusters, sessions as portal_sessions
from controller.context import Context
from controller.errors import Forbidden

PREFIX = "/portal"
COOKIE = "__Host-cc_portal"
LOGIN_COOKIE = "__Host-cc_login"

HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
_SAME_SITE = ("same-origin", "none")
REFUSED = "refused: this form did not come from a page of the portal in this session; reload the page and try again"
REFUSED_LOGIN = "refused: this login did not come from the portal's login page in this browser; reload it and try again"


def cookie_cannot_stay(req, public_url: str) -> str:
    """The portal's origin when a browser will not keep its session cookie there, else "".
    Browsers keep a Secure cookie (and so a __Host- one) only from an https origin or a
    loopback one (localhost, 127.0.0.0/8, ::1): over plain HTTP at any other name a good
    login comes back to an empty login form, and the login page says why."""
    origin = public_url or f"{req.scheme}://{req.netloc}"
    parts = urlsplit(origin)
    if parts.scheme == "https":
        return ""
    host = (parts.hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return ""
    try:
        return "" if ipaddress.ip_address(host).is_loopback else origin
    except ValueError:
        return origin


def is_portal(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def set_login_cookie(resp, value: str) -> None:
    """The login form's own CSRF value (a double submit: no session exists yet), held by the
    browser for the login page's POST alone."""
    resp.set_cookie(LOGIN_COOKIE, value, path="/", secure=True, http_only=True, same_site="Strict")


def login_value(req) -> str:
    """The login form's CSRF value: the browser's, when it holds a well-formed one, else new."""
    held = req.get_cookie_values(LOGIN_COOKIE)
    if held and len(held[0]) == 32 and held[0].replace("-", "").replace("_", "").isalnum():
        return held[0]
    return secrets.token_urlsafe(24)


def set_session_cookie(resp, session_id: str) -> None:
    # No Max-Age or Expires: the cookie ends with the browser session; the server's
    # timeouts end the session itself.
    resp.set_cookie(COOKIE, session_id, path="/", secure=True, http_only=True, same_site="Strict")


def clear_session_cookie(resp) -> None:
    # A browser takes a __Host- cookie, even one that deletes it, only when it is Secure with Path=/.
    resp.set_cookie(COOKIE, "", path="/", secure=True, http_only=True, same_site="Strict",
                    expires=datetime(1970, 1, 1, tzinfo=timezone.utc))


class PortalGuard:
    def __init__(self, ctx: Context, *, clock):
        self.ctx = ctx
        self.clock = clock
        self.limit = ctx.config.server.max_body_bytes
        self.public_origin = ctx.config.portal.public_url

    def now(self) -> int:
        return int(self.clock())

    def origin(self, req) -> str:
        return self.public_origin or f"{req.scheme}://{req.netloc}".lower()

    def process_resource(self, req, resp, resource, params):
        if not is_portal(req.path) or resource is None or getattr(resource, "static", False):
            return
        req.context.portal_now = self.now()
        cookie = req.get_cookie_values(COOKIE)
        session = portal_sessions.find(self.ctx, cookie[0] if cookie else None, now=req.context.portal_now)
        req.context.session = session
        if session is not None:
            # Who acts: the audit trail and the pages read it as for a token.
            req.context.requester = session.requester
            req.context.clusters = portal_clusters.navigation(self.ctx)
        anonymous = getattr(resource, "anonymous", False)
        if req.method == "POST":
            self._check_post(req, session, anonymous=anonymous)
        elif session is None and not anonymous:
            target = req.relative_uri if req.method == "GET" else PREFIX + "/"
            resp.status = falcon.HTTP_303
            resp.location = f"{PREFIX}/login?next={quote(target, safe='/')}"
            resp.complete = True  # the page's responder does not run

    def _check_post(self, req, session, *, anonymous: bool) -> None:
        site = req.get_header("Sec-Fetch-Site")
        if site is not None and site.lower() not in _SAME_SITE:
            raise Forbidden(REFUSED)
        origin = req.get_header("Origin")
        if origin is not None and origin != "null" and origin.lower().rstrip("/") != self.origin(req):
            raise Forbidden(REFUSED)
        req.context.form = read_form(req, limit=self.limit)
        if anonymous:
            # The login form: its csrf field must be the value its page set in the browser's
            # cookie (a form posted from elsewhere has neither). Where the browser cannot keep a
            # Secure cookie at all (plain HTTP, not loopback), no session can start either, and
            # the page says why instead.
            if not cookie_cannot_stay(req, self.public_origin):
                held = req.get_cookie_values(LOGIN_COOKIE)
                given = req.context.form.get("csrf") or ""
                if not held or not given or not hmac.compare_digest(held[0].encode(), given.encode()):
                    raise Forbidden(REFUSED_LOGIN)
            return
        if session is None:
            raise Forbidden("your portal session has ended: log in again")
        if not portal_sessions.same_csrf(session, req.context.form.get("csrf") or None):
            raise Forbidden(REFUSED)

    def process_response(self, req, resp, resource, req_succeeded):
        if is_portal(req.path):
            for name, value in HEADERS.items():
                resp.set_header(name, value)
