"""Servers: the list, the create form, one server's page, its power tasks, users, lease
renewal and delete, of this cluster under /portal/servers and of any cluster the portal shows under
/portal/c/ID/servers (api/portal/where.py finds which)."""

import math
from datetime import datetime, timezone

from api import schemas
from api.portal.render import form_error, page, see_other
from api.portal.text import console_text
from api.portal.where import ClusterPage, cluster_routes
from api.validation import validate
from controller.instances.console import SANDBOX_CONSOLE
from controller.errors import Conflict, ControllerError, Forbidden, InvalidInput, ServerBusy, TooManyRequests

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
        see_other(resp, f"{where.base}/servers/{made}?done=server-created")


# The buttons a server's page offers in each status (the tasks the API accepts there).
_BUTTONS = {"running": [("reboot", "Reboot"), ("stop", "Stop")], "paused": [("stop", "Stop")],
            "shutoff": [("start", "Start")], "crashed": [("start", "Start")]}
# Seconds between reloads of a server's page while it is being created or its guest is not
# ready yet (a Refresh without script: the page works with JavaScript off).
REFRESH_SECONDS = 5
_DONE_OF_TASK = {"reboot": "server-rebooted", "start": "server-started", "stop": "server-stopped"}
# The tasks an instance whose lease has ended is refused (until it is renewed): not offered.
_REFUSED_WHEN_EXPIRED = {"start", "reboot"}


def _detail(where, req, id: str) -> dict:
    shown = where.server_detail(req.context.requester, id)
    status = shown["server"]["status"]
    # The sandbox's test driver runs no guest: it never gets ready, and its note (which says
    # "recorded as running") is shown only while the server is.
    shown["sandbox"] = shown["console"] == SANDBOX_CONSOLE
    if shown["sandbox"] and status != "running":
        shown["console"] = ""
    shown["console"] = console_text(shown["console"])
    shown["tasks"] = [(value, label) for value, label in _BUTTONS.get(status, [])
                      if not (shown["server"]["lease"] == "expired" and value in _REFUSED_WHEN_EXPIRED)]
    shown["hours"] = ""  # the renew form's field: empty, the default lease
    settling = status == "building" or (status == "running" and not shown["ready"] and not shown["sandbox"])
    shown["refresh"] = REFRESH_SECONDS if settling else 0
    shown["updated_at"] = datetime.now(timezone.utc).strftime("%H:%M:%S UTC")
    return shown


class ServerDetail(ClusterPage):
    host_work = ()

    def on_get(self, req, resp, id, cid=None):
        page(req, resp, "server.html", **_detail(self.cluster(req, cid), req, id))


def _task(where, req, resp, id: str, task: dict, done: str) -> None:
    """The task, then the server's page with its confirmation; a refusal (409 not in a state
    for it, 403 not yours, 400) on the server's page itself, above its forms."""
    try:
        where.run_task(req.context.requester, id, validate({"task": task}, schemas.INSTANCE_TASK)["task"])
    except (InvalidInput, Conflict, Forbidden, ServerBusy, TooManyRequests) as e:
        form_error(req, resp, "server.html", e, **_detail(where, req, id))
        return
    see_other(resp, f"{where.base}/servers/{id}?done={done}")


class ServerPower(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        chosen = req.context.form.get("task")
        what = TASKS.get(chosen)
        if what is None:
            raise InvalidInput(f"task must be one of {', '.join(TASKS)}")
        _task(where, req, resp, id, {"what": what}, _DONE_OF_TASK[chosen])


class ServerUsers(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        how = form.get("how")
        if how not in ("add", "delete"):
            raise InvalidInput("how must be add or delete")
        users = form.all("users")
        if not users:
            form_error(req, resp, "server.html", InvalidInput("choose at least one user"), **_detail(where, req, id))
            return
        _task(where, req, resp, id, {"what": "modify-users", "how": how, "users": users}, "users-changed")


def _hours(given: str) -> float | None:
    """The renew form's hours: empty for the default lease, else a number the API's schema
    checks as it checks a JSON body's."""
    if not given:
        return None
    try:
        hours = float(given)
    except ValueError:
        hours = math.nan
    if not math.isfinite(hours):
        raise InvalidInput("hours must be a number above 0, or empty for the default lease")
    return validate({"hours": hours}, schemas.LEASE_RENEW)["hours"]


class ServerLease(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        """Renew the lease; a refusal (400 beyond the longest allowed, 409 leases off, 403) on the
        server's page itself, with the hours typed kept."""
        where = self.cluster(req, cid)
        given = req.context.form.get("hours").strip()
        try:
            where.renew_lease(req.context.requester, id, _hours(given))
        except (InvalidInput, Conflict, Forbidden, ServerBusy, TooManyRequests) as e:
            form_error(req, resp, "server.html", e, **{**_detail(where, req, id), "hours": given})
            return
        see_other(resp, f"{where.base}/servers/{id}?done=lease-renewed")


class ServerDelete(ClusterPage):
    def on_get(self, req, resp, id, cid=None):
        page(req, resp, "server_delete.html", **self.cluster(req, cid).server_summary(req.context.requester, id))

    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        try:
            where.delete_server(req.context.requester, id)
        except (Conflict, Forbidden, ServerBusy, TooManyRequests) as e:
            form_error(req, resp, "server_delete.html", e, **where.server_summary(req.context.requester, id))
            return
        see_other(resp, f"{where.base}/servers?done=server-deleted")


def add_routes(app, ctx) -> None:
    cluster_routes(app, ctx, {
        "/servers": Servers, "/servers/new": ServerNew, "/servers/{id}": ServerDetail,
        "/servers/{id}/power": ServerPower, "/servers/{id}/users": ServerUsers, "/servers/{id}/lease": ServerLease,
        "/servers/{id}/delete": ServerDelete,
    })
