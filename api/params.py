"""Reading request bodies and parameters: size limit, content types, typed values."""

import json
import re
from urllib.parse import parse_qsl

import falcon

from api.error_responses import PayloadTooLarge, UnsupportedMediaType
from controller.errors import InvalidInput
from controller.rules import INT64_MAX, INT64_MIN, as_decimal

JSON_TYPES = ("application/json",)
FORM_TYPE = "application/x-www-form-urlencoded"
_SECRET_PARAMS = {"password", "api_secret", "new_password", "token"}


def _media_type(req: falcon.Request) -> str | None:
    if not req.content_type:
        return None
    return req.content_type.split(";", 1)[0].strip().lower()


def _is_json_type(mtype: str | None) -> bool:
    return mtype is not None and (mtype in JSON_TYPES or mtype.endswith("+json"))


def read_body(req: falcon.Request, *, limit: int) -> bytes:
    if req.content_length is not None and req.content_length > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes")
    data = req.bounded_stream.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes")
    return data


# json.loads makes every integer literal with int(), which refuses over 4,300 digits with a
# message about Python's settings; no value either interface takes has more than 19 digits.
_JSON_INT_DIGITS = 40


def _json_int(text: str) -> int:
    if len(text) > _JSON_INT_DIGITS:
        raise InvalidInput(f"request body holds an integer of {len(text)} characters; "
                           f"at most {_JSON_INT_DIGITS} are read")
    return int(text)


def _parse_json(raw: bytes) -> object:
    try:
        body = json.loads(raw.decode("utf-8"), parse_int=_json_int)
        # JSON may escape lone surrogates ("\ud800"), which no UTF-8 column, hash
        # or command can take: refuse them here rather than fail deep in the service.
        if b"\\u" in raw:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("request body is not UTF-8") from None
    except UnicodeEncodeError:
        raise InvalidInput("request body holds an invalid Unicode escape (lone surrogate)") from None
    except ValueError as e:
        raise InvalidInput(f"malformed JSON: {e}") from None
    except RecursionError:
        raise InvalidInput("malformed JSON: nested too deeply") from None
    return body


def json_object(req: falcon.Request, *, limit: int) -> dict:
    """The controller's JSON body, which must be an object."""
    raw = read_body(req, limit=limit)
    mtype = _media_type(req)
    if mtype is not None and not _is_json_type(mtype):
        raise UnsupportedMediaType(f"request body must be application/json, not {mtype}")
    if not raw.strip():
        raise InvalidInput("request body must be a JSON object")
    body = _parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidInput("request body must be a JSON object")
    return body


def user_params(req: falcon.Request, *, limit: int) -> dict:
    """Parameters of a user-interface call: the query string, then a JSON or form body over it."""
    params: dict = {}
    for key, value in req.params.items():
        params[key] = value[-1] if isinstance(value, list) else value
    # URLs end up in proxy and server logs: secrets must come in the body.
    leaked = sorted(_SECRET_PARAMS & params.keys())
    if leaked:
        raise InvalidInput(f"{', '.join(leaked)} must be sent in the request body, not in the URL")
    if req.method in ("GET", "HEAD"):
        return params
    raw = read_body(req, limit=limit)
    if not raw.strip():
        return params
    mtype = _media_type(req)
    # `curl -d '{...}'` labels JSON as a form: accept a body that is plainly a JSON object.
    looks_json = raw.lstrip().startswith(b"{")
    if _is_json_type(mtype) or (mtype in (None, FORM_TYPE) and looks_json):
        body = _parse_json(raw)
        if not isinstance(body, dict):
            raise InvalidInput("request body must be a JSON object")
        params.update({k: v for k, v in body.items() if v is not None})
    elif mtype in (None, FORM_TYPE):
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            raise InvalidInput("malformed form body") from None
        params.update(dict(pairs))
    else:
        raise UnsupportedMediaType(f"request body must be JSON or a form, not {mtype}")
    return params


# -- typed values -----------------------------------------------------------
def opt_str(params: dict, name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string")
    return value


def req_str(params: dict, name: str) -> str:
    value = opt_str(params, name)
    if value is None or value == "":
        raise InvalidInput(f"{name} is required")
    return value


_INT_TEXT = re.compile(r"-?[0-9]+")


def opt_int(params: dict, name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{name} must be an integer")
    if isinstance(value, str):
        text = value.strip()
        number = as_decimal(text)  # ASCII digits, their length bounded before int()
        if number is None and _INT_TEXT.fullmatch(text):
            raise InvalidInput(f"{name} is out of range")
        value = text if number is None else number
    if not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer")
    # SQLite's INTEGER is 64-bit; a larger value would fail at the database.
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInput(f"{name} is out of range")
    return value


def flag(params: dict, name: str) -> bool | None:
    """None when absent; otherwise true unless the value is 0 or false."""
    if name not in params:
        return None
    value = params[name]
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false")
    return value not in (0, False)
