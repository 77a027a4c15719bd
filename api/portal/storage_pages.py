"""The home volume (create; delete once the username is typed) and groups (create, members,
delete), of this cluster under /portal/... and of any cluster the portal shows under
/portal/c/ID/... (api/portal/where.py)."""

import re

from api import schemas
from api.portal.render import form_error, page, see_other
from api.portal.where import ClusterPage, cluster_routes
from api.validation import validate
from controller.errors import Conflict, ControllerError, Forbidden, InvalidInput, NotFound, ServerBusy, TooManyRequests


def _size(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", text.strip()):
        raise InvalidInput("size must be a whole number of GB")
    return int(text)


class Volume(ClusterPage):
    def on_get(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        page(req, resp, "volume.html", error="", entered={}, **where.volume_page(req.context.requester))

    def on_post(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        try:
            body = {"volume-size": _size(form.get("size")), "volume-type": {"visibility": "cluster"}}
            if form.get("name").strip():
                body["volume-name"] = form.get("name").strip()
            where.create_volume(req.context.requester, validate(body, schemas.VOLUME_CREATE))
        except ControllerError as e:
            form_error(req, resp, "volume.html", e, entered={"size": form.get("size"), "name": form.get("name")},
                       **where.volume_page(req.context.requester))
            return
        see_other(resp, f"{where.base}/volume?done=volume-created")


class VolumeDelete(ClusterPage):
    def on_post(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        requester = req.context.requester
        shown = where.volume_page(requester)
        try:
            if shown["volume"] is None:
                raise InvalidInput("you have no home volume")
            # A confirmation, not a permission: the service decides who may delete.
            if shown["account"] is None or req.context.form.get("confirm") != shown["account"]["username"]:
                raise InvalidInput("type your username to confirm: the home and every file in it are deleted")
            where.delete_volume(requester, shown["volume"]["volume-id"])
        except ControllerError as e:
            form_error(req, resp, "volume.html", e, entered={}, **shown)
            return
        see_other(resp, f"{where.base}/volume?done=volume-deleted")


class Groups(ClusterPage):
    def on_get(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        page(req, resp, "groups.html", error="", entered={}, typed={}, **where.groups_page(req.context.requester))

    def on_post(self, req, resp, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        members = [m.strip() for m in re.split(r"[\s,]+", form.get("members")) if m.strip()]
        try:
            body = validate({"group-name": form.get("name").strip(), "group-members": members}, schemas.GROUP_CREATE)
            where.create_group(req.context.requester, body)
        except ControllerError as e:
            form_error(req, resp, "groups.html", e, typed={},
                       entered={"name": form.get("name"), "members": form.get("members")},
                       **where.groups_page(req.context.requester))
            return
        see_other(resp, f"{where.base}/groups?done=group-created")


class GroupMembers(ClusterPage):
    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        form = req.context.form
        action = form.get("action")
        if action not in ("add", "delete"):
            raise InvalidInput("action must be add or delete")
        members = [m.strip() for m in re.split(r"[\s,]+", form.get("members")) if m.strip()] + form.all("member")
        try:
            if not members:
                raise InvalidInput("name at least one member (a username)")
            body = validate({"action": action, "group-members": members}, schemas.GROUP_UPDATE)
            where.update_group(req.context.requester, id, body)
        except (InvalidInput, Conflict, Forbidden, ServerBusy, TooManyRequests) as e:
            # On the groups page, above its forms, what was typed kept in the group's box.
            form_error(req, resp, "groups.html", e, entered={}, typed={id: form.get("members")},
                       **where.groups_page(req.context.requester))
            return
        see_other(resp, f"{where.base}/groups?done=group-changed")


class GroupDelete(ClusterPage):
    """A group's delete asks first: files on the cluster may belong to it (by its GID)."""

    def on_get(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        page(req, resp, "group_delete.html", group=_group(where, req, id))

    def on_post(self, req, resp, id, cid=None):
        where = self.cluster(req, cid)
        try:
            where.delete_group(req.context.requester, id)
        except (Conflict, Forbidden, ServerBusy, TooManyRequests) as e:
            form_error(req, resp, "group_delete.html", e, group=_group(where, req, id))
            return
        see_other(resp, f"{where.base}/groups?done=group-deleted")


def _group(where, req, id: str) -> dict:
    for g in where.groups_page(req.context.requester)["groups"]:
        if g["group-id"] == id:
            return g
    raise NotFound(f"group {id[:64]} not found")


def add_routes(app, ctx) -> None:
    cluster_routes(app, ctx, {
        "/volume": Volume, "/volume/delete": VolumeDelete, "/groups": Groups,
        "/groups/{id}/members": GroupMembers, "/groups/{id}/delete": GroupDelete,
    })
