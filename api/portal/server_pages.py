"""Servers: the list, the create form, one server's page, its power tasks, users and delete."""

from api import schemas
from api.portal.render import form_error, page, see_other
from api.portal.text import console_text
from api.validation import validate
from controller.instances import instances
from controller.portal import views as portal_views
from controller.context import Context
from controller.errors import ControllerError, InvalidInput

# The power buttons' values and the API's task for each.
TASKS = {"reboot": "reboot", "start": "power-on", "stop": "power-off"}


class _Page:
    public = True  # no API token: the portal's guard decides
    host_work: tuple[str, ...] = ()

    def __init__(self, ctx: Context):
        self.ctx = ctx


class Servers(_Page):
    def on_get(self, req, resp):
        page(req, resp, "servers.html", **portal_views.servers(self.ctx, req.context.requester))


class ServerNew(_Page):
    host_work = ("POST",)

    def on_get(self, req, resp):
        page(req, resp, "server_new.html", error="", chosen={},
             **portal_views.create_form(self.ctx, req.context.requester))

    def on_post(self, req, resp):
        form = req.context.form
        body = {"server-image": form.get("image"), "server-flavor": form.get("flavor"), "users": form.all("users")}
        try:
            # The JSON resource's schema, then its service function: the same 400s and refusals.
            made = instances.create_instance(self.ctx, req.context.requester, validate(body, schemas.INSTANCE_CREATE))
        except ControllerError as e:
            form_error(req, resp, "server_new.html", e, chosen=body,
                       **portal_views.create_form(self.ctx, req.context.requester))
            return
        see_other(resp, f"/portal/servers/{made['id']}")


class ServerDetail(_Page):
    def on_get(self, req, resp, id):
        shown = portal_views.server_detail(self.ctx, req.context.requester, id)
        shown["console"] = console_text(shown["console"])
        page(req, resp, "server.html", **shown)


def _task(ctx: Context, req, resp, id: str, task: dict) -> None:
    instances.run_task(ctx, req.context.requester, id, validate({"task": task}, schemas.INSTANCE_TASK)["task"])
    see_other(resp, f"/portal/servers/{id}")


class ServerPower(_Page):
    host_work = ("POST",)

    def on_post(self, req, resp, id):
        what = TASKS.get(req.context.form.get("task"))
        if what is None:
            raise InvalidInput(f"task must be one of {', '.join(TASKS)}")
        # Refusals (404 unseen, 403 not yours, 409 not running) reach the error page as the API answers them.
        _task(self.ctx, req, resp, id, {"what": what})


class ServerUsers(_Page):
    host_work = ("POST",)

    def on_post(self, req, resp, id):
        form = req.context.form
        how = form.get("how")
        if how not in ("add", "delete"):
            raise InvalidInput("how must be add or delete")
        users = form.all("users")
        if not users:
            raise InvalidInput("choose at least one user")
        _task(self.ctx, req, resp, id, {"what": "modify-users", "how": how, "users": users})


class ServerDelete(_Page):
    host_work = ("POST",)

    def on_get(self, req, resp, id):
        shown = portal_views.server_summary(self.ctx, req.context.requester, id)
        page(req, resp, "server_delete.html", **shown)

    def on_post(self, req, resp, id):
        instances.delete_instance(self.ctx, req.context.requester, id)
        see_other(resp, "/portal/servers?deleted=1")


def add_routes(app, ctx: Context) -> None:
    app.add_route("/portal/servers", Servers(ctx))
    app.add_route("/portal/servers/new", ServerNew(ctx))
    app.add_route("/portal/servers/{id}", ServerDetail(ctx))
    app.add_route("/portal/servers/{id}/power", ServerPower(ctx))
    app.add_route("/portal/servers/{id}/users", ServerUsers(ctx))
    app.add_route("/portal/servers/{id}/delete", ServerDelete(ctx))
