"""JSON schemas: request bodies the controller validates, and the objects both interfaces return.

The same dictionaries feed jsonschema validation and /v1/openapi.json, so the
document cannot drift from what the code accepts.
"""

from common.words import GROUP_NAME_RULE, REQUEST_ID_RULE
from controller.audit import request_ids
from controller.audit.history import ACTIONS, MAX_LIMIT, RESULTS
from controller.rules import EMAIL_MAX, NAME_MAX, SHORT_TEXT_MAX, USERNAME_MAX

UUID = {"type": "string", "format": "uuid"}
DATE_TIME = {"type": "string", "format": "date-time"}

# -- cloud auth -------------------------------------------------------------
SYSTEM_ACCOUNT = {
    "type": "object",
    "required": ["id", "username", "uuid", "cloud_controller_id"],
    "properties": {
        "id": {"type": "integer"},
        "username": {"type": "string"},
        "uuid": {**UUID, "description": "the account id: what a server-instance's `users` takes"},
        "cloud_controller_id": {"type": "integer"},
    },
}

USER_OBJECT = {
    "type": "object",
    "required": ["id", "email", "name", "active", "system_accounts", "created_at_utc"],
    "properties": {
        "id": UUID,
        "email": {"type": "string"},
        "name": {"type": "string"},
        "active": {"type": "integer"},
        "owner_userid": UUID,
        "system_accounts": {"type": "array", "items": SYSTEM_ACCOUNT},
        "created_at_utc": DATE_TIME,
        "api_key": {"type": "string"},
        "num_owned_accounts": {"type": "integer"},
        "roles": {"type": "array", "items": {"type": "string"}},
        "registration_source": {"type": "string"},
    },
}

_NON_EMPTY = {"type": "string", "minLength": 1}

TOKEN_REQUEST = {
    "oneOf": [
        {
            "type": "object",
            "required": ["api_key", "api_secret"],
            "properties": {"api_key": _NON_EMPTY, "api_secret": _NON_EMPTY},
            "not": {"anyOf": [{"required": ["email"]}, {"required": ["password"]}]},
        },
        {
            "type": "object",
            "required": ["email", "password"],
            "properties": {"email": _NON_EMPTY, "password": _NON_EMPTY},
            "not": {"anyOf": [{"required": ["api_key"]}, {"required": ["api_secret"]}]},
        },
    ]
}

TOKEN_DATA = {
    "type": "object",
    "required": ["token", "expires_at", "userid"],
    "properties": {"token": {"type": "string"}, "expires_at": DATE_TIME, "userid": UUID},
}

# A user's own credentials (self-service): never the secret, except the new one once.
CREDENTIALS_DATA = {
    "type": "object",
    "required": ["userid", "api_key", "api_secret_set"],
    "properties": {"userid": UUID, "api_key": {"type": "string"}, "api_secret_set": {"type": "boolean"}},
}
ROTATED_SECRET_DATA = {
    "type": "object",
    "required": ["api_key", "api_secret"],
    "properties": {"api_key": {"type": "string"}, "api_secret": {"type": "string"}},
}

# Free-text parameters of the user interface, bounded as controller/rules.py checks them.
EMAIL = {"type": "string", "maxLength": EMAIL_MAX}
USER_NAME = {"type": "string", "maxLength": NAME_MAX}
REGISTRATION_SOURCE = {"type": "string", "maxLength": SHORT_TEXT_MAX}
USERNAME = {"type": "string", "maxLength": USERNAME_MAX}

# -- controller request bodies -------------------------------------------------
# A server-instance's users are system accounts, named by account id: the `uuid` of the
# user's system account on this cluster (in the user's `system_accounts`), never the user's id.
ACCOUNT_IDS_WORDS = ("account ids: the `uuid` of each user's system account on this cluster (a user's "
                     "`system_accounts`), not the user's id")
_USER_IDS = {"type": "array", "items": {"type": "string"}, "description": ACCOUNT_IDS_WORDS}

INSTANCE_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["server-image", "server-flavor"],
    "properties": {
        "server-image": {"type": "string"},
        "server-flavor": {"type": "string"},
        "users": _USER_IDS,
    },
}

INSTANCE_TASK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["task"],
    "properties": {
        "task": {
            "oneOf": [
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["what", "how", "users"],
                    "properties": {
                        "what": {"const": "modify-users"},
                        "how": {"enum": ["add", "replace", "delete"]},
                        "users": _USER_IDS,
                    },
                },
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["what"],
                    "properties": {"what": {"enum": ["reboot", "power-on", "power-off"]}},
                },
            ]
        }
    },
}

VOLUME_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["volume-size", "volume-type"],
    "properties": {
        "volume-size": {"type": "integer", "minimum": 1},
        "volume-type": {
            "type": "object",
            "additionalProperties": False,
            "required": ["visibility"],
            "properties": {"visibility": {"const": "cluster"}},
        },
        "volume-name": {"type": ["string", "null"], "maxLength": NAME_MAX},
    },
}

# A schema's pattern is never shown to a client: its description says it in words (api/validation.py).
GROUP_NAME = {"type": "string", "pattern": "^[a-z_][a-z0-9_-]{0,31}$", "description": GROUP_NAME_RULE}
_MEMBERS = {"type": "array", "items": {"type": "string"}}

GROUP_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["group-name"],
    "properties": {"group-name": GROUP_NAME, "group-members": _MEMBERS},
}

GROUP_UPDATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action", "group-members"],
    "properties": {"action": {"enum": ["add", "delete", "replace"]}, "group-members": _MEMBERS},
}

# -- controller objects -----------------------------------------------------------
INSTANCE_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "cloudauth-id", "users", "server-image", "server-flavor", "creation-date", "status",
                 "expires-at", "lease"],
    "properties": {
        "id": UUID,
        "cloudauth-id": UUID,
        "users": {"type": "array", "items": {"type": "string"},
                  "description": ACCOUNT_IDS_WORDS + "; the owner's is always there"},
        "server-image": {"type": "string"},
        "server-flavor": {"type": "string"},
        "creation-date": DATE_TIME,
        "status": {"enum": ["building", "running", "paused", "shutoff", "crashed", "error"]},
        "hostname": {"type": "string"},
        "public-ip": {"type": "string"},
        "private-ip": {"type": "string"},
        "expires-at": {"anyOf": [DATE_TIME, {"type": "null"}],
                       "description": "When its lease ends (null: it has none)"},
        "lease": {"enum": ["none", "active", "expiring", "expired"],
                  "description": "expiring: within the first [leases] warn of its end"},
    },
}

# POST /v1/server-instance/{id}/lease. Without hours: the flavor's or [leases] default.
LEASE_RENEW = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "hours": {"type": "number", "exclusiveMinimum": 0, "maximum": 87600,
                  "description": "The lease runs this many hours from now (at most the max)"},
    },
}

IMAGE_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "name", "public", "operating-system", "min-disk", "min-ram", "creation-date", "active"],
    "properties": {
        "id": UUID,
        "name": {"type": "string"},
        "public": {"type": "boolean"},
        "operating-system": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "major_version", "minor_version"],
            "properties": {
                "name": {"type": "string"},
                "major_version": {"type": "string"},
                "minor_version": {"type": "string"},
            },
        },
        "min-disk": {"type": "integer"},
        "min-ram": {"type": "integer"},
        "creation-date": DATE_TIME,
        "active": {"type": "boolean"},
    },
}

FLAVOR_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "name", "memory", "disk", "vcpu"],
    "properties": {
        "id": {"type": "string"},
        "name": {"type": "string"},
        "memory": {"type": "integer"},
        "disk": {"type": "integer"},
        "vcpu": {"type": "integer"},
    },
}

VOLUME_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["volume-id", "cloudauth-id", "volume-size", "volume-type", "creation-date"],
    "properties": {
        "volume-id": UUID,
        "cloudauth-id": UUID,
        "volume-size": {"type": "integer"},
        "volume-type": {
            "type": "object",
            "additionalProperties": False,
            "required": ["visibility", "mount-point"],
            "properties": {"visibility": {"const": "cluster"}, "mount-point": {"type": "string"}},
        },
        "creation-date": DATE_TIME,
        "volume-name": {"type": ["string", "null"]},
    },
}

GROUP_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["group-id", "cloudauth-id", "group-name", "group-members"],
    "properties": {
        "group-id": UUID,
        "cloudauth-id": UUID,
        "group-name": {"type": "string"},
        "group-members": {"type": "array", "items": {"type": "string"}},
    },
}

_LIMIT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["limit", "used"],
    # limit -1: no limit.
    "properties": {"limit": {"type": "integer", "minimum": -1}, "used": {"type": "integer", "minimum": 0}},
}

LIMITS_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["cloudauth-id", "instances", "vcpus", "memory_mb", "groups", "managed_users"],
    "properties": {"cloudauth-id": UUID, **{k: _LIMIT for k in ("instances", "vcpus", "memory_mb", "groups",
                                                                   "managed_users")}},
}


# Which host a server-instance is on (GET /v1/server-host, superusers only): the
# server-instance object keeps its own fields, none of them a host.
SERVER_HOST_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "host"],
    "properties": {"id": UUID, "host": {"type": "string"}},
}


CONSOLE_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["console", "ready"],
    "properties": {"console": {"type": "string"}, "ready": {"type": "boolean"}},
}

# The console endpoint's `bytes`: how much of the end of the output to answer.
CONSOLE_BYTES = {"type": "integer", "minimum": 1, "maximum": 1024 * 1024, "default": 64 * 1024}

# The history's `limit`: the most recent entries answered (controller/audit/history.py).
ACTIONS_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": MAX_LIMIT}

# The history's `before`: a cursor an earlier answer gave, opaque (controller/audit/history.py).
ACTIONS_CURSOR = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$",
                  "description": "1 to 40 characters: letters, digits, - and _, as an earlier answer gave it"}

# One entry of an instance's history (controller/audit/history.py).
ACTION_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action", "requester", "request-id", "result", "message", "time"],
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "requester": {"anyOf": [UUID, {"type": "null"}]},  # null: an admin command
        "request-id": {"type": "string", "pattern": request_ids.PATTERN, "description": REQUEST_ID_RULE},
        "result": {"type": "string", "enum": list(RESULTS)},
        "message": {"type": "string"},
        "time": DATE_TIME,
    },
}


def controller_paths(*, envelope, errors, json, path) -> dict:
    """OpenAPI path items of the controller interface."""

    def op(summary, obj, *, status="200", body=None, params=(), errs=(400, 401, 403, 404, 409, 503)):
        o = {
            "summary": summary,
            "parameters": list(params),
            "responses": {status: {"description": "success", "content": json(envelope(obj))}, **errors(*errs)},
        }
        if body is not None:
            o["requestBody"] = {"required": True, "content": json(body)}
        return o

    cloudauth_q = {"name": "cloudauth-id", "in": "query", "required": False, "schema": UUID}
    actions_op = op(
        "The instance's most recent `limit` actions (below the cursor `before`), oldest first (also after its "
        "delete, for the audit retention). When older ones remain, the answer's `Link` header gives the next "
        "page: `<...?limit=N&before=CURSOR>; rel=next`", ACTION_OBJECT,
        params=[path("id"),
                {"name": "limit", "in": "query", "required": False, "schema": ACTIONS_LIMIT,
                 "description": f"entries per page, default {MAX_LIMIT}"},
                {"name": "before", "in": "query", "required": False, "schema": ACTIONS_CURSOR,
                 "description": "the cursor of the `Link: rel=next` of an earlier answer: the page of entries "
                                "older than that answer's"}],
        errs=(400, 401, 404))
    actions_op["responses"]["200"]["headers"] = {"Link": {
        "description": "`<reference>; rel=next` (RFC 8288), relative to the request's URL, when older entries "
                       "remain", "schema": {"type": "string"}}}
    group_q = {"name": "group-name", "in": "query", "required": False, "schema": {"type": "string"}}
    id_p = [path("id")]
    return {
        "/v1/server-instance": {
            "get": op("List visible server-instances", INSTANCE_OBJECT, params=[cloudauth_q], errs=(400, 401)),
            "post": op("Create a server-instance", INSTANCE_OBJECT, status="201", body=INSTANCE_CREATE,
                       errs=(400, 401, 403, 404, 409, 413, 415, 429, 503)),
        },
        "/v1/server-instance/{id}": {
            "get": op("View a server-instance", INSTANCE_OBJECT, params=id_p, errs=(401, 404)),
            "put": op("Modify users or power state", INSTANCE_OBJECT, body=INSTANCE_TASK, params=id_p,
                      errs=(400, 401, 403, 404, 409, 413, 415, 429, 503)),
            "delete": op("Delete a server-instance", {}, params=id_p, errs=(401, 403, 404, 429, 503)),
        },
        "/v1/server-instance/{id}/lease": {
            "post": op("Renew the instance's lease: it ends `hours` from now", INSTANCE_OBJECT, body=LEASE_RENEW,
                       params=id_p, errs=(400, 401, 403, 404, 409, 413, 415, 429)),
        },
        "/v1/server-instance/{id}/console": {
            "get": op("The guest's serial console since its last start, and whether it is ready", CONSOLE_OBJECT,
                      params=[*id_p, {"name": "bytes", "in": "query", "required": False, "schema": CONSOLE_BYTES}],
                      errs=(400, 401, 404, 503)),
        },
        "/v1/server-image": {"get": op("List usable images", IMAGE_OBJECT, errs=(401,))},
        "/v1/server-image/{id}": {"get": op("View an image", IMAGE_OBJECT, params=id_p, errs=(401, 404))},
        "/v1/server-flavor": {"get": op("List flavors", FLAVOR_OBJECT, errs=(401,))},
        "/v1/server-flavor/{id}": {"get": op("View a flavor", FLAVOR_OBJECT, params=id_p, errs=(401, 404))},
        "/v1/server-host": {"get": op("Which hypervisor host each server-instance is on (superuser only)",
                                      SERVER_HOST_OBJECT, errs=(401, 403))},
        "/v1/storage-volume": {
            "get": op("List visible volumes", VOLUME_OBJECT, params=[cloudauth_q], errs=(400, 401)),
            "post": op("Create the requester's home volume", VOLUME_OBJECT, status="201", body=VOLUME_CREATE,
                       errs=(400, 401, 409, 413, 415, 429, 503)),
        },
        "/v1/storage-volume/{id}": {
            "get": op("View a volume", VOLUME_OBJECT, params=id_p, errs=(401, 404)),
            "delete": op("Delete a volume and all data on it", {}, params=id_p,
                         errs=(401, 403, 404, 409, 429, 503)),
        },
        "/v1/group": {
            "get": op("List visible groups", GROUP_OBJECT, params=[cloudauth_q, group_q], errs=(400, 401)),
            "post": op("Create a UNIX group", GROUP_OBJECT, status="201", body=GROUP_CREATE,
                       errs=(400, 401, 403, 409, 413, 415, 429, 503)),
        },
        "/v1/group/{id}": {
            "get": op("View a group", GROUP_OBJECT, params=id_p, errs=(401, 404)),
            "put": op("Change the members of a group", GROUP_OBJECT, body=GROUP_UPDATE, params=id_p,
                      errs=(400, 401, 403, 404, 413, 415, 429, 503)),
            "delete": op("Delete a group", {}, params=id_p, errs=(401, 403, 404, 429, 503)),
        },
        "/v1/limits": {
            "get": op("A user's limits and what it holds now", LIMITS_OBJECT, params=[cloudauth_q],
                      errs=(400, 401, 404)),
        },
        "/v1/server-instance/{id}/actions": {"get": actions_op},
    }
