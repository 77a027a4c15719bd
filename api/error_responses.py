"""Where every error becomes an HTTP status and an envelope: the only such place."""

import logging

import falcon

from api.envelopes import controller_body, is_user_interface, user_body
from controller import errors

log = logging.getLogger(__name__)

STATUS = {
    errors.InvalidInput: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooManyRequests: 429,
    errors.HostError: 503,
}


class PayloadTooLarge(errors.ControllerError):
    """The request body is over the configured limit (HTTP 413)."""


class UnsupportedMediaType(errors.ControllerError):
    """The request body is not JSON (or, on the user interface, a form) (HTTP 415)."""


STATUS[PayloadTooLarge] = 413
STATUS[UnsupportedMediaType] = 415


def status_of(exc: errors.ControllerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _render(req: falcon.Request, resp: falcon.Response, status: int, message: str, pages=None) -> None:
    # The cloud portal answers its own paths with a page (api/portal/render.py).
    if pages is not None and pages(req, resp, status, message):
        return
    resp.status = status
    if is_user_interface(req.path):
        resp.media = user_body(message=message, success=False)
    else:
        resp.media = controller_body([], msg=message, success=False)


def handle_controller_error(req, resp, exc: errors.ControllerError, params, pages=None) -> None:
    status = status_of(exc)
    if status >= 500:
        log.warning("%s %s: %s", req.method, req.path, exc.message)
    if isinstance(exc, (errors.TooManyRequests, errors.ServerBusy)):
        resp.set_header("Retry-After", str(exc.retry_after))
    if isinstance(exc, errors.Unauthenticated):
        resp.set_header("WWW-Authenticate", 'Token realm="cloud-controller"')
    _render(req, resp, status, exc.message, pages)


def handle_http_error(req, resp, exc: falcon.HTTPError, params, pages=None) -> None:
    # Falcon's own errors (unknown route, wrong method, bad header) in our envelope,
    # keeping headers such as Allow.
    for name, value in (exc.headers or {}).items():
        if name.lower() == "allow":
            # Falcon lists its default OPTIONS responder; OPTIONS is refused here too.
            value = ", ".join(m for m in (v.strip() for v in value.split(",")) if m != "OPTIONS")
        resp.set_header(name, value)
    message = exc.title or "error"
    if exc.description:
        message = f"{message}: {exc.description}"
    if exc.status_code == 404:
        message = f"no such resource: {req.path}"
    elif exc.status_code == 405:
        message = f"method {req.method} not allowed on {req.path}"
    _render(req, resp, exc.status_code, message, pages)


def handle_unexpected(req, resp, exc: Exception, params, pages=None) -> None:
    log.exception("unhandled error on %s %s", req.method, req.path)
    _render(req, resp, 500, "internal error; see the service log", pages)


def install(app: falcon.App, *, pages=None) -> None:
    """`pages(req, resp, status, message) -> bool`, when given, answers the requests it takes
    (the cloud portal's) with a page instead of an envelope; the status is decided here still."""
    def with_pages(handler):
        return lambda req, resp, exc, params: handler(req, resp, exc, params, pages)

    # Falcon picks the most specific registered handler for each exception.
    app.add_error_handler(Exception, with_pages(handle_unexpected))
    app.add_error_handler(falcon.HTTPError, with_pages(handle_http_error))
    app.add_error_handler(errors.ControllerError, with_pages(handle_controller_error))
