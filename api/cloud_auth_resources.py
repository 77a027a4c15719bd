"""Cloud auth's calls for the controllers it serves (`Authorization: Controller N:SECRET`:
introspection, the changes feed, their own accounts) and the catalog of clusters for users.
In the user-interface envelope, as every /v1/auth path."""

from api.envelopes import ok_user
from api.user_resources import UserResource as _Resource
from controller.cloud_auth import accounts, catalog, feed, introspection
from controller.context import Context


class Introspect(_Resource):
    caller = "controller"

    def on_post(self, req, resp):
        p = self.params(req)
        ok_user(resp, introspection.introspect(self.ctx, req.context.controller, token=p.get("token"),
                                               userid=p.get("userid")))


class Changes(_Resource):
    caller = "controller"

    def on_get(self, req, resp):
        p = self.params(req)
        ok_user(resp, feed.changes(self.ctx, req.context.controller, since=p.get("since"), epoch=p.get("epoch"),
                                   after=p.get("after")))


class RegisteredAccount(_Resource):
    caller = "controller"

    def on_put(self, req, resp, controller_id, username):
        p = self.params(req)
        account, _made = accounts.register(self.ctx, req.context.controller, controller_id, username,
                                           user_id=p.get("user_id"), uuid=p.get("uuid"), uid=p.get("uid"))
        ok_user(resp, account)

    def on_delete(self, req, resp, controller_id, username):
        self.params(req)
        ok_user(resp, accounts.unregister(self.ctx, req.context.controller, controller_id, username))


class Catalog(_Resource):
    def on_get(self, req, resp):
        self.params(req)
        ok_user(resp, catalog.catalog(self.ctx))


def add_routes(app, ctx: Context) -> None:
    app.add_route("/v1/auth/introspect", Introspect(ctx))
    app.add_route("/v1/auth/changes", Changes(ctx))
    app.add_route("/v1/auth/accounts/{controller_id}/{username}", RegisteredAccount(ctx))
    app.add_route("/v1/auth/catalog", Catalog(ctx))
