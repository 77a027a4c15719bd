"""Logging in and out, the overview, the credentials and the password pages."""

import posixpath
import time
from urllib.parse import unquote, urlsplit

from api.client_address import client_address
from api.portal.guard import (PREFIX, clear_session_cookie, cookie_cannot_stay, login_value, set_login_cookie,
                              set_session_cookie)
from api.portal.render import form_error, page, see_other
from controller.auth import tokens as auth, credentials
from controller.portal import clusters as portal_clusters, sessions as portal_sessions
from controller.context import Context
from controller.errors import ControllerError, InvalidInput, Unauthenticated
from controller.permissions import Requester
from controller.rules import PASSWORD_MAX, PASSWORD_MIN, PASSWORD_RULE, check_password

LOGIN_FAILED = "Log in failed: wrong email or password, or the account cannot use the cloud."
_NEXT_MAX = 2000


def safe_next(value: str | None) -> str | None:
    """`next` when it is a path under /portal/ of this site; anything else is ignored (no
    open redirect: no scheme, host, `//`, backslash, control character, or `..` leaving it)."""
    if not value or len(value) > _NEXT_MAX or any(c == "\\" or ord(c) < 0x21 or ord(c) == 0x7F for c in value):
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//"):
        return None
    # Checked as the browser will read it: percent-escapes decoded first (a browser resolves
    # /portal/%2e%2e/x to /x), and once more for a doubly escaped one.
    path = parts.path
    for _ in range(3):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    else:
        return None
    if any(c == "\\" or ord(c) < 0x21 or ord(c) == 0x7F for c in path) or path.startswith("//"):
        return None
    normal = posixpath.normpath(path)
    if normal != PREFIX and not normal.startswith(PREFIX + "/"):
        return None
    return value


class _Page:
    public = True  # no API token: the portal's guard decides
    def __init__(self, ctx: Context):
        self.ctx = ctx


class Login(_Page):
    anonymous = True
    public = True  # no API token: the portal's guard decides
    # Password logins are bounded by the hash slots and hold threads of their own (api/admission.py).
    bounded_itself = ("POST",)

    def __init__(self, ctx: Context, *, clock):
        super().__init__(ctx)
        self.clock = clock
        self.trusted_proxies = ctx.config.server.trusted_proxies

    def on_get(self, req, resp):
        changed = req.get_param("changed") == "1"
        value = login_value(req)
        set_login_cookie(resp, value)
        page(req, resp, "login.html", next=safe_next(req.get_param("next")) or "", login_email="", changed=changed,
             login_csrf=value, insecure_origin=cookie_cannot_stay(req, self.ctx.config.portal.public_url))

    def on_post(self, req, resp):
        form = req.context.form
        email, nxt = form.get("email"), safe_next(form.get("next")) or ""
        try:
            # The API's password login: its throttles and per-source shares hold here unchanged.
            user = auth.login_user(self.ctx, email=email, password=form.get("password"),
                                   source=client_address(req, self.trusted_proxies))
        except (Unauthenticated, InvalidInput):
            # Whatever failed, one message: nothing tells which part was wrong.
            form_error(req, resp, "login.html", Unauthenticated(LOGIN_FAILED), next=nxt, login_email=email,
                       changed=False, login_csrf=form.get("csrf") or "",
                       insecure_origin=cookie_cannot_stay(req, self.ctx.config.portal.public_url))
            return
        except ControllerError as e:  # throttled (429, Retry-After), or the service cannot check
            form_error(req, resp, "login.html", e, next=nxt, login_email=email, changed=False,
                       login_csrf=form.get("csrf") or "",
                       insecure_origin=cookie_cannot_stay(req, self.ctx.config.portal.public_url))
            return
        old = req.context.get("session")
        if old is not None:
            portal_sessions.end(self.ctx, old)
        # The audit row of this login names the user who logged in.
        req.context.requester = Requester.from_user(user)
        session_id = portal_sessions.start(self.ctx, user["id"], now=int(self.clock()))
        set_session_cookie(resp, session_id)
        see_other(resp, nxt or PREFIX + "/")


class Logout(_Page):
    def on_post(self, req, resp):
        portal_sessions.end(self.ctx, req.context.session)
        clear_session_cookie(resp)
        see_other(resp, PREFIX + "/login?done=logged-out")


class Overview(_Page):
    def on_get(self, req, resp):
        session = req.context.session
        where = portal_clusters.default(self.ctx, session)
        req.context.cluster = where  # the navigation's links go to this cluster's pages
        if portal_clusters.several(self.ctx):
            # Every cluster side by side, read at once, each bounded by [cloud_auth] timeout_seconds.
            page(req, resp, "overview_clusters.html", cards=portal_clusters.overview_cards(self.ctx, session))
            return
        page(req, resp, "overview.html", overview=where.overview(req.context.requester))


class ClusterOverview(_Page):
    """/portal/c/ID: one cluster's overview."""

    def on_get(self, req, resp, cid):
        where = portal_clusters.cluster(self.ctx, req.context.session, cid)
        req.context.cluster = where
        page(req, resp, "overview.html", overview=where.overview(req.context.requester))


def _origin(req, ctx: Context) -> str:
    return ctx.config.portal.public_url or f"{req.scheme}://{req.netloc}"


def _credentials(req, ctx: Context) -> dict:
    shown = credentials.show_credentials(ctx, req.context.requester)
    return {"creds": shown, "login_line": f"cloud login --url {_origin(req, ctx)} --api-key {shown['api_key']} --keep"}


class Credentials(_Page):
    def on_get(self, req, resp):
        page(req, resp, "credentials.html", error="", **_credentials(req, self.ctx))


class CredentialsRotate(_Page):
    def __init__(self, ctx: Context, *, clock):
        super().__init__(ctx)
        self.clock = clock
        self.trusted_proxies = ctx.config.server.trusted_proxies

    def on_post(self, req, resp):
        session = req.context.session
        try:
            made = credentials.rotate_api_secret(self.ctx, req.context.requester,
                                                 password=req.context.form.get("password"),
                                                 client=client_address(req, self.trusted_proxies))
        except ControllerError as e:
            form_error(req, resp, "credentials.html", e, **_credentials(req, self.ctx))
            return
        # The secret is in no URL or Location: the next page reads it once, within 60 s.
        portal_sessions.remember_reveal(self.ctx, session, made["api_secret"], now=int(self.clock()))
        see_other(resp, PREFIX + "/credentials/new")


class CredentialsNew(_Page):
    def __init__(self, ctx: Context, *, clock):
        super().__init__(ctx)
        self.clock = clock

    def on_get(self, req, resp):
        secret = portal_sessions.take_reveal(self.ctx, req.context.session, now=int(self.clock()))
        page(req, resp, "credentials_new.html", secret=secret or "", **_credentials(req, self.ctx))


class Password(_Page):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.trusted_proxies = ctx.config.server.trusted_proxies

    def on_get(self, req, resp):
        page(req, resp, "password.html", error="", **_password_rule(rotate=False))

    def on_post(self, req, resp):
        form = req.context.form
        new, again, old = form.get("new_password"), form.get("new_password_again"), form.get("password") or None
        rotate = form.get("rotate_secret") == "1"
        client = client_address(req, self.trusted_proxies)
        made = None
        try:
            if new != again:
                raise InvalidInput("the two new passwords differ")
            if rotate:
                # The new password's rule first, so a refusal changes nothing; then the secret
                # (proven by the current password), then the password.
                check_password(new)
                if new == old:
                    raise InvalidInput("the new password must differ from the current one")
                made = credentials.rotate_api_secret(self.ctx, req.context.requester, password=old, client=client)
            credentials.change_password(self.ctx, req.context.requester, password=old, new_password=new,
                                        client=client)
        except ControllerError as e:
            form_error(req, resp, "password.html", e, **_password_rule(rotate=rotate))
            return
        # The change ended every portal session of the user, this one too: log in again.
        clear_session_cookie(resp)
        if made is None:
            see_other(resp, PREFIX + "/login?changed=1")
            return
        # The new secret in this answer alone (a POST's, no-store): no session is left to show it later.
        req.context.session = None
        page(req, resp, "password_changed.html", secret=made["api_secret"], api_key=made["api_key"])


def _password_rule(*, rotate: bool) -> dict:
    return {"rule": PASSWORD_RULE, "min_length": PASSWORD_MIN, "max_length": PASSWORD_MAX, "rotate": rotate}


def add_routes(app, ctx: Context, *, clock=time.time) -> None:
    app.add_route("/portal/login", Login(ctx, clock=clock))
    app.add_route("/portal/logout", Logout(ctx))
    app.add_route("/portal", Overview(ctx))
    app.add_route("/portal/c/{cid}", ClusterOverview(ctx))
    app.add_route("/portal/credentials", Credentials(ctx))
    app.add_route("/portal/credentials/rotate", CredentialsRotate(ctx, clock=clock))
    app.add_route("/portal/credentials/new", CredentialsNew(ctx, clock=clock))
    app.add_route("/portal/password", Password(ctx))
