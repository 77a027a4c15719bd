"""Managed users, for owners: the list, a new user, and one user's name and email."""

from api.portal.render import form_error, page, see_other
from controller.portal import views as portal_views
from controller.users import users
from controller.context import Context
from controller.errors import ControllerError, InvalidInput


class _Page:
    public = True  # no API token: the portal's guard decides

    def __init__(self, ctx: Context):
        self.ctx = ctx


class ManagedUsers(_Page):
    def on_get(self, req, resp):
        page(req, resp, "users.html", error="", entered={},
             **portal_views.managed_users(self.ctx, req.context.requester))

    def on_post(self, req, resp):
        form = req.context.form
        entered = {"email": form.get("email").strip(), "name": form.get("name").strip()}
        try:
            if form.get("password") != form.get("password_again"):
                raise InvalidInput("the two passwords differ")
            # users.create_user decides: create_user permission. The new user is the requester's, a
            # superuser's too (the form says so, and `cloud user create` names the owner alike):
            # unnamed, a superuser's new user would be nobody's and missing from this list.
            users.create_user(self.ctx, req.context.requester, email=entered["email"], password=form.get("password"),
                              name=entered["name"], owner_userid=req.context.requester.id,
                              registration_source="portal")
        except ControllerError as e:
            form_error(req, resp, "users.html", e, entered=entered,
                       **portal_views.managed_users(self.ctx, req.context.requester))
            return
        see_other(resp, "/portal/users?done=user-created")


class ManagedUser(_Page):
    def on_get(self, req, resp, id):
        page(req, resp, "user_edit.html", error="", user=users.view_user(self.ctx, req.context.requester, id))

    def on_post(self, req, resp, id):
        form = req.context.form
        try:
            users.update_user(self.ctx, req.context.requester, id, email=form.get("email").strip() or None,
                              name=form.get("name").strip())
        except ControllerError as e:
            form_error(req, resp, "user_edit.html", e, user=users.view_user(self.ctx, req.context.requester, id))
            return
        see_other(resp, "/portal/users?done=user-saved")


def add_routes(app, ctx: Context) -> None:
    app.add_route("/portal/users", ManagedUsers(ctx))
    app.add_route("/portal/users/{id}", ManagedUser(ctx))
