"""The cloud auth user interface (`/v1/user/...`) and token issuance (`POST /v1/auth/token`).

Resources are thin: read parameters, call one service function, answer in the
user-interface envelope.
"""

from api.client_address import client_address
from api.envelopes import ok_user
from api.params import flag, opt_int, opt_str, req_str, user_params
from controller.auth import tokens as auth, credentials
from controller.users import users
from controller.context import Context


class UserResource:
    """A user-interface resource: the context, and the parameters of its calls."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.limit = ctx.config.server.max_body_bytes

    def params(self, req) -> dict:
        return user_params(req, limit=self.limit)


class Token(UserResource):
    public = True
    # Password logins are bounded by the hash slots and hold threads of their own (api/admission.py).
    bounded_itself = ("POST",)

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.trusted_proxies = ctx.config.server.trusted_proxies

    def on_post(self, req, resp):
        p = self.params(req)
        data = auth.issue_token(
            self.ctx,
            api_key=opt_str(p, "api_key"),
            api_secret=opt_str(p, "api_secret"),
            email=opt_str(p, "email"),
            password=opt_str(p, "password"),
            source=client_address(req, self.trusted_proxies),
        )
        ok_user(resp, data)


class UserList(UserResource):
    def on_get(self, req, resp):
        p = self.params(req)
        found = users.list_users(
            self.ctx,
            req.context.requester,
            owner_userid=opt_str(p, "owner_userid"),
            show_inactive=flag(p, "show_inactive"),
            registration_source=opt_str(p, "registration_source"),
        )
        ok_user(resp, {"total": len(found), "users": found})

    on_post = on_get


class UserView(UserResource):
    def on_get(self, req, resp, userid):
        self.params(req)
        ok_user(resp, {"user": users.view_user(self.ctx, req.context.requester, userid)})

    on_post = on_get


class UserCreate(UserResource):
    def on_post(self, req, resp):
        p = self.params(req)
        active = opt_int(p, "active")
        userid = users.create_user(
            self.ctx,
            req.context.requester,
            email=req_str(p, "email"),
            password=req_str(p, "password"),
            name=opt_str(p, "name") or "",
            owner_userid=opt_str(p, "owner_userid"),
            active=1 if active is None else active,
            registration_source=opt_str(p, "registration_source"),
        )
        ok_user(resp, {"userid": userid})


class UserUpdate(UserResource):
    host_work = ("POST",)  # deactivation locks the system account (usermod, LDAP): api/admission.py

    def on_post(self, req, resp, userid):
        p = self.params(req)
        users.update_user(
            self.ctx,
            req.context.requester,
            userid,
            email=opt_str(p, "email"),
            name=opt_str(p, "name"),
            active=opt_int(p, "active"),
        )
        ok_user(resp)


class UserSearch(UserResource):
    def on_get(self, req, resp):
        p = self.params(req)
        found = users.search_users(
            self.ctx, req.context.requester, email=opt_str(p, "email"), username=opt_str(p, "username")
        )
        ok_user(resp, {"total": len(found), "users": found})

    on_post = on_get


class UserSetPassword(UserResource):
    def on_post(self, req, resp, userid):
        p = self.params(req)
        users.set_password(self.ctx, req.context.requester, userid, password=req_str(p, "password"))
        ok_user(resp)


class UserViewApiSecret(UserResource):
    def on_get(self, req, resp, userid):
        self.params(req)
        ok_user(resp, {"api_secret": users.view_api_secret(self.ctx, req.context.requester, userid)})

    on_post = on_get


class UserResetApiSecret(UserResource):
    def on_post(self, req, resp, userid):
        p = self.params(req)
        secret = users.reset_api_secret(
            self.ctx, req.context.requester, userid, set_to_null=bool(flag(p, "set_to_null"))
        )
        ok_user(resp, {"api_secret": secret})


class UserDelete(UserResource):
    def on_post(self, req, resp, email):
        self.params(req)
        users.delete_user(self.ctx, req.context.requester, email)
        ok_user(resp)


# -- a user's own credentials (self-service): the requester only -----------------------
class Credentials(UserResource):
    def on_get(self, req, resp):
        self.params(req)
        ok_user(resp, credentials.show_credentials(self.ctx, req.context.requester))


class _Proven(UserResource):
    """Calls proven by the password: the client's address shares out the hash slots as a login's does."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.trusted_proxies = ctx.config.server.trusted_proxies

    def client(self, req) -> str:
        return client_address(req, self.trusted_proxies)


class RotateApiSecret(_Proven):
    def on_post(self, req, resp):
        p = self.params(req)
        data = credentials.rotate_api_secret(
            self.ctx, req.context.requester, password=p.get("password"), api_secret=p.get("api_secret"),
            client=self.client(req),
        )
        ok_user(resp, data)


class ChangePassword(_Proven):
    def on_post(self, req, resp):
        p = self.params(req)
        credentials.change_password(
            self.ctx, req.context.requester, password=req_str(p, "password"),
            new_password=req_str(p, "new_password"), client=self.client(req),
        )
        ok_user(resp)


def add_routes(app, ctx: Context) -> None:
    app.add_route("/v1/auth/token", Token(ctx))
    app.add_route("/v1/user/list", UserList(ctx))
    app.add_route("/v1/user/view/{userid}", UserView(ctx))
    app.add_route("/v1/user/create", UserCreate(ctx))
    app.add_route("/v1/user/update/{userid}", UserUpdate(ctx))
    app.add_route("/v1/user/search", UserSearch(ctx))
    app.add_route("/v1/user/set_password/{userid}", UserSetPassword(ctx))
    app.add_route("/v1/user/view_api_secret/{userid}", UserViewApiSecret(ctx))
    app.add_route("/v1/user/reset_api_secret/{userid}", UserResetApiSecret(ctx))
    app.add_route("/v1/user/delete/{email}", UserDelete(ctx))
    app.add_route("/v1/user/credentials", Credentials(ctx))
    app.add_route("/v1/user/rotate_api_secret", RotateApiSecret(ctx))
    app.add_route("/v1/user/change_password", ChangePassword(ctx))
