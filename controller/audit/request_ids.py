"""Request ids: one per API request and per `cloud-agent` run, shared by the response's
`X-Request-Id`, the log lines, the audit row and the instance history.

A client's own id is kept when it is a safe token (1 to 64 of `[A-Za-z0-9._-]`), so a
caller can find its request in the logs by an id it chose; anything else (too long,
spaces, control characters that would forge log lines) is replaced by a fresh one.

The id of the work in progress is kept in a context variable: set by the API's
middleware at the start of a request (waitress serves each on one thread) and by
`cloud-agent` at the start of a command, read by audit and history rows and by the
log record factory, so no service function passes it along.
"""

import contextvars
import logging
import os
import re

# What a request id is, as the OpenAPI document says it (api/openapi.py, api/schemas.py).
PATTERN = "^[A-Za-z0-9._-]{1,64}$"
_SAFE = re.compile(PATTERN[1:-1])
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def new() -> str:
    # 128 random bits as 32 hex digits, as uuid4().hex gives (less 6 fixed bits) without
    # building a UUID object on every request.
    return os.urandom(16).hex()


def accept(given: str | None) -> str:
    """The client's id when it is a safe token, else a fresh one."""
    return given if given is not None and _SAFE.fullmatch(given) else new()


def current() -> str | None:
    """The id of the request or command being served (None outside both)."""
    return _current.get()


def bind(request_id: str | None) -> None:
    """Make `request_id` the current one (None: none) for what runs next in this context."""
    _current.set(request_id)


# -- log lines ---------------------------------------------------------------------------
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def stamp_log_records() -> None:
    """Every log record made from now on carries `request_id` (the current one, or "-"),
    whichever logger or handler makes it; LOG_FORMAT prints it. Installed once per process."""
    make = logging.getLogRecordFactory()
    if getattr(make, "stamps_request_ids", False):
        return

    def factory(*args, **kwargs):
        record = make(*args, **kwargs)
        record.request_id = _current.get() or "-"
        return record

    factory.stamps_request_ids = True
    logging.setLogRecordFactory(factory)
