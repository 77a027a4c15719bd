"""`-f json|yaml|csv|value` (and `-c FIELD` to pick fields), as `openstack -f` users expect.

Every format prints the API's own document (its field names and values, as --json does):
`yaml` the same data in YAML's block style; `csv` one row per object with a header line of
field names; `value` the values alone, separated by spaces, one line per object (for
shell scripts: `cloud server list -f value -c id`). A nested value (a list, an object) is
one cell in JSON. Only `table` (the default) escapes control characters: the others are
data, kept exact like --json.
"""

import csv
import io
import json
import re

FORMATS = ("table", "json", "yaml", "csv", "value")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _rows(document) -> list[dict]:
    if isinstance(document, list):
        return [d if isinstance(d, dict) else {"value": d} for d in document]
    return [document if isinstance(document, dict) else {"value": document}]


def _pick(rows: list[dict], columns: tuple[str, ...]) -> tuple[list[str], list[list]]:
    keys: list[str] = list(columns)
    if not keys:
        for row in rows:
            keys += [k for k in row if k not in keys]
    unknown = [c for c in columns if rows and all(c not in r for r in rows)]
    if unknown:
        raise ValueError(f"no field {unknown[0]!r}; the fields are: {', '.join(k for k in rows[0])}")
    return keys, [[row.get(k) for k in keys] for row in rows]


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _scalar_yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _key(k) -> str:
    return k if isinstance(k, str) and _PLAIN.fullmatch(k) else _scalar_yaml(k)


def _yaml(value, indent: int = 0) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{_key(k)}:")
                out += _yaml(v, indent + 2)
            else:
                out.append(f"{pad}{_key(k)}: {_yaml(v)[0].strip()}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for v in value:
            inner = _yaml(v, indent + 2)
            out.append(f"{pad}- {inner[0].strip()}")
            out += inner[1:]
        return out
    return [pad + _scalar_yaml(value)]


def render(document, fmt: str, columns: tuple[str, ...] = ()) -> str:
    """The document in `fmt` (json, yaml, csv or value), only `columns` when given."""
    if columns:
        keys, values = _pick(_rows(document), columns)
        picked = [dict(zip(keys, v)) for v in values]
        document = picked if isinstance(document, list) else picked[0]
    if fmt == "json":
        return json.dumps(document, indent=1)
    if fmt == "yaml":
        return "\n".join(_yaml(document))
    keys, values = _pick(_rows(document), ())
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(keys)
        writer.writerows([[_cell(v) for v in row] for row in values])
        return buf.getvalue().rstrip("\n")
    return "\n".join(" ".join(_cell(v) for v in row) for row in values)
