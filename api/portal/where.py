"""Which cluster a page acts on: each page resource is routed twice, under /portal/... (this
cluster, or at a cloud auth serving no cluster itself its first registered one) and under
/portal/c/{cid}/... (any cluster the portal shows); controller/portal/clusters.py decides."""

from controller.context import Context
from controller.portal import clusters


class ClusterPage:
    public = True  # no API token: the portal's guard decides
    # A form waits for a host worker (api/admission.py): one for this cluster works on its
    # hosts, one for another cluster holds a thread on that cluster's API (up to
    # `[cloud_auth] timeout_seconds`), and both are bounded alike.
    host_work: tuple[str, ...] = ("POST",)

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def cluster(self, req, cid: str | None):
        session = req.context.session
        found = clusters.default(self.ctx, session) if cid is None else clusters.cluster(self.ctx, session, cid)
        req.context.cluster = found
        return found


def cluster_routes(app, ctx: Context, pages: dict) -> None:
    for suffix, resource in pages.items():
        app.add_route("/portal" + suffix, resource(ctx))
        app.add_route("/portal/c/{cid}" + suffix, resource(ctx))
