"""GET /v1/server-instance/<id>/actions on fake host adapters (history and request ids, docs/api.md): every
action recorded with its requester, request id, result, message and time; errors of a
visible instance recorded, requests that name none not; visibility; after the delete;
pruned with the audit retention."""

import re

import pytest

from controller.audit import trail as audit, history
from controller.audit.trail import AnonymousFailures, Housekeeper
from tests.api.test_controller_api import (NOT_A_UUID, UNKNOWN, _host_dies_at, boot, err, ok,  # noqa: F401
                                           people)
from tests.fixtures.api import give_volume

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def actions(client, caller, instance_id):
    return client.simulate_get(f"/v1/server-instance/{instance_id}/actions", headers=caller.headers)


def task(client, caller, instance_id, what, request_id, **more):
    return client.simulate_put(f"/v1/server-instance/{instance_id}", json={"task": {"what": what, **more}},
                               headers={**caller.headers, "X-Request-Id": request_id})


@pytest.fixture
def made(client, people, catalog):
    """The owner's instance, created under the request id "create-1"."""
    give_volume(client, people["owner"])
    r = client.simulate_post("/v1/server-instance", headers={**people["owner"].headers, "X-Request-Id": "create-1"},
                             json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]})
    assert r.headers["X-Request-Id"] == "create-1"
    return ok(r, 201)[0]


def test_each_action_is_recorded_with_requester_request_id_result_and_time(client, cctx, people, made):
    owner, admin = people["owner"], people["admin"]
    managed_uuid = people["accounts"]["managed"]["uuid"]
    sent = [("power-off", "off.1", {}), ("power-on", "on-1", {}), ("reboot", "Reboot_1", {}),
            ("modify-users", "users-1", {"how": "add", "users": [managed_uuid]})]
    for what, request_id, more in sent:
        r = task(client, owner, made["id"], what, request_id, **more)
        ok(r)
        assert r.headers["X-Request-Id"] == request_id
    r = client.simulate_delete(f"/v1/server-instance/{made['id']}", headers={**admin.headers, "X-Request-Id": "del"})
    ok(r)
    got = ok(actions(client, owner, made["id"]))  # the owner still reads it after the delete
    # The fake's guests obey the power button at once (issue 25: the message says so).
    obeyed = "obeyed: the guest shut down when asked (ACPI power button) within 0 s"
    assert [(a["action"], a["requester"], a["request-id"], a["result"], a["message"]) for a in got] == [
        ("create", owner.id, "create-1", "success", ""),
        ("power-off", owner.id, "off.1", "success", obeyed),
        ("power-on", owner.id, "on-1", "success", ""),
        ("reboot", owner.id, "Reboot_1", "success", obeyed + ", then started again"),
        ("modify-users", owner.id, "users-1", "success", ""),
        ("delete", admin.id, "del", "success", ""),
    ]
    assert all(set(a) == {"action", "requester", "request-id", "result", "message", "time"} for a in got)
    times = [a["time"] for a in got]
    assert all(RFC3339.match(t) for t in times) and times == sorted(times)
    assert cctx.store.all_instances() == []  # deleted, history kept


def test_a_reboot_refused_by_the_state_is_recorded_as_an_error_with_its_message(client, people, made):
    owner = people["owner"]
    ok(task(client, owner, made["id"], "power-off", "off"))
    r = task(client, owner, made["id"], "reboot", "refused-reboot")
    message = err(r, 409)
    last = ok(actions(client, owner, made["id"]))[-1]
    assert last == {"action": "reboot", "requester": owner.id, "request-id": "refused-reboot", "result": "error",
                    "message": message, "time": last["time"]}
    assert r.headers["X-Request-Id"] == "refused-reboot"


def test_a_request_refused_before_it_names_a_visible_instance_is_not_recorded(client, people, made):
    owner, stranger = people["owner"], people["stranger"]
    before = ok(actions(client, owner, made["id"]))
    err(task(client, stranger, made["id"], "reboot", "stranger"), 404)
    err(client.simulate_delete(f"/v1/server-instance/{made['id']}", headers=stranger.headers), 404)
    err(task(client, owner, made["id"], "shout", "bad-body"), 400)  # refused by the schema, before the service
    assert ok(actions(client, owner, made["id"])) == before
    assert [a["action"] for a in before] == ["create"]


def test_the_history_is_visible_to_whoever_sees_the_instance_and_404_to_others(client, people, catalog):
    owner, managed, admin, stranger = people["owner"], people["managed"], people["admin"], people["stranger"]
    give_volume(client, managed)
    [inst] = ok(boot(client, managed, catalog), 201)
    path_of = f"/v1/server-instance/{inst['id']}"
    for who in (managed, owner, admin):  # the owner, the owner's owner, a superuser
        assert [a["action"] for a in ok(actions(client, who, inst["id"]))] == ["create"]
    err(actions(client, stranger, inst["id"]), 404)
    ok(client.simulate_delete(path_of, headers=owner.headers))
    for who in (managed, owner, admin):  # kept after the delete, for the same people
        got = ok(actions(client, who, inst["id"]))
        assert [(a["action"], a["requester"]) for a in got] == [("create", managed.id), ("delete", owner.id)]
    err(actions(client, stranger, inst["id"]), 404)
    for unknown in (UNKNOWN, NOT_A_UUID):
        err(actions(client, admin, unknown), 404)


def test_a_visible_instance_without_history_answers_an_empty_list(client, cctx, people, made):
    with cctx.store.write() as conn:  # as an instance made before the history existed
        conn.execute("DELETE FROM instance_actions")
    assert ok(actions(client, people["owner"], made["id"])) == []
    err(actions(client, people["stranger"], made["id"]), 404)


def test_the_history_is_pruned_with_the_audit_retention(client, cctx, people, made, monkeypatch):
    owner = people["owner"]
    monkeypatch.setattr(history, "utc_now", lambda: "2020-01-01T00:00:00Z")
    ok(task(client, owner, made["id"], "power-off", "long-ago"))
    monkeypatch.undo()
    assert [a["request-id"] for a in ok(actions(client, owner, made["id"]))] == ["create-1", "long-ago"]
    keeper = Housekeeper(store=cctx.store, anonymous=AnonymousFailures(cctx.store, interval_seconds=60),
                         retention_days=30)
    keeper.run_once()
    assert [a["request-id"] for a in ok(actions(client, owner, made["id"]))] == ["create-1"]
    assert audit.prune_before(cctx.store, "2099-01-01T00:00:00Z") > 0
    assert ok(actions(client, owner, made["id"])) == []  # still visible, nothing left


@pytest.mark.parametrize("when", ["mid-spawn", "after-spawn"])
def test_a_create_that_leaves_its_row_for_reconcile_is_recorded_as_an_error(client, cctx, adapters, people,
                                                                           catalog, monkeypatch, when):
    from controller.errors import HostUnreachable

    owner = people["owner"]
    give_volume(client, owner)
    hv = adapters.hypervisor
    if when == "mid-spawn":
        _host_dies_at(monkeypatch, hv, "start")  # what was made cannot be removed: CleanupFailed
    else:
        def dies(instance_id):  # the status read after the spawn; then the undo cannot reach the host
            hv.dead = True
            raise HostUnreachable("the host stopped answering")

        monkeypatch.setattr(hv, "status", dies)
    r = client.simulate_post("/v1/server-instance", headers={**owner.headers, "X-Request-Id": "failed-create"},
                             json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]})
    message = err(r, 503)
    [row] = cctx.store.all_instances()  # kept, hidden, for reconcile
    [entry] = cctx.store.list_instance_actions(row["id"], visible_to=None)
    assert (entry["action"], entry["requester"], entry["request_id"], entry["result"], entry["message"]) == (
        "create", owner.id, "failed-create", "error", message)


def test_a_create_that_leaves_nothing_is_not_recorded(client, cctx, adapters, people, catalog):
    from controller.errors import HostError

    owner = people["owner"]
    give_volume(client, owner)
    adapters.hypervisor.fail_on["define"] = HostError("define failed")
    err(boot(client, owner, catalog), 503)
    assert cctx.store.all_instances() == []
    assert cctx.store.conn.execute("SELECT COUNT(*) FROM instance_actions").fetchone()[0] == 0


def test_record_refuses_an_unknown_action_or_result(cctx):
    row = {"id": UNKNOWN, "owner_id": UNKNOWN}
    with pytest.raises(ValueError):
        history.record(cctx, row, "explode", requester=None)
    with pytest.raises(ValueError):
        history.record(cctx, row, "move", requester=None, result="maybe")
    history.record(cctx, row, "move", requester=None, message="moved from host a to host b", request_id="r-1")
    [entry] = cctx.store.list_instance_actions(UNKNOWN, visible_to=None)
    assert (entry["action"], entry["requester"], entry["request_id"], entry["result"]) == ("move", None, "r-1",
                                                                                         "success")


# -- a bounded history (issue 27, item 5) -------------------------------------------------------


def test_a_modify_users_that_changes_nothing_is_not_recorded(client, cctx, people, made):
    owner = people["owner"]
    managed_uuid = people["accounts"]["managed"]["uuid"]
    ok(task(client, owner, made["id"], "modify-users", "grant", how="add", users=[managed_uuid]))
    # Access the user already has, and removing it twice: 200 each, nothing written.
    for n in range(5):
        ok(task(client, owner, made["id"], "modify-users", f"again-{n}", how="add", users=[managed_uuid]))
    ok(task(client, owner, made["id"], "modify-users", "drop", how="delete", users=[managed_uuid]))
    ok(task(client, owner, made["id"], "modify-users", "drop-again", how="delete", users=[managed_uuid]))
    got = ok(actions(client, owner, made["id"]))
    assert [(a["action"], a["request-id"]) for a in got] == [("create", "create-1"), ("modify-users", "grant"),
                                                              ("modify-users", "drop")]
    assert cctx.store.conn.execute("SELECT COUNT(*) FROM instance_actions").fetchone()[0] == 3


def test_repeated_power_tasks_and_refusals_are_coalesced_into_one_entry(client, cctx, people, made):
    owner = people["owner"]
    for n in range(20):
        ok(task(client, owner, made["id"], "power-on", f"on-{n}"))  # running already: changes nothing
    ok(task(client, owner, made["id"], "power-off", "off"))
    for n in range(20):
        err(task(client, owner, made["id"], "reboot", f"reboot-{n}"), 409)
    got = ok(actions(client, owner, made["id"]))
    assert [(a["action"], a["request-id"], a["result"]) for a in got] == [
        ("create", "create-1", "success"), ("power-on", "on-19", "success"), ("power-off", "off", "success"),
        ("reboot", "reboot-19", "error")]


def test_each_instance_keeps_its_newest_entries_and_limit_pages_them(client, cctx, people, made, monkeypatch):
    owner = people["owner"]
    monkeypatch.setattr(history, "KEPT_PER_INSTANCE", 5)
    for n in range(4):  # alternate: nothing to coalesce
        ok(task(client, owner, made["id"], "power-off", f"off-{n}"))
        ok(task(client, owner, made["id"], "power-on", f"on-{n}"))
    got = ok(actions(client, owner, made["id"]))
    assert [a["request-id"] for a in got] == ["on-1", "off-2", "on-2", "off-3", "on-3"]
    assert cctx.store.conn.execute("SELECT COUNT(*) FROM instance_actions").fetchone()[0] == 5
    # `limit`: the most recent ones, oldest first.
    r = client.simulate_get(f"/v1/server-instance/{made['id']}/actions", headers=owner.headers,
                            params={"limit": "2"})
    assert [a["request-id"] for a in ok(r)] == ["off-3", "on-3"]


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "x", "1.5", ""])
def test_a_bad_limit_is_400(client, people, made, limit):
    r = client.simulate_get(f"/v1/server-instance/{made['id']}/actions", headers=people["owner"].headers,
                            query_string=f"limit={limit}")
    assert "limit must be an integer from 1 to 1000" in err(r, 400)


def test_the_audit_retention_has_a_finite_default(cctx):
    from controller.config import config_from_dict, sandbox_values

    assert 0 < config_from_dict(sandbox_values("/tmp/unused")).audit.retention_days <= 400


# -- pages of the history: a cursor, streamed (issue 27, item 5) ----------------------------------


def _write_entries(cctx, instance: dict, count: int, prefix: str, *, message: str = "") -> None:
    """`count` entries written as the service writes them, untrimmed (the pages do not depend on
    the per-instance bound): request ids prefix-0, prefix-1, ..."""
    for n in range(count):
        cctx.store.insert_instance_action({
            "instance_id": instance["id"], "owner_id": instance["cloudauth-id"], "action": "reboot",
            "requester": None, "request_id": f"{prefix}-{n}", "result": "success", "message": message,
            "at_utc": "2026-11-27T10:00:00Z"})


def _next_page(r, instance_id: str) -> tuple[str, str] | None:
    """The answer's Link rel=next as (limit, before), None without one."""
    from urllib.parse import parse_qs, urlsplit

    from requests.utils import parse_header_links

    link = r.headers.get("link")
    if link is None:
        return None
    [found] = parse_header_links(link)
    assert found["rel"] == "next", link
    url = urlsplit(found["url"])
    assert url.path == f"/v1/server-instance/{instance_id}/actions" and not url.netloc, link
    query = parse_qs(url.query, strict_parsing=True)
    assert set(query) == {"limit", "before"}, link
    return query["limit"][0], query["before"][0]


def test_pages_follow_the_cursor_over_2500_entries_each_once_in_order_while_more_are_written(
        client, cctx, people, made, monkeypatch):
    owner = people["owner"]
    monkeypatch.setattr(history, "KEPT_PER_INSTANCE", 10_000)  # the tasks below trim nothing
    _write_entries(cctx, made, 2500, "old")
    expected = ["create-1"] + [f"old-{n}" for n in range(2500)]
    path = f"/v1/server-instance/{made['id']}/actions"
    r = client.simulate_get(path, headers=owner.headers)  # the default page is the largest: 1000
    pages, written = [], []
    while True:
        pages.append([a["request-id"] for a in ok(r)])
        following = _next_page(r, made["id"])
        if following is None:
            break
        # Entries written between two pages are newer than any page still to come: they
        # never shift one (the cursor is the entry's id, not an offset).
        what = ("power-off", "power-on")[len(written) % 2]
        ok(task(client, owner, made["id"], what, f"new-{len(written)}"))
        written.append(f"new-{len(written)}")
        limit, before = following
        assert limit == "1000"
        r = client.simulate_get(path, headers=owner.headers, params={"limit": limit, "before": before})
    assert [len(p) for p in pages] == [1000, 1000, 501]
    assert [rid for page in reversed(pages) for rid in page] == expected  # each once, oldest first
    assert written == ["new-0", "new-1"]
    latest = client.simulate_get(path, headers=owner.headers, params={"limit": "1000"})
    assert [a["request-id"] for a in ok(latest)] == expected[-998:] + written
    assert _next_page(latest, made["id"]) is not None


def test_the_last_page_has_no_next_and_pages_stay_readable_after_the_delete(client, cctx, people, made):
    owner, stranger = people["owner"], people["stranger"]
    _write_entries(cctx, made, 8, "e")  # ten entries with the create and the delete: two pages of five
    ok(client.simulate_delete(f"/v1/server-instance/{made['id']}", headers={**owner.headers, "X-Request-Id": "del"}))
    path = f"/v1/server-instance/{made['id']}/actions"
    first = client.simulate_get(path, headers=owner.headers, params={"limit": "5"})
    assert [a["request-id"] for a in ok(first)] == ["e-4", "e-5", "e-6", "e-7", "del"]
    limit, before = _next_page(first, made["id"])
    second = client.simulate_get(path, headers=owner.headers, params={"limit": limit, "before": before})
    assert [a["request-id"] for a in ok(second)] == ["create-1", "e-0", "e-1", "e-2", "e-3"]
    assert _next_page(second, made["id"]) is None
    # A cursor below the oldest entry: an empty page of a history one sees; nothing of one
    # one does not see.
    oldest = history.cursor_of(1)
    third = client.simulate_get(path, headers=owner.headers, params={"before": oldest})
    assert ok(third) == [] and _next_page(third, made["id"]) is None
    err(client.simulate_get(path, headers=stranger.headers, params={"limit": limit, "before": before}), 404)
    err(client.simulate_get(path, headers=stranger.headers, params={"before": oldest}), 404)


@pytest.mark.parametrize("before", [
    "", "x!", "Zm9v", "A" * 41, "YmVmb3JlOjE=", "YmVmb3JlOjA", "YmVmb3JlOi0x", "YmVmb3JlOjEg",
    "YmVmb3JlOjEyMzQ1Njc4OTAxMjM0NTY3ODk", "%00", "before:1",
])
def test_a_bad_cursor_is_400_in_the_envelope(client, people, made, before):
    # Not base64, not ours ("foo"), too long, padded, "before:0", "before:-1", "before:1 ",
    # an id of 19 digits, a NUL, the text itself.
    r = client.simulate_get(f"/v1/server-instance/{made['id']}/actions", headers=people["owner"].headers,
                            query_string=f"before={before}")
    assert "before must be a cursor an earlier answer gave" in err(r, 400)
    r = client.simulate_get(f"/v1/server-instance/{made['id']}/actions", headers=people["owner"].headers,
                            query_string=f"before={history.cursor_of(5)}&before={history.cursor_of(6)}")
    assert "before may be given once" in err(r, 400)


def test_a_page_is_read_and_sent_a_chunk_at_a_time(cctx, people, made):
    """A full page of the longest entries (1000 of 1000-character messages, about 1.1 MB) is
    streamed: the body comes in pieces of at most one chunk of entries each, and serving it
    holds a few chunks of it in Python's memory, never the page."""
    import json
    import tracemalloc

    from falcon import testing

    from api.app import create_app

    _write_entries(cctx, made, history.MAX_LIMIT, "long", message="m" * 1000)
    app = create_app(cctx)
    environ = testing.create_environ(path=f"/v1/server-instance/{made['id']}/actions",
                                     headers=people["owner"].headers)
    # Falcon compiles its router at the first request: not the page's memory, so done before.
    app(testing.create_environ(path="/v1/limits", headers=people["owner"].headers), lambda *a, **k: None)
    started = []
    tracemalloc.start()
    try:
        pieces = app(environ, lambda status, headers, exc_info=None: started.append((status, dict(headers))))
        sizes, total, tail = [], 0, b""
        for piece in pieces:
            sizes.append(len(piece))
            total += len(piece)
            tail = (tail + piece)[-200:]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    status, headers = started[0]
    assert status.startswith("200") and "content-length" not in {k.lower() for k in headers}
    entry = len(json.dumps({"action": "reboot", "requester": None, "request-id": "long-999", "result": "success",
                            "message": "m" * 1000, "time": "2026-11-27T10:00:00Z"}, separators=(",", ":")))
    chunk = history.PER_CHUNK * (entry + 1)  # one chunk of entries, with their commas
    assert total > history.MAX_LIMIT * 1000 and tail.endswith(b'], "msg": "", "success": true}')
    assert len(sizes) > history.MAX_LIMIT // history.PER_CHUNK and max(sizes) <= chunk + 20
    # Two chunks read ahead, or one as text and as bytes while the last piece is sent (about
    # four chunks): what the page's size does not change (ten chunks here; built whole, about
    # three times the body).
    assert total > 9 * chunk and peak < 5 * chunk, (peak, chunk, total)
