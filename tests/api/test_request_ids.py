"""X-Request-Id (history and request ids, docs/api.md): on every answer of both interfaces, errors and
unauthenticated paths included; a client's safe id kept, any other replaced; the same id
on the audit row, the log lines and the instance history."""

import logging
import re

import pytest

from controller.audit import request_ids
from tests.api.test_controller_api import UNKNOWN, err, ok, people  # noqa: F401 (fixture)

SAFE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# (method, path, needs auth): both interfaces, successes and errors, public paths too.
REQUESTS = [
    ("GET", "/healthz", False),
    ("GET", "/v1/openapi.json", False),
    ("GET", "/v1/server-instance", True),  # 200
    ("GET", "/v1/server-instance", False),  # 401
    ("GET", f"/v1/server-instance/{UNKNOWN}", True),  # 404
    ("GET", "/v1/no-such-path", True),  # 404 from routing
    ("PUT", "/v1/server-image", True),  # 405
    ("GET", "/v1/user/list", True),  # user interface: 200
    ("POST", "/v1/user/list", False),  # 401
    ("POST", "/v1/auth/token", False),  # 400: no credentials
]


def _send(client, method, path, caller, auth, request_id=None):
    headers = dict(caller.headers) if auth else {}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    return client.simulate_request(method, path, headers=headers)


@pytest.mark.parametrize("method,path,auth", REQUESTS)
def test_every_answer_carries_a_request_id_and_keeps_a_safe_one(client, people, method, path, auth):
    caller = people["owner"]
    fresh = _send(client, method, path, caller, auth).headers["X-Request-Id"]
    again = _send(client, method, path, caller, auth).headers["X-Request-Id"]
    assert SAFE.match(fresh) and SAFE.match(again) and fresh != again
    for mine in ("a", "Trace-42_x.y", "7" * 64):
        assert _send(client, method, path, caller, auth, mine).headers["X-Request-Id"] == mine


@pytest.mark.parametrize("unsafe", ["x" * 65, "two words", "semi;colon", "../etc", "a/b", "caf\u00e9", ""])
@pytest.mark.parametrize("method,path,auth", [REQUESTS[2], REQUESTS[3], REQUESTS[5], REQUESTS[8]])
def test_an_unsafe_or_too_long_request_id_is_replaced(client, people, method, path, auth, unsafe):
    got = _send(client, method, path, people["owner"], auth, unsafe).headers["X-Request-Id"]
    assert got != unsafe and SAFE.match(got)


def test_accept_keeps_only_safe_tokens():
    assert request_ids.accept("abc-1.2_3") == "abc-1.2_3"
    for bad in (None, "", "a\n", "a b", "x" * 65, "\u00e9"):
        got = request_ids.accept(bad)
        assert got != bad and SAFE.match(got)


def test_the_audit_row_and_the_log_lines_carry_the_request_id(client, cctx, people, caplog):
    factory = logging.getLogRecordFactory()
    request_ids.stamp_log_records()
    try:
        with caplog.at_level(logging.INFO, logger="cloud_controller.access"):
            r = client.simulate_post("/v1/storage-volume", json={"volume-size": 1, "volume-type": {"visibility": "cluster"}},
                                     headers={**people["owner"].headers, "X-Request-Id": "audit-me"})
            outside = logging.getLogger("x").makeRecord("x", logging.INFO, "f", 1, "m", (), None)
    finally:
        logging.setLogRecordFactory(factory)
    ok(r, 201)
    [row] = [a for a in cctx.store.list_audit() if a["action"] == "POST /v1/storage-volume"]
    assert (row["request_id"], row["result"], row["actor"]) == ("audit-me", "201", people["owner"].id)
    [line] = [rec for rec in caplog.records if rec.name == "cloud_controller.access"]
    assert line.request_id == "audit-me" and "POST /v1/storage-volume 201" in line.getMessage()
    assert outside.request_id == "-"  # the id is unbound once the answer is made
    assert request_ids.current() is None


def test_a_refused_request_has_its_id_on_the_audit_row_too(client, cctx, people):
    r = client.simulate_delete(f"/v1/server-instance/{UNKNOWN}",
                               headers={**people["owner"].headers, "X-Request-Id": "refused-1"})
    err(r, 404)
    assert r.headers["X-Request-Id"] == "refused-1"
    [row] = [a for a in cctx.store.list_audit() if a["action"] == "DELETE /v1/server-instance/{id}"]
    assert (row["request_id"], row["result"]) == ("refused-1", "404")
