"""The Falcon application factory.

`create_app(ctx)` builds the WSGI app from a service context (tests pass one
built on fakes); `get_app()` builds everything from the config file for
waitress or any WSGI server.
"""

import time

import falcon

from api import cloud_auth_resources, error_responses, health_resource, user_resources
from api.admission import Admission, gates_from
from api.middleware import AuditTrail, Authenticate, BodyLimit, NoStore, RefuseOptions, RequestId, RequestMetrics
from controller.config import INTERFACES, Config, load_config
from controller.context import Context, build_context

DEFAULT_INTERFACES = ("controller", "user")


class ToThePortal:
    """`GET /` where the cloud portal is served: a browser opened at the service's address is
    sent to the portal (303). Without the portal, `/` is no resource: 404 in the envelope."""

    public = True

    def on_get(self, req, resp):
        resp.status = 303
        resp.location = "/portal/"


def create_app(ctx: Context, *, interfaces: tuple[str, ...] = DEFAULT_INTERFACES, portal_clock=time.time) -> falcon.App:
    """`portal_clock` is the cloud portal's clock for its sessions' timeouts (tests give another)."""
    host_gate, other_gate = gates_from(ctx.config)
    portal = None
    if "portal" in interfaces:
        from api import portal
    app = falcon.App(
        middleware=[
            RequestMetrics(ctx),  # first: its time covers everything after it
            RequestId(),
            BodyLimit(ctx.config.server.max_body_bytes),
            NoStore(),
            RefuseOptions(),
            AuditTrail(ctx),
            # Slow host work never takes the threads reads need (api/admission.py).
            Admission(other_gate, host_work=False),
            Authenticate(ctx),
            # The portal's pages: session, CSRF and headers (after the API's token check, which
            # they skip; before the host gate, as authentication is).
            *([portal.middleware(ctx, clock=portal_clock)] if portal else []),
            Admission(host_gate, host_work=True),
        ],
    )
    app.req_options.strip_url_path_trailing_slash = True
    error_responses.install(app, pages=portal.answer_error if portal else None)

    app.add_route("/healthz", health_resource.Health(ctx))
    app.add_route("/v1/openapi.json", health_resource.OpenApi(ctx))
    if "user" in interfaces:
        user_resources.add_routes(app, ctx)
        cloud_auth_resources.add_routes(app, ctx)
    if "controller" in interfaces:
        from api import controller_resources

        controller_resources.add_routes(app, ctx)
    if portal:
        portal.add_routes(app, ctx, clock=portal_clock)
        app.add_route("/", ToThePortal())
    return app


def interfaces_of(config: Config) -> tuple[str, ...]:
    wanted = config.server.interfaces
    unknown = set(wanted) - set(INTERFACES)
    if unknown or not wanted:
        raise ValueError(f"[server] interfaces must name some of {', '.join(INTERFACES)}")
    return wanted


def build_context_for(config: Config, interfaces: tuple[str, ...]) -> Context:
    adapters = None
    # The portal's pages act on this controller's hosts through the service layer.
    if "controller" in interfaces or "portal" in interfaces:
        from host_adapters.factory import build_adapters

        adapters = build_adapters(config)
    return build_context(config, adapters=adapters)


def build_app(config: Config) -> falcon.App:
    interfaces = interfaces_of(config)
    return create_app(build_context_for(config, interfaces), interfaces=interfaces)


def get_app() -> falcon.App:
    """WSGI entry point: reads the config named by CLOUD_CONTROLLER_CONFIG or the default path."""
    return build_app(load_config())
