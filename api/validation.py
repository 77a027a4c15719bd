"""JSON schema validation of controller request bodies, with messages a client can act on.

A message never shows a schema's pattern: a string schema with a `pattern` says its rule
in words in its `description` (api/schemas.py), and that is what a refusal says. A value
the client sent is echoed cut short (common/words.py).
"""

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from common.words import quoted, shown
from controller.errors import InvalidInput

_validators: dict[int, Draft202012Validator] = {}


def validate(body: dict, schema: dict) -> dict:
    validator = _validators.get(id(schema))
    if validator is None:
        validator = _validators[id(schema)] = Draft202012Validator(schema)
    error = best_match(validator.iter_errors(body))
    if error is not None:
        where = shown("/".join(str(p) for p in error.absolute_path))
        if error.validator == "maxLength":
            # jsonschema's message quotes the whole value, which may be a megabyte.
            raise InvalidInput(f"{where} is too long: at most {error.validator_value} characters, "
                               f"got {len(error.instance)}")
        if error.validator == "pattern":
            rule = error.schema.get("description") or "it is not in the form this field takes"
            raise InvalidInput(f"invalid {where or 'value'} {quoted(error.instance)}: {rule}")
        raise InvalidInput(f"{where or 'body'}: {_message(error)}")
    return body


def _message(error) -> str:
    """jsonschema's message, with the value it echoes cut short."""
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        extra = [k for k in instance if k not in known]
        return f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(quoted(k) for k in extra[:5])}"
    message = error.message
    whole = repr(instance)
    if message.startswith(whole):
        message = (quoted(instance) if isinstance(instance, str) else shown(whole)) + message[len(whole):]
    return message
