"""The portal at cloud auth for several clusters, below the browser: a session's API token
(made with it, ended with it, heard of as a revocation by every cluster), and a cluster read
from its controller's API (controller/portal/remote_cluster.py) against a stand-in HTTP
server on the loopback: answers mapped to the portal's errors, every page bounded by
`[cloud_auth] timeout_seconds`, the overview's unreachable card beside a cluster that answers."""

import http.server
import json
import threading
import time

import pytest

from controller.auth.tokens import authenticate
from controller.cloud_auth import accounts, registry
from controller.cloud_auth.callers import ControllerCaller
from controller.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from controller.portal import clusters, sessions
from controller.portal.remote_cluster import ClusterUnreachable, RemoteCluster
from controller.security.crypto import token_hash
from tests.fixtures.api import config_values_for, make_caller, new_context


@pytest.fixture
def auth(tmp_path):
    values = config_values_for(tmp_path)
    values["cloud_auth"] = {"timeout_seconds": "0.5"}
    context = new_context(values)
    yield context
    context.store.close()


class StandIn:
    """A controller's API as the test says: `answers[(method, path)] = (status, body)`; a
    path in `hang` is answered after `hang_seconds`. Requests are recorded with their headers."""

    def __init__(self):
        self.answers, self.hang, self.hang_seconds, self.seen = {}, set(), 3.0, []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                path = self.path.split("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stand_in.seen.append((self.command, self.path, dict(self.headers), body))
                if path in stand_in.hang:
                    time.sleep(stand_in.hang_seconds)
                status, answer = stand_in.answers.get((self.command, path), (404, {"data": [], "msg": "no such"}))
                raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:
                    pass  # the client gave up

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def _session(ctx, email="alice@example.org"):
    alice = make_caller(ctx, email)
    session_id = sessions.start(ctx, alice.id, now=int(time.time()))
    return alice, session_id, sessions.find(ctx, session_id, now=int(time.time()))


# -- the session's token ---------------------------------------------------------------------
def test_a_session_holds_an_api_token_that_ends_with_it(auth):
    alice, session_id, session = _session(auth)
    token = sessions.token_of(session_id)
    assert session.api_token == token and len(token) == 43 and token not in repr(session)
    assert authenticate(auth, token=token, user_id=alice.id).id == alice.id
    # Only its hash is stored, as for any token; the session row names the hash.
    assert token not in json.dumps(auth.store._all("SELECT * FROM tokens")) + json.dumps(
        auth.store._all("SELECT * FROM portal_sessions"))
    first, last = auth.store.feed_bounds()
    sessions.end(auth, session)
    with pytest.raises(Unauthenticated):
        authenticate(auth, token=token, user_id=alice.id)
    # Every cluster hears of it: a revocation in the changes feed.
    assert auth.store.feed_changes(last, 100)["tokens"] == [token_hash(token)]


def test_an_idle_session_and_one_purged_at_another_login_take_their_tokens(auth):
    alice, first_id, _ = _session(auth)
    idle = auth.config.portal.session_idle_seconds
    later = int(time.time()) + idle + 1
    assert sessions.find(auth, first_id, now=later) is None  # idle: ended on its next use
    with pytest.raises(Unauthenticated):
        authenticate(auth, token=sessions.token_of(first_id), user_id=alice.id)
    second_id = sessions.start(auth, alice.id, now=int(time.time()))
    sessions.start(auth, alice.id, now=later)  # purges the idle second session
    with pytest.raises(Unauthenticated):
        authenticate(auth, token=sessions.token_of(second_id), user_id=alice.id)


def test_a_password_set_ends_the_sessions_token(auth):
    alice, session_id, _ = _session(auth)
    auth.store.set_password_hash(alice.id, "x")
    assert sessions.find(auth, session_id, now=int(time.time())) is None
    with pytest.raises(Unauthenticated):
        authenticate(auth, token=sessions.token_of(session_id), user_id=alice.id)


# -- a cluster read from its API ---------------------------------------------------------------
def _remote(auth, stand_in, session):
    entry = registry.add_controller(auth, controller_id=2, name="hpc2", url=stand_in.url)
    return RemoteCluster(auth, {"id": 2, "name": "hpc2", "url": entry["url"]}, token=session.api_token,
                         requester=session.requester)


def test_pages_are_read_with_the_users_own_token_and_named_from_cloud_auth(auth, stand_in):
    alice, _, session = _session(auth)
    bob = make_caller(auth, "bob@example.org", owner=alice)
    remote = _remote(auth, stand_in, session)
    accounts.register(auth, ControllerCaller(2, "hpc2"), "2", "bob", user_id=bob.id,
                      uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c31", uid=20001)
    server = {"id": "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c40", "cloudauth-id": alice.id, "status": "running",
              "users": ["6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c31"], "server-image": "img-1", "server-flavor": "1",
              "creation-date": "2026-12-02T10:00:00Z", "hostname": "vm-1", "private-ip": "10.0.0.2"}
    stand_in.answers[("GET", "/v1/server-instance")] = (200, {"data": [server], "msg": "", "success": True})
    stand_in.answers[("GET", "/v1/server-image")] = (200, {"data": [{"id": "img-1", "name": "Debian 12"}]})
    stand_in.answers[("GET", "/v1/server-flavor")] = (200, {"data": [{"id": 1, "name": "small"}]})
    shown = remote.servers(session.requester)["servers"]
    assert [(s["hostname"], s["image"], s["flavor"], s["users"]) for s in shown] == \
        [("vm-1", "Debian 12", "small", [{"uuid": "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c31", "username": "bob"}])]
    _, _, headers, _ = stand_in.seen[0]
    assert (headers["X-Auth-Token"], headers["X-Auth-Cloudauth-Id"]) == (session.api_token, alice.id)
    # Whom alice may grant a server on hpc2 to: bob, whose account there cloud auth lists.
    assert [a["username"] for a in remote.grantable(session.requester)] == ["bob"]


@pytest.mark.parametrize("status, error", [(400, InvalidInput), (404, NotFound), (409, Conflict)])
def test_a_refusal_is_shown_as_the_controller_said_it(auth, stand_in, status, error):
    _, _, session = _session(auth)
    remote = _remote(auth, stand_in, session)
    stand_in.answers[("POST", "/v1/server-instance")] = (status, {"data": [], "msg": "the reason", "success": False})
    with pytest.raises(error) as raised:
        remote.create_server(session.requester, {"server-image": "x", "server-flavor": "y", "users": []})
    assert raised.value.message == "the reason"
    assert stand_in.seen[-1][3] == {"server-image": "x", "server-flavor": "y", "users": []}


SERVER_ID = "6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c40"


def _instance(owner: str, **lease) -> dict:
    return {"id": SERVER_ID, "cloudauth-id": owner, "status": "shutoff", "users": [], "server-image": "img-1",
            "server-flavor": "1", "creation-date": "2026-12-02T10:00:00Z", "hostname": "vm-1", **lease}


def test_a_lease_is_read_from_the_controller_and_renewed_through_its_api(auth, stand_in):
    alice, _, session = _session(auth)
    remote = _remote(auth, stand_in, session)
    expired = _instance(alice.id, **{"expires-at": "2026-12-01T10:00:00Z", "lease": "expired"})
    stand_in.answers[("GET", "/v1/server-instance")] = (200, {"data": [expired]})
    stand_in.answers[("GET", "/v1/server-image")] = (200, {"data": [{"id": "img-1", "name": "Debian 12"}]})
    stand_in.answers[("GET", "/v1/server-flavor")] = (200, {"data": [{"id": 1, "name": "small"}]})
    stand_in.answers[("GET", "/v1/storage-volume")] = (200, {"data": []})
    stand_in.answers[("GET", "/v1/limits")] = (200, {"data": []})
    shown = remote.servers(session.requester)["servers"][0]
    assert (shown["lease"], shown["expires_at"]) == ("expired", "2026-12-01T10:00:00Z")
    assert remote.overview(session.requester)["ending"] == [
        {"id": SERVER_ID, "hostname": "vm-1", "expires_at": "2026-12-01T10:00:00Z", "lease": "expired"}]
    # A controller from before leases: no lease shown, none listed.
    stand_in.answers[("GET", "/v1/server-instance")] = (200, {"data": [_instance(alice.id)]})
    assert remote.servers(session.requester)["servers"][0]["lease"] == "none"
    assert remote.overview(session.requester)["ending"] == []
    # The renewal: POST .../lease with the hours, or an empty body for the default.
    renewed = _instance(alice.id, **{"expires-at": "2026-12-04T10:00:00Z", "lease": "active"})
    path = f"/v1/server-instance/{SERVER_ID}/lease"
    stand_in.answers[("POST", path)] = (200, {"data": [renewed], "msg": "", "success": True})
    assert remote.renew_lease(session.requester, SERVER_ID, 48.5) == renewed
    assert stand_in.seen[-1][:2] == ("POST", path) and stand_in.seen[-1][3] == {"hours": 48.5}
    assert stand_in.seen[-1][2]["X-Auth-Token"] == session.api_token
    remote.renew_lease(session.requester, SERVER_ID, None)
    assert stand_in.seen[-1][3] == {}
    # Its refusals as the controller said them.
    for status, error in ((400, InvalidInput), (409, Conflict), (404, NotFound)):
        stand_in.answers[("POST", path)] = (status, {"data": [], "msg": f"refused {status}", "success": False})
        with pytest.raises(error, match=f"refused {status}"):
            remote.renew_lease(session.requester, SERVER_ID, 1000)


@pytest.mark.parametrize("answer", [(401, {"data": [], "msg": "invalid token"}), (500, b"<html>oops</html>"),
                                    (200, b"not json")])
def test_an_answer_no_api_gives_is_unreachable_503(auth, stand_in, answer):
    _, _, session = _session(auth)
    remote = _remote(auth, stand_in, session)
    stand_in.answers[("GET", "/v1/group")] = answer
    with pytest.raises(ClusterUnreachable) as raised:
        remote.groups_page(session.requester)
    assert "hpc2" in raised.value.message and raised.value.retry_after >= 1


def test_a_hung_or_absent_controller_costs_a_page_the_timeout_at_most(auth, stand_in):
    _, _, session = _session(auth)
    remote = _remote(auth, stand_in, session)
    stand_in.hang.add("/v1/server-instance")
    started = time.monotonic()
    with pytest.raises(ClusterUnreachable) as raised:
        remote.servers(session.requester)
    assert time.monotonic() - started < 0.5 + 0.3
    assert "did not answer within 0.5 s" in raised.value.message
    # The page's calls share the deadline: one more call on the same page is refused at once.
    started = time.monotonic()
    with pytest.raises(ClusterUnreachable):
        remote.groups_page(session.requester)
    assert time.monotonic() - started < 0.1
    stand_in.close()
    with pytest.raises(ClusterUnreachable):
        RemoteCluster(auth, {"id": 2, "name": "hpc2", "url": stand_in.url}, token=session.api_token,
                      requester=session.requester).groups_page(session.requester)


def test_the_overview_shows_an_unreachable_cluster_beside_one_that_answers(auth, stand_in, tmp_path):
    alice, _, session = _session(auth)
    registry.add_controller(auth, controller_id=2, name="hpc2", url=stand_in.url)
    healthy = StandIn()
    try:
        registry.add_controller(auth, controller_id=3, name="hpc3", url=healthy.url)
        healthy.answers[("GET", "/v1/server-instance")] = (200, {"data": [
            {"id": "i1", "cloudauth-id": alice.id, "status": "running", "users": []},
            {"id": "i2", "cloudauth-id": "someone-else", "status": "running", "users": []}]})
        healthy.answers[("GET", "/v1/storage-volume")] = (200, {"data": []})
        healthy.answers[("GET", "/v1/limits")] = (200, {"data": [{"cloudauth-id": alice.id,
                                                                  "instances": {"limit": 5, "used": 1}}]})
        stand_in.hang.update({"/v1/server-instance", "/v1/storage-volume", "/v1/limits"})
        started = time.monotonic()
        cards = clusters.overview_cards(auth, session)
        assert time.monotonic() - started < 0.5 + 1
    finally:
        healthy.close()
    by_id = {c["id"]: c for c in cards}
    # Cluster 1 is this process's own (the test config serves the controller interface).
    assert sorted(by_id) == [1, 2, 3] and by_id[1]["ok"]
    assert not by_id[2]["ok"] and "hpc2" in by_id[2]["error"]
    assert by_id[3]["ok"] and by_id[3]["by_status"] == [("running", 1)] and by_id[3]["total"] == 1
    assert by_id[3]["limits"] == [{"kind": "instances", "label": "Servers", "limit": 5, "used": 1}]


def test_a_cluster_not_registered_or_disabled_is_404(auth, stand_in):
    _, _, session = _session(auth)
    registry.add_controller(auth, controller_id=2, name="hpc2", url=stand_in.url)
    assert clusters.cluster(auth, session, "2").name == "hpc2"
    assert not clusters.cluster(auth, session, "1").remote  # this process's own
    registry.set_enabled(auth, 2, False)
    for cid in ("2", "3", "x" * 500):
        with pytest.raises(NotFound):
            clusters.cluster(auth, session, cid)
    assert clusters.navigation(auth) == []  # none besides its own: today's portal
