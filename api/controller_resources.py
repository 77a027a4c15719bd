"""The controller interface (spec sections 4.1 to 4.5): thin resources over the service layer."""

from api import schemas
from api.envelopes import controller_body, ok_controller, ok_controller_json, stream_controller
from api.params import json_object
from api.validation import validate
from controller.instances import console, instance_table, instances, leases
from controller.users import groups
from controller.audit import history
from controller.storage import images, volumes
from controller import limits
from controller.context import Context
from controller.errors import InvalidInput


class _Resource:
    # Methods that change the host (libvirt, homes, groups): they run under the host gate
    # (api/admission.py), so a burst of them never takes the threads reads need.
    host_work: tuple[str, ...] = ()

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.limit = ctx.config.server.max_body_bytes

    def body(self, req, schema: dict) -> dict:
        return validate(json_object(req, limit=self.limit), schema)


def _query(req, name: str) -> str | None:
    value = req.params.get(name)
    if isinstance(value, list):
        raise InvalidInput(f"{name} may be given once")
    return value


class InstanceCollection(_Resource):
    host_work = ("POST",)

    def on_get(self, req, resp):
        stream_controller(resp, instances.iter_instance_json(
            self.ctx, req.context.requester, cloudauth_id=_query(req, "cloudauth-id")))

    def on_post(self, req, resp):
        body = self.body(req, schemas.INSTANCE_CREATE)
        ok_controller(resp, [instances.create_instance(self.ctx, req.context.requester, body)], status=201)


class InstanceItem(_Resource):
    host_work = ("PUT", "DELETE")

    def on_get(self, req, resp, id):
        ok_controller_json(resp, instances.instance_json(self.ctx, req.context.requester, id))

    def on_put(self, req, resp, id):
        body = self.body(req, schemas.INSTANCE_TASK)
        ok_controller(resp, [instances.run_task(self.ctx, req.context.requester, id, body["task"])])

    def on_delete(self, req, resp, id):
        unfinished = instances.delete_instance(self.ctx, req.context.requester, id)
        if unfinished:
            # Accepted, the instance gone for its users; the host's part is being finished.
            resp.status = 202
            resp.media = controller_body([], msg=unfinished)
        else:
            ok_controller(resp, [])


class InstanceLease(_Resource):
    def on_post(self, req, resp, id):
        body = self.body(req, schemas.LEASE_RENEW)
        ok_controller(resp, [leases.renew(self.ctx, req.context.requester, id, body.get("hours"))])


class InstanceConsole(_Resource):
    def on_get(self, req, resp, id):
        max_bytes = console.parse_bytes(_query(req, "bytes"))
        ok_controller(resp, [console.get_console(self.ctx, req.context.requester, id, max_bytes=max_bytes)])


class InstanceActions(_Resource):
    def on_get(self, req, resp, id):
        limit = history.parse_limit(_query(req, "limit"))
        before = history.parse_cursor(_query(req, "before"))
        page = history.page_actions(self.ctx, req.context.requester, id, limit=limit, before=before)
        if page.next_cursor is not None:
            # The envelope has no place for it: the next page is a Link header (RFC 8288), a
            # reference relative to this request's URL.
            resp.append_link(f"/v1/server-instance/{page.instance_id}/actions?limit={limit}"
                             f"&before={page.next_cursor}", "next")
        stream_controller(resp, page.chunks)


class ServerHosts(_Resource):
    """Which host each server-instance is on: for superusers (the instance object has no host)."""

    def on_get(self, req, resp):
        ok_controller(resp, instance_table.server_hosts(self.ctx, req.context.requester))


class ImageCollection(_Resource):
    def on_get(self, req, resp):
        ok_controller(resp, images.list_images(self.ctx, req.context.requester))


class ImageItem(_Resource):
    def on_get(self, req, resp, id):
        ok_controller(resp, [images.get_image(self.ctx, req.context.requester, id)])


class FlavorCollection(_Resource):
    def on_get(self, req, resp):
        ok_controller(resp, images.list_flavors(self.ctx, req.context.requester))


class FlavorItem(_Resource):
    def on_get(self, req, resp, id):
        ok_controller(resp, [images.get_flavor(self.ctx, req.context.requester, id)])


class VolumeCollection(_Resource):
    host_work = ("POST",)

    def on_get(self, req, resp):
        ok_controller(resp, volumes.list_volumes(
            self.ctx, req.context.requester, cloudauth_id=_query(req, "cloudauth-id")))

    def on_post(self, req, resp):
        body = self.body(req, schemas.VOLUME_CREATE)
        ok_controller(resp, [volumes.create_volume(self.ctx, req.context.requester, body)], status=201)


class VolumeItem(_Resource):
    host_work = ("DELETE",)

    def on_get(self, req, resp, id):
        ok_controller(resp, [volumes.get_volume(self.ctx, req.context.requester, id)])

    def on_delete(self, req, resp, id):
        volumes.delete_volume(self.ctx, req.context.requester, id)
        ok_controller(resp, [])


class GroupCollection(_Resource):
    host_work = ("POST",)

    def on_get(self, req, resp):
        ok_controller(resp, groups.list_groups(
            self.ctx, req.context.requester,
            group_name=_query(req, "group-name"), cloudauth_id=_query(req, "cloudauth-id")))

    def on_post(self, req, resp):
        body = self.body(req, schemas.GROUP_CREATE)
        ok_controller(resp, [groups.create_group(self.ctx, req.context.requester, body)], status=201)


class GroupItem(_Resource):
    host_work = ("PUT", "DELETE")

    def on_get(self, req, resp, id):
        ok_controller(resp, [groups.get_group(self.ctx, req.context.requester, id)])

    def on_put(self, req, resp, id):
        body = self.body(req, schemas.GROUP_UPDATE)
        ok_controller(resp, [groups.update_group(self.ctx, req.context.requester, id, body)])

    def on_delete(self, req, resp, id):
        groups.delete_group(self.ctx, req.context.requester, id)
        ok_controller(resp, [])


class Limits(_Resource):
    def on_get(self, req, resp):
        ok_controller(resp, [limits.usage_object(
            self.ctx, req.context.requester, cloudauth_id=_query(req, "cloudauth-id"))])


def add_routes(app, ctx: Context) -> None:
    app.add_route("/v1/server-instance", InstanceCollection(ctx))
    app.add_route("/v1/server-instance/{id}", InstanceItem(ctx))
    app.add_route("/v1/server-instance/{id}/console", InstanceConsole(ctx))
    app.add_route("/v1/server-instance/{id}/lease", InstanceLease(ctx))
    app.add_route("/v1/server-image", ImageCollection(ctx))
    app.add_route("/v1/server-image/{id}", ImageItem(ctx))
    app.add_route("/v1/server-flavor", FlavorCollection(ctx))
    app.add_route("/v1/server-flavor/{id}", FlavorItem(ctx))
    app.add_route("/v1/server-host", ServerHosts(ctx))
    app.add_route("/v1/storage-volume", VolumeCollection(ctx))
    app.add_route("/v1/storage-volume/{id}", VolumeItem(ctx))
    app.add_route("/v1/group", GroupCollection(ctx))
    app.add_route("/v1/group/{id}", GroupItem(ctx))
    app.add_route("/v1/limits", Limits(ctx))
    app.add_route("/v1/server-instance/{id}/actions", InstanceActions(ctx))
