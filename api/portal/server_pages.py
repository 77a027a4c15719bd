"""Servers: the list, the create form, one server's page, its power tasks, users and delete,
of this cluster under /portal/servers and of any cluster the portal shows under
/portal/c/ID/servers (api/portal/where.py finds which)."""

from api import schemas
from api.portal.render import form_error, page, see_other
from api.portal.text import console_text
from api.portal.where import ClusterPage, cluster_routes
from api.validation import validate
from controller.errors import ControllerError, InvalidInput

# The power buttons' values and the API's task for each.
TASKS = {"reboot": "reboot", "start": "power-on", "stop": "power-off"}


class Servers(ClusterPage):
    host_work = ()

    def on_get(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        page(req, resp, "servers.html", **where.servers(req.context.requester))


class ServerNew(ClusterPage):
    def on_get(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        page(req, resp, "server_new.html", error="", chosen={}, **where.create_form(req.context.requester))

    def on_post(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        body = {"server-image": form.get("image"), "server-flavor": form.get("flavor"), "users": form.all("users")}
        try:
            # The JSON resource's schema, then its service function (or the cluster's API):
            # the same 400s and refusals.
            made = where.create_server(req.context.requester, validate(body, schemas.INSTANCE_CREATE))
        except ControllerError as e:
            form_error(req, resp, "server_new.html", e, chosen=body, **where.create_form(req.context.requester))
            return
        see_other(resp, f"{where.base}/servers/{made}")


class ServerDetail(ClusterPage):
    host_work = ()

    def on_get(self, req, resp, id, cid=None):
        shown = self.cluster(req, cid).server_detail(req.context.requester, id)
        shown["console"] = console_text(shown["console"])
        page(req, resp, "server.html", **shown)


def _task(where, req, resp, id: str, task: dict) -> None:
    where.run_task(req.context.requester, id, validate({"task": task}, schemas.INSTANCE_TASK)["task"])
    see_other(resp, f"{where.base}/servers/{id}")


class ServerPower(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        what = TASKS.get(req.context.form.get("task"))
        if what is None:
            raise InvalidInput(f"task must be one of {', '.join(TASKS)}")
        # Refusals (404 unseen, 403 not yours, 409 not running) reach the error page as the API answers them.
        _task(where, req, resp, id, {"what": what})


class ServerUsers(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        how = form.get("how")
        if how not in ("add", "delete"):
            raise InvalidInput("how must be add or delete")
        users = form.all("users")
        if not users:
            raise InvalidInput("choose at least one user")
        _task(where, req, resp, id, {"what": "modify-users", "how": how, "users": users})


class ServerDelete(ClusterPage):
    def on_get(self, req, resp, id, cid=None):
        page(req, resp, "server_delete.html", **self.cluster(req, cid).server_summary(req.context.requester, id))

    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        where.delete_server(req.context.requester, id)
        see_other(resp, f"{where.base}/servers?deleted=1")


def add_routes(app, ctx) -> None:
    cluster_routes(app, ctx, {
        "/servers": Servers, "/servers/new": ServerNew, "/servers/{id}": ServerDetail,
        "/servers/{id}/power": ServerPower, "/servers/{id}/users": ServerUsers, "/servers/{id}/delete": ServerDelete,
    })
