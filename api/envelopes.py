"""The two response envelopes of the spec (section 1) and which one a path uses."""

import itertools
import json
from collections.abc import Iterator

import falcon

USER_API_VERSION = "1"
_USER_PREFIXES = ("/v1/user", "/v1/auth")


def is_user_interface(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _USER_PREFIXES)


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


def stream_controller(resp: falcon.Response, objects: Iterator[dict], *, per_chunk: int = 200) -> None:
    """A 200 controller envelope whose `data` is written while `objects` yields, a chunk of
    per_chunk objects at a time: a list of 10,000 instances is encoded without ever being
    held whole. A list that fits in one chunk is sent whole, with its length (no chunked
    encoding for the common short list). The first chunk is made here, so an error in
    making it is answered as any error is; one after that can only cut the body short."""
    head = list(itertools.islice(objects, per_chunk + 1))
    resp.status = 200
    resp.content_type = falcon.MEDIA_JSON
    if len(head) <= per_chunk:
        resp.data = b"".join(_chunks(head[0] if head else None, iter(head[1:]), per_chunk))
        return
    resp.stream = _chunks(head[0], _after(head[1:], objects), per_chunk)


def _after(head: list[dict], rest: Iterator[dict]) -> Iterator[dict]:
    # A generator (not itertools.chain): closing it closes `rest`, the store's cursor.
    yield from head
    yield from rest


def _chunks(first: dict | None, rest: Iterator[dict], per_chunk: int) -> Iterator[bytes]:
    try:
        opening, separator = '{"data": [', ""
        if first is not None:
            # One json.dumps per chunk: a call per object cost a third of a 10,000-row list.
            batch = [first]
            for obj in rest:
                batch.append(obj)
                if len(batch) == per_chunk:
                    yield (opening + separator + json.dumps(batch)[1:-1]).encode()
                    opening, separator, batch = "", ", ", []
            if batch:
                yield (opening + separator + json.dumps(batch)[1:-1]).encode()
                opening = ""
        yield (opening + '], "msg": "", "success": true}').encode()
    finally:
        close = getattr(rest, "close", None)
        if close is not None:
            close()  # the store's cursor, when the client went away half way


def ok_user(resp: falcon.Response, data=None) -> None:
    resp.status = 200
    resp.media = user_body(data)
