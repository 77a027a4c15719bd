"""Form bodies (application/x-www-form-urlencoded) of the portal's POSTs, read once by the guard."""

from urllib.parse import parse_qsl

from api.error_responses import UnsupportedMediaType
from api.params import read_body
from controller.errors import InvalidInput

FORM_TYPE = "application/x-www-form-urlencoded"
_MAX_FIELDS = 500


class Form:
    """A form's fields: `get` the last value of one, `all` every value of a repeated one."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self._pairs = pairs

    def get(self, name: str, default: str = "") -> str:
        found = [v for k, v in self._pairs if k == name]
        return found[-1] if found else default

    def all(self, name: str) -> list[str]:
        return [v for k, v in self._pairs if k == name and v]


def read_form(req, *, limit: int) -> Form:
    raw = read_body(req, limit=limit)
    media = (req.content_type or "").split(";", 1)[0].strip().lower()
    if raw.strip() and media != FORM_TYPE:
        raise UnsupportedMediaType(f"a form must be sent as {FORM_TYPE}")
    try:
        text = raw.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=False, max_num_fields=_MAX_FIELDS,
                          errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput("the form is not valid UTF-8 form data") from None
    return Form(pairs)
