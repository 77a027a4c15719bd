"""The two response envelopes of the spec (section 1) and which one a path uses."""

from collections.abc import Iterator

import falcon

USER_API_VERSION = "1"
_USER_PREFIXES = ("/v1/user", "/v1/auth")


def is_user_interface(path: str) -> bool:
    # One startswith first: the controller interface's paths (most requests) end here.
    return path.startswith(_USER_PREFIXES) and any(path == p or path.startswith(p + "/") for p in _USER_PREFIXES)


def controller_body(data: list, *, msg: str = "", success: bool = True) -> dict:
    return {"data": data, "msg": msg, "success": success}


def user_body(data=None, *, message: str = "", success: bool = True) -> dict:
    body = {"message": message, "success": success, "version": USER_API_VERSION}
    if data is not None:
        body["data"] = data
    return body


def ok_controller(resp: falcon.Response, data: list, *, status: int = 200) -> None:
    resp.status = status
    resp.media = controller_body(data)


def stream_controller(resp: falcon.Response, chunks: Iterator[str]) -> None:
    """A 200 controller envelope whose `data` is written while `chunks` (JSON objects joined
    by commas, a chunk at a time) yields: a list of 10,000 instances is never held whole.
    A list of one chunk is sent whole, with its length (no chunked encoding for the common
    short list). The first chunk is made here, so an error in making it is answered as any
    error is; one after that can only cut the body short."""
    resp.status = 200
    resp.content_type = falcon.MEDIA_JSON
    first = next(chunks, None)
    second = next(chunks, None) if first is not None else None
    if second is None:
        _close(chunks)
        ok_controller_json(resp, first or "")
        return
    resp.stream = _body(first, second, chunks)


def ok_controller_json(resp: falcon.Response, objects: str) -> None:
    """A 200 controller envelope whose `data` holds `objects`: JSON objects joined by commas."""
    resp.status = 200
    resp.content_type = falcon.MEDIA_JSON
    resp.data = (_OPENING + objects + _CLOSING).encode()


_OPENING, _CLOSING = '{"data": [', '], "msg": "", "success": true}'


def _body(first: str, second: str, rest: Iterator[str]) -> Iterator[bytes]:
    # No chunk is referenced here once its piece is made: while the next one is read, only
    # the piece the server is sending is alive, so a long list holds a few chunks at most.
    try:
        piece, first = (_OPENING + first).encode(), None
        yield piece
        piece, second = ("," + second).encode(), None
        yield piece
        for chunk in rest:
            piece, chunk = ("," + chunk).encode(), None
            yield piece
            piece = None
        yield _CLOSING.encode()
    finally:
        _close(rest)  # the source's own clean-up, also when the client went away half way


def _close(chunks: Iterator[str]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def ok_user(resp: falcon.Response, data=None) -> None:
    resp.status = 200
    resp.media = user_body(data)
