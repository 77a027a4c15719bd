"""The home volume (create; delete once the username is typed) and groups (create, members, delete)."""

import re

from api import schemas
from api.portal.render import form_error, page, see_other
from api.validation import validate
from controller.users import groups
from controller.portal import views as portal_views
from controller.storage import volumes
from controller.context import Context
from controller.errors import ControllerError, InvalidInput


class _Page:
    public = True  # no API token: the portal's guard decides
    host_work: tuple[str, ...] = ("POST",)

    def __init__(self, ctx: Context):
        self.ctx = ctx


def _size(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", text.strip()):
        raise InvalidInput("size must be a whole number of GB")
    return int(text)


class Volume(_Page):
    def on_get(self, req, resp):
        page(req, resp, "volume.html", error="", **portal_views.volume_page(self.ctx, req.context.requester))

    def on_post(self, req, resp):
        form = req.context.form
        try:
            body = {"volume-size": _size(form.get("size")), "volume-type": {"visibility": "cluster"}}
            if form.get("name").strip():
                body["volume-name"] = form.get("name").strip()
            volumes.create_volume(self.ctx, req.context.requester, validate(body, schemas.VOLUME_CREATE))
        except ControllerError as e:
            form_error(req, resp, "volume.html", e, **portal_views.volume_page(self.ctx, req.context.requester))
            return
        see_other(resp, "/portal/volume")


class VolumeDelete(_Page):
    def on_post(self, req, resp):
        requester = req.context.requester
        shown = portal_views.volume_page(self.ctx, requester)
        try:
            if shown["volume"] is None:
                raise InvalidInput("you have no home volume")
            # A confirmation, not a permission: the service decides who may delete.
            if shown["account"] is None or req.context.form.get("confirm") != shown["account"]["username"]:
                raise InvalidInput("type your username to confirm: the home and every file in it are deleted")
            volumes.delete_volume(self.ctx, requester, shown["volume"]["volume-id"])
        except ControllerError as e:
            form_error(req, resp, "volume.html", e, **shown)
            return
        see_other(resp, "/portal/volume")


class Groups(_Page):
    def on_get(self, req, resp):
        page(req, resp, "groups.html", error="", **portal_views.groups_page(self.ctx, req.context.requester))

    def on_post(self, req, resp):
        form = req.context.form
        members = [m.strip() for m in re.split(r"[\s,]+", form.get("members")) if m.strip()]
        try:
            body = validate({"group-name": form.get("name").strip(), "group-members": members}, schemas.GROUP_CREATE)
            groups.create_group(self.ctx, req.context.requester, body)
        except ControllerError as e:
            form_error(req, resp, "groups.html", e, **portal_views.groups_page(self.ctx, req.context.requester))
            return
        see_other(resp, "/portal/groups")


class GroupMembers(_Page):
    def on_post(self, req, resp, id):
        form = req.context.form
        action = form.get("action")
        if action not in ("add", "delete"):
            raise InvalidInput("action must be add or delete")
        members = [m.strip() for m in re.split(r"[\s,]+", form.get("members")) if m.strip()] + form.all("member")
        if not members:
            raise InvalidInput("name at least one member (a username)")
        body = validate({"action": action, "group-members": members}, schemas.GROUP_UPDATE)
        groups.update_group(self.ctx, req.context.requester, id, body)
        see_other(resp, "/portal/groups")


class GroupDelete(_Page):
    def on_post(self, req, resp, id):
        groups.delete_group(self.ctx, req.context.requester, id)
        see_other(resp, "/portal/groups")


def add_routes(app, ctx: Context) -> None:
    app.add_route("/portal/volume", Volume(ctx))
    app.add_route("/portal/volume/delete", VolumeDelete(ctx))
    app.add_route("/portal/groups", Groups(ctx))
    app.add_route("/portal/groups/{id}/members", GroupMembers(ctx))
    app.add_route("/portal/groups/{id}/delete", GroupDelete(ctx))
