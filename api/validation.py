"""JSON schema validation of controller request bodies, with messages a client can act on."""

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from controller.errors import InvalidInput

_validators: dict[int, Draft202012Validator] = {}


def validate(body: dict, schema: dict) -> dict:
    validator = _validators.get(id(schema))
    if validator is None:
        validator = _validators[id(schema)] = Draft202012Validator(schema)
    error = best_match(validator.iter_errors(body))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        if error.validator == "maxLength":
            # jsonschema's message quotes the whole value, which may be a megabyte.
            raise InvalidInput(f"{where} is too long: at most {error.validator_value} characters, "
                               f"got {len(error.instance)}")
        raise InvalidInput(f"{where or 'body'}: {error.message}")
    return body
