"""Request-wide checks: request ids, body size and authentication; each request counted and timed."""

import logging
import time

import falcon

from api.error_responses import PayloadTooLarge
from api.envelopes import is_user_interface
from controller.audit import trail as audit, request_ids
from controller.auth.tokens import authenticate
from controller.cloud_auth.callers import authenticate_controller
from controller.context import Context
from controller.monitoring.metrics import metrics_of


_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")

access_log = logging.getLogger("cloud_controller.access")


def allowed_methods(resource) -> list[str]:
    """The methods a resource answers (its on_* responders)."""
    return [m for m in _METHODS if hasattr(resource, f"on_{m.lower()}")]


class RefuseOptions:
    """OPTIONS is not among the methods the spec accepts on any path: 405 like any other."""

    def process_resource(self, req, resp, resource, params):
        if req.method == "OPTIONS" and resource is not None:
            raise falcon.HTTPMethodNotAllowed(allowed_methods(resource))


class BodyLimit:
    def __init__(self, limit: int):
        self.limit = limit

    def process_request(self, req, resp):
        if req.content_length is not None and req.content_length > self.limit:
            raise PayloadTooLarge(f"request body over {self.limit} bytes")


class Authenticate:
    """Every resource needs the auth headers unless it says `public = True`; the calls of the
    controllers a cloud auth serves (`caller = "controller"`) need a controller's credential
    instead, and a user's token does not reach them."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def process_resource(self, req, resp, resource, params):
        if resource is None or getattr(resource, "public", False):
            return
        if getattr(resource, "caller", None) == "controller":
            req.context.controller = authenticate_controller(self.ctx, req.env.get("HTTP_AUTHORIZATION"))
            return
        # The WSGI names directly: get_header() derives them from the header's name on every call.
        req.context.requester = authenticate(
            self.ctx,
            token=req.env.get("HTTP_X_AUTH_TOKEN"),
            user_id=req.env.get("HTTP_X_AUTH_CLOUDAUTH_ID"),
        )


_MAX_TARGET = 100

# User-interface calls that only read, though clients may send them as POST.
_READ_ONLY = ("/v1/user/list", "/v1/user/view/", "/v1/user/search", "/v1/auth/introspect")


class AuditTrail:
    """One audit row per mutating request (and per API secret viewed), whatever its outcome;
    failed requests without an identity are counted instead (audit.AnonymousFailures)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def process_response(self, req, resp, resource, req_succeeded):
        if resource is None or not _audited(req):
            return
        requester = req.context.get("requester")
        controller = req.context.get("controller")
        template = req.uri_template or req.path
        action = f"{req.method} {template}"
        if requester is None and controller is None and resp.status_code >= 400:
            self.ctx.anonymous_failures.count(action, str(resp.status_code))
            return
        actor = requester.id if requester else f"controller:{controller.id}" if controller else "anonymous"
        audit.record(
            self.ctx.store,
            actor=actor,
            action=action,
            # Bounded: a client chooses the path, and rows must not grow with it.
            target=_target(req, template, resp)[:_MAX_TARGET],
            result=str(resp.status_code),
            request_id=req.context.get("request_id", ""),
        )
        # Each log record carries the request id (request_ids.stamp_log_records).
        access_log.info("%s %s by %s", action, resp.status_code, actor)


def _target(req, template: str, resp) -> str:
    """The object a request acted on: the path's last {field} (also under a sub-path such as
    /v1/server-instance/{id}/lease, whatever the outcome), else the id the call made."""
    parts = template.split("/")
    fields = [i for i, part in enumerate(parts) if part.startswith("{")]
    segments = req.path.split("/")
    if fields and len(segments) == len(parts):
        return segments[fields[-1]]
    return _created_id(resp)


# Keys that name the object a call made (or the user a token was issued to); only ids,
# so nothing else of the response, least of all a secret or token, reaches the audit.
_ID_KEYS = ("id", "volume-id", "group-id", "userid")


def _created_id(resp) -> str:
    media = resp.media if isinstance(resp.media, dict) else {}
    data = media.get("data")
    if isinstance(data, list):
        data = data[0] if len(data) == 1 else None
    if isinstance(data, dict):
        for key in _ID_KEYS:
            if isinstance(data.get(key), str):
                return data[key]
    return ""


def _audited(req) -> bool:
    if req.path.startswith("/v1/user/view_api_secret/"):
        return True
    if req.method in ("GET", "HEAD", "OPTIONS"):
        return False
    return not req.path.startswith(_READ_ONLY)


class NoStore:
    """User-interface answers may carry tokens, secrets and personal data: no cache keeps them."""

    def process_response(self, req, resp, resource, req_succeeded):
        if is_user_interface(req.path):
            resp.set_header("Cache-Control", "no-store")


class RequestMetrics:
    """Counts and times every request by its route template (`/v1/server-instance/{instance_id}`,
    never the path a client chose) for the metrics endpoint (controller/monitoring/metrics.py). First in
    the middleware, so the time includes admission and authentication; Falcon runs its
    process_response even when a later middleware refused the request."""

    def __init__(self, ctx: Context):
        self.metrics = metrics_of(ctx)

    def process_request(self, req, resp):
        req.context.metrics_started = time.perf_counter()

    def process_response(self, req, resp, resource, req_succeeded):
        started = req.context.get("metrics_started")
        if started is None:
            return
        self.metrics.request(route=req.uri_template if resource is not None else None, method=req.method,
                             status=resp.status_code, seconds=time.perf_counter() - started)
class RequestId:
    """Every answer of either interface carries `X-Request-Id`: the client's own when it is a
    safe token, else a fresh one (controller/audit/request_ids.py). Second in the middleware list,
    right after RequestMetrics (which neither refuses nor logs), so its process_request runs
    before anything can refuse the request and its process_response after the audit row took the id."""

    def process_request(self, req, resp):
        req.context.request_id = request_ids.accept(req.env.get("HTTP_X_REQUEST_ID"))
        request_ids.bind(req.context.request_id)

    def process_response(self, req, resp, resource, req_succeeded):
        resp.set_header("X-Request-Id", req.context.get("request_id") or request_ids.new())
        request_ids.bind(None)  # the thread serves other requests next
