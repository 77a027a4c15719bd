"""The two response envelopes of the spec (section 1) and which one a path uses."""

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


def ok_user(resp: falcon.Response, data=None) -> None:
    resp.status = 200
    resp.media = user_body(data)
