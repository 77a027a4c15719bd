"""The OpenAPI 3 document served at /v1/openapi.json, built from the same schemas the code validates with."""

from api import schemas
from common.words import REQUEST_ID_RULE
from controller.audit import request_ids

# Both headers go on every authenticated request; they are security schemes so that
# clients and tools treat them as credentials, not as ordinary parameters.
_SECURITY_SCHEMES = {
    "token": {"type": "apiKey", "in": "header", "name": "X-Auth-Token"},
    "cloudauthId": {"type": "apiKey", "in": "header", "name": "X-Auth-Cloudauth-Id"},
    # A controller served by this cloud auth: `Authorization: Controller N:SECRET`.
    "controller": {"type": "apiKey", "in": "header", "name": "Authorization",
                   "description": "Controller N:SECRET, as `cloud-agent controller add` printed it"},
}
_CONTROLLER_ONLY = {"security": [{"controller": []}]}
_PUBLIC = {"security": []}

# Every answer of either interface carries it; a request may send
# its own, kept when it is a safe token.
_REQUEST_ID = {
    "description": "The request's id, shared by the service's logs, audit rows and instance history: the "
                   "request's own X-Request-Id when it is 1 to 64 characters: letters, digits, ., - and _; "
                   "else a new one",
    "required": True,
    "schema": {"type": "string", "pattern": request_ids.PATTERN, "description": REQUEST_ID_RULE},
}


def _user_envelope(data_schema: dict | None) -> dict:
    props = {
        "message": {"type": "string"},
        "success": {"type": "boolean"},
        "version": {"type": "string"},
    }
    if data_schema is not None:
        props["data"] = data_schema
    return {"type": "object", "required": ["message", "success", "version"], "properties": props}


def _controller_envelope(item_schema: dict) -> dict:
    return {
        "type": "object",
        "required": ["data", "msg", "success"],
        "properties": {
            "data": {"type": "array", "items": item_schema},
            "msg": {"type": "string"},
            "success": {"type": "boolean"},
        },
    }


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _user_errors(*codes: int) -> dict:
    error = {"description": "error", "content": _json(_user_envelope(None))}
    return {str(c): error for c in codes}


def _controller_errors(*codes: int) -> dict:
    error = {"description": "error", "content": _json(_controller_envelope({}))}
    return {str(c): error for c in codes}


def _nullable(schema: dict) -> dict:
    # JSON null counts as an absent parameter.
    return {"anyOf": [schema, {"type": "null"}]}


def _user_op(summary: str, *, params: dict, data: dict | None, errors=(400, 401, 403, 404)) -> dict:
    """A user-interface operation; params are sent as query (GET) or as a JSON/form body (POST)."""
    body_schema = {"type": "object", "properties": {k: _nullable(v) for k, v in params.items()}}
    # Any call may also fail on a bad body (400), a big one (413), a foreign content type (415).
    errors = tuple(sorted(set(errors) | {400, 401, 413, 415}))
    return {
        "summary": summary,
        "parameters": [],
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {"schema": body_schema},
                "application/x-www-form-urlencoded": {"schema": body_schema},
            },
        },
        "responses": {"200": {"description": "success", "content": _json(_user_envelope(data))}, **_user_errors(*errors)},
    }


def _query_params(params: dict) -> list[dict]:
    return [{"name": n, "in": "query", "required": False, "schema": s} for n, s in params.items()]


def _path(name: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"}}


def _user_paths() -> dict:
    users_data = {
        "type": "object",
        "required": ["total", "users"],
        "properties": {"total": {"type": "integer"}, "users": {"type": "array", "items": schemas.USER_OBJECT}},
    }
    list_params = {
        "owner_userid": {"type": "string", "format": "uuid"},
        "show_inactive": {"type": "string"},
        "registration_source": schemas.REGISTRATION_SOURCE,
    }
    search_params = {"email": schemas.EMAIL, "username": schemas.USERNAME}

    def get_and_post(summary, params, data, path_params=()):
        post = _user_op(summary, params=params, data=data)
        post["parameters"] = post["parameters"] + list(path_params)
        get = {k: v for k, v in post.items() if k != "requestBody"}
        get["parameters"] = post["parameters"] + _query_params(params)
        return {"get": get, "post": post}

    def post_only(summary, params, data, path_params=(), errors=(400, 401, 403, 404)):
        op = _user_op(summary, params=params, data=data, errors=errors)
        op["parameters"] = op["parameters"] + list(path_params)
        return {"post": op}

    userid = [_path("userid")]
    return {
        "/v1/auth/token": {
            "post": {
                **_PUBLIC,
                "summary": "Issue a token from an API key and secret, or an email and password",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": schemas.TOKEN_REQUEST},
                        "application/x-www-form-urlencoded": {"schema": schemas.TOKEN_REQUEST},
                    },
                },
                "responses": {
                    "200": {"description": "a token", "content": _json(_user_envelope(schemas.TOKEN_DATA))},
                    **_user_errors(400, 401, 429),
                },
            }
        },
        "/v1/user/list": get_and_post("List users", list_params, users_data),
        "/v1/user/view/{userid}": get_and_post(
            "View a user", {}, {"type": "object", "properties": {"user": schemas.USER_OBJECT}}, userid
        ),
        "/v1/user/create": post_only(
            "Create a user",
            {
                "email": schemas.EMAIL,
                "password": {"type": "string", "minLength": 14, "maxLength": 24},
                "name": schemas.USER_NAME,
                "owner_userid": {"type": "string", "format": "uuid"},
                "active": {"type": "integer", "minimum": 0},
                "registration_source": schemas.REGISTRATION_SOURCE,
            },
            {"type": "object", "properties": {"userid": {"type": "string", "format": "uuid"}}},
            errors=(400, 401, 403, 409),
        ),
        "/v1/user/update/{userid}": post_only(
            "Update a user",
            {"email": schemas.EMAIL, "name": schemas.USER_NAME, "active": {"type": "integer", "minimum": 0}},
            None,
            userid,
            errors=(400, 401, 403, 404, 409),
        ),
        "/v1/user/search": get_and_post("Search users by email or system-account username", search_params, users_data),
        "/v1/user/set_password/{userid}": post_only(
            "Set a user's password (superuser)", {"password": {"type": "string"}}, None, userid
        ),
        "/v1/user/view_api_secret/{userid}": get_and_post(
            "View a user's API secret",
            {},
            {"type": "object", "properties": {"api_secret": {"type": ["string", "null"]}}},
            userid,
        ),
        "/v1/user/reset_api_secret/{userid}": post_only(
            "Reset (or with set_to_null revoke) a user's API secret (superuser)",
            {"set_to_null": {"type": "string"}},
            {"type": "object", "properties": {"api_secret": {"type": ["string", "null"]}}},
            userid,
        ),
        "/v1/user/delete/{email}": post_only(
            "Delete a user (superuser)", {}, None, [_path("email", schemas.EMAIL)], errors=(400, 401, 403, 404, 409)
        ),
        # A user's own credentials (self-service): the requester only, so no user id in the path.
        "/v1/user/credentials": {"get": {
            k: v for k, v in _user_op("Your own user id, API key and whether an API secret is set",
                                      params={}, data=schemas.CREDENTIALS_DATA, errors=(401,)).items()
            if k != "requestBody"}},
        "/v1/user/rotate_api_secret": post_only(
            "A new API secret for yourself, shown this once; proof: your password or your current secret. "
            "Your key-issued tokens end",
            {"password": {"type": "string"}, "api_secret": {"type": "string"}},
            schemas.ROTATED_SECRET_DATA, errors=(400, 401, 429),
        ),
        "/v1/user/change_password": post_only(
            "Change your own password (old and new); your password-issued tokens end",
            {"password": {"type": "string"}, "new_password": {"type": "string", "minLength": 14, "maxLength": 24}},
            None, errors=(400, 401, 429),
        ),
    }


def _cloud_auth_paths() -> dict:
    """The calls of the controllers this cloud auth serves, and the catalog users read."""
    controller_id = _path("controller_id", {"type": "string", "pattern": "^[1-9][0-9]{0,9}$",
                                            "description": "a cluster's number: 1 to 10 digits, not starting with 0"})
    username = _path("username", schemas.USERNAME)
    account_data = {"type": "object", "properties": {
        "controller_id": {"type": "integer"}, "username": {"type": "string"},
        "user_id": {"type": "string", "format": "uuid"}, "uuid": {"type": "string", "format": "uuid"},
        "uid": {"type": "integer"}}}
    introspect = _user_op("Is this token live, and whose (a controller asks about a token it has not seen)",
                          params={"token": {"type": "string"}, "userid": {"type": "string", "format": "uuid"}},
                          data={"type": "object", "required": ["active", "seq"], "properties": {
                              "active": {"type": "boolean"}, "userid": {"type": "string"},
                              "source": {"type": "string"}, "issued_at": {"type": "string"},
                              "expires_at": {"type": "string"}, "seq": {"type": "integer"}}},
                          errors=(400, 401, 403))
    changes = _user_op("What changed after `since`: users, every cluster's accounts, revoked tokens (by hash); "
                       "a paged snapshot when `reset`",
                       params={"since": {"type": "string", "pattern": "^[0-9]{1,19}$",
                                         "description": "1 to 19 digits"},
                               "epoch": {"type": "string"}, "after": {"type": "string"}},
                       data={"type": "object", "required": ["epoch", "seq", "reset", "more", "users", "accounts",
                                                            "revocations"]},
                       errors=(400, 401, 403))
    changes = {k: v for k, v in changes.items() if k != "requestBody"}
    changes["parameters"] = _query_params({"since": {"type": "string"}, "epoch": {"type": "string"},
                                           "after": {"type": "string"}})
    put = _user_op("Register the account a controller makes on its cluster (its own id only)",
                   params={"user_id": {"type": "string", "format": "uuid"}, "uuid": {"type": "string", "format": "uuid"},
                           "uid": {"type": "integer", "minimum": 1}},
                   data=account_data, errors=(400, 401, 403, 404, 409))
    delete = _user_op("Remove an account a controller registered", params={}, data=account_data,
                      errors=(400, 401, 403, 404))
    delete = {k: v for k, v in delete.items() if k != "requestBody"}
    for op in (introspect, changes, put, delete):
        op.update(_CONTROLLER_ONLY)
    for op in (put, delete):
        op["parameters"] = op["parameters"] + [controller_id, username]
    catalog = _user_op("The clusters one login reaches, and the default one",
                       params={}, data={"type": "object", "required": ["controllers", "default"]}, errors=(401,))
    catalog = {k: v for k, v in catalog.items() if k != "requestBody"}
    return {
        "/v1/auth/introspect": {"post": introspect},
        "/v1/auth/changes": {"get": changes},
        "/v1/auth/accounts/{controller_id}/{username}": {"put": put, "delete": delete},
        "/v1/auth/catalog": {"get": catalog},
    }


def _controller_paths() -> dict:
    return schemas.controller_paths(
        envelope=_controller_envelope,
        errors=_controller_errors,
        json=_json,
        path=_path,
    )


def openapi_document(*, controller: bool = True) -> dict:
    paths = {
        "/healthz": {
            "get": {
                **_PUBLIC,
                "summary": "Health of the database and host adapters",
                "responses": {"200": {"description": "healthy"}, "503": {"description": "a check failed"}},
            }
        },
        **_user_paths(),
        **_cloud_auth_paths(),
    }
    if controller:
        paths.update(_controller_paths())
    for path_item in paths.values():
        for operation in path_item.values():
            for response in operation["responses"].values():
                response["headers"] = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cloud controller and cloud auth user interface", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": _SECURITY_SCHEMES, "headers": {"X-Request-Id": _REQUEST_ID}},
        "security": [{"token": [], "cloudauthId": []}],
    }
