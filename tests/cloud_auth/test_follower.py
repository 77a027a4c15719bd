"""A controller's copy of cloud auth (controller/cloud_auth/follower.py) on two real
databases, cloud auth's service functions standing in for HTTP: tokens checked once and
cached, the race between an introspection in flight and a revocation, snapshots, the
offline grace, and no request thread waiting on a cloud auth known to be down."""

import threading
import time

import pytest

from controller.auth.tokens import authenticate
from controller.cloud_auth import feed, introspection, registry
from controller.cloud_auth.callers import ControllerCaller
from controller.cloud_auth.client import CloudAuthDown
from controller.cloud_auth.follower import Follower
from controller.errors import ServerBusy, Unauthenticated
from controller.security.crypto import token_hash
from tests.fixtures.api import config_values_for, make_caller, new_context


class InProcessClient:
    """Cloud auth's own functions in place of HTTP; `down` makes every call fail as a
    refused connection does, `before_answer` runs between an introspection's read and its answer."""

    def __init__(self, auth_ctx, caller):
        self.auth, self.caller, self.url = auth_ctx, caller, "http://cloud-auth.invalid"
        self.down, self.before_answer, self.introspections = False, None, 0

    def _up(self):
        if self.down:
            raise CloudAuthDown("cloud auth at http://cloud-auth.invalid did not answer: ConnectionError")

    def introspect(self, token, userid):
        self._up()
        self.introspections += 1
        answer = introspection.introspect(self.auth, self.caller, token=token, userid=userid)
        if self.before_answer:
            self.before_answer()
        return answer

    def changes(self, *, since, epoch, after=None):
        self._up()
        return feed.changes(self.auth, self.caller, since=str(since), epoch=epoch, after=after)


@pytest.fixture
def pair(tmp_path):
    auth = new_context(config_values_for(tmp_path / "auth"))
    registry.add_controller(auth, controller_id=2, name="hpc2", url="https://hpc2.example.org")
    values = config_values_for(tmp_path / "hpc2")
    secret = tmp_path / "secret"
    secret.write_text("x")
    values["controller"]["id"] = 2
    values["server"]["interfaces"] = "controller"
    values["cloud_auth"] = {"url": "http://cloud-auth.invalid", "secret_file": str(secret), "poll_seconds": "1",
                            "timeout_seconds": "1", "offline_grace_seconds": "300"}
    controller = new_context(values)
    client = InProcessClient(auth, ControllerCaller(2, "hpc2"))
    controller.cloud_auth = Follower(controller, client)
    yield auth, controller, client
    auth.store.close()
    controller.store.close()


def test_a_token_is_checked_once_then_cached(pair):
    auth, controller, client = pair
    alice = make_caller(auth, "alice@example.org")
    controller.cloud_auth.poll()
    requester = authenticate(controller, token=alice.token, user_id=alice.id)
    assert requester.id == alice.id and client.introspections == 1
    for _ in range(3):
        authenticate(controller, token=alice.token, user_id=alice.id)
    assert client.introspections == 1
    # Only the hash is kept here.
    rows = controller.store._all("SELECT * FROM tokens")
    assert [r["token_hash"] for r in rows] == [token_hash(alice.token)] and alice.token not in str(rows)
    # Another user's id with it: 401, from the cache.
    bob = make_caller(auth, "bob@example.org")
    controller.cloud_auth.poll()
    with pytest.raises(Unauthenticated):
        authenticate(controller, token=alice.token, user_id=bob.id)


def test_a_user_made_after_the_last_read_is_waited_for(pair):
    auth, controller, client = pair
    controller.cloud_auth.poll()
    controller.cloud_auth.start()
    try:
        alice = make_caller(auth, "alice@example.org")  # not in the copy yet
        assert authenticate(controller, token=alice.token, user_id=alice.id).id == alice.id
    finally:
        controller.cloud_auth.stop()


def test_a_revocation_while_the_introspection_is_in_flight_wins(pair):
    """The race: cloud auth answers "active" with number S; before the answer is used, the
    token is revoked (S+1) and the controller applies it. The token must not be cached."""
    auth, controller, client = pair
    alice = make_caller(auth, "alice@example.org")
    follower = controller.cloud_auth
    follower.poll()

    def revoke_and_apply():
        auth.store.set_api_secret(alice.id, auth.secret_box.encrypt("another-secret-" + "y" * 20))
        follower.poll()

    client.before_answer = revoke_and_apply
    with pytest.raises(Unauthenticated):
        authenticate(controller, token=alice.token, user_id=alice.id)
    assert controller.store._all("SELECT * FROM tokens") == []


def test_revocations_and_deactivation_end_cached_tokens(pair):
    auth, controller, client = pair
    alice, bob = make_caller(auth, "alice@example.org"), make_caller(auth, "bob@example.org")
    follower = controller.cloud_auth
    follower.poll()
    for caller in (alice, bob):
        authenticate(controller, token=caller.token, user_id=caller.id)
    auth.store.set_api_secret(alice.id, auth.secret_box.encrypt("another-secret-" + "y" * 20))
    auth.store.update_user(bob.id, {"active": 0})
    follower.poll()
    for caller in (alice, bob):
        with pytest.raises(Unauthenticated):
            authenticate(controller, token=caller.token, user_id=caller.id)
    assert controller.store.get_user(bob.id)["active"] == 0


def test_a_snapshot_drops_cached_tokens_and_users_gone(pair):
    auth, controller, client = pair
    alice, bob = make_caller(auth, "alice@example.org"), make_caller(auth, "bob@example.org")
    follower = controller.cloud_auth
    follower.poll()
    authenticate(controller, token=alice.token, user_id=alice.id)
    auth.store.delete_user(bob.id)
    follower.epoch = "another"  # as after cloud auth's database was replaced
    follower.poll()
    assert controller.store._all("SELECT * FROM tokens") == []
    assert controller.store.get_user(bob.id) is None and controller.store.get_user(alice.id) is not None
    assert authenticate(controller, token=alice.token, user_id=alice.id).id == alice.id  # checked again


def test_the_copy_holds_this_clusters_registered_accounts_only(pair):
    """What reconcile compares with the accounts recorded here: kept from the feed's pages and
    from a snapshot, removals included, another cluster's left out."""
    from controller.cloud_auth import accounts

    auth, controller, client = pair
    alice, bob = make_caller(auth, "alice@example.org"), make_caller(auth, "bob@example.org")
    registry.add_controller(auth, controller_id=3, name="hpc3", url="https://hpc3.example.org")
    accounts.register(auth, ControllerCaller(2, "hpc2"), "2", "alice", user_id=alice.id,
                      uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c21", uid=20001)
    follower = controller.cloud_auth
    follower.poll()  # the first read: a snapshot
    assert list(controller.store.registry_copy()) == ["alice"]
    accounts.register(auth, ControllerCaller(3, "hpc3"), "3", "bob", user_id=bob.id,
                      uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c22", uid=20002)
    accounts.register(auth, ControllerCaller(2, "hpc2"), "2", "bob2", user_id=bob.id,
                      uuid="6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c23", uid=20003)
    accounts.unregister(auth, ControllerCaller(2, "hpc2"), "2", "alice")
    follower.poll()  # changes
    copy = controller.store.registry_copy()
    assert list(copy) == ["bob2"] and (copy["bob2"]["user_id"], copy["bob2"]["uid"]) == (bob.id, 20003)
    follower.epoch = "another"
    follower.poll()  # a snapshot again
    assert list(controller.store.registry_copy()) == ["bob2"]


def test_a_user_gone_at_cloud_auth_but_named_here_is_kept_inactive(pair):
    auth, controller, client = pair
    bob = make_caller(auth, "bob@example.org")
    controller.cloud_auth.poll()
    with controller.store.write() as conn:  # something of this cluster names bob
        conn.execute("INSERT INTO system_accounts (user_id, username, uuid, uid, gid, home, cloud_controller_id, "
                     "created_at_utc) VALUES (?, 'bob', '6f1c0b2e-7d0a-4c55-9b7e-2b8f0a7e1c11', 20001, 20001, "
                     "'/home/bob', 2, 'x')", (bob.id,))
    auth.store.delete_user(bob.id)
    make_caller(auth, "bob@example.org")  # the address given to a new user
    controller.cloud_auth.poll()
    kept = controller.store.get_user(bob.id)
    assert kept["active"] == 0 and kept["email"] == f"~{bob.id}"
    assert controller.store.get_user_by_email("bob@example.org")["id"] != bob.id


def test_cloud_auth_down_tokens_seen_work_unknown_are_503_at_once(pair, monkeypatch):
    auth, controller, client = pair
    alice = make_caller(auth, "alice@example.org")
    follower = controller.cloud_auth
    follower.poll()
    authenticate(controller, token=alice.token, user_id=alice.id)
    unseen = make_caller(auth, "carol@example.org")
    follower.poll()
    client.down = True
    with pytest.raises(CloudAuthDown):
        follower.poll()
    # Known down: an unknown token gets 503 without a call (no thread waits for cloud auth).
    now = time.time()
    monkeypatch.setattr(follower, "clock", lambda: now + 5)
    before = client.introspections
    with pytest.raises(ServerBusy) as refused:
        authenticate(controller, token=unseen.token, user_id=unseen.id)
    assert refused.value.retry_after >= 1 and client.introspections == before
    assert authenticate(controller, token=alice.token, user_id=alice.id).id == alice.id  # within the grace
    assert follower.check().startswith("feed read")
    # Past the grace: every token 503 (never 401), and /healthz's check fails.
    monkeypatch.setattr(follower, "clock", lambda: now + 301)
    with pytest.raises(ServerBusy):
        authenticate(controller, token=alice.token, user_id=alice.id)
    from controller.errors import HostError

    with pytest.raises(HostError, match="past the offline grace"):
        follower.check()
    # Back: the next good read heals it, with no restart.
    client.down = False
    monkeypatch.setattr(follower, "clock", time.time)
    follower.poll()
    assert authenticate(controller, token=unseen.token, user_id=unseen.id).id == unseen.id


def test_a_grace_of_0_fails_closed_from_the_first_failed_read(pair):
    auth, controller, client = pair
    alice = make_caller(auth, "alice@example.org")
    follower = controller.cloud_auth
    follower.grace = 0
    follower.poll()
    authenticate(controller, token=alice.token, user_id=alice.id)  # reads succeed: open
    client.down = True
    with pytest.raises(CloudAuthDown):
        follower.poll()
    with pytest.raises(ServerBusy):
        authenticate(controller, token=alice.token, user_id=alice.id)


def test_introspections_at_once_are_bounded(pair):
    auth, controller, client = pair
    follower = controller.cloud_auth
    callers = [make_caller(auth, f"u{i}@example.org") for i in range(4)]
    follower.poll()
    release = threading.Event()
    client.before_answer = lambda: release.wait(5)
    results = []

    def check(c):
        try:
            authenticate(controller, token=c.token, user_id=c.id)
            results.append("ok")
        except ServerBusy:
            results.append("busy")

    threads = [threading.Thread(target=check, args=(c,)) for c in callers[:2]]
    for t in threads:
        t.start()
    time.sleep(0.3)
    started = time.monotonic()
    check(callers[2])  # a third while two are in flight: 503 at once
    assert results == ["busy"] and time.monotonic() - started < 0.5
    release.set()
    for t in threads:
        t.join()
    assert sorted(results) == ["busy", "ok", "ok"]


def test_where_it_stopped_is_kept_across_a_restart(pair):
    auth, controller, client = pair
    make_caller(auth, "alice@example.org")
    controller.cloud_auth.poll()
    again = Follower(controller, client)
    assert (again.epoch, again.seq) == (controller.cloud_auth.epoch, controller.cloud_auth.seq) and again.seq > 0
    assert again.age() is not None and again.age() < 5


def test_the_metrics_say_how_old_the_copy_is(pair):
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client import generate_latest

    from controller.monitoring.metrics import metrics_of

    auth, controller, client = pair
    make_caller(auth, "alice@example.org")
    controller.cloud_auth.poll()
    text = generate_latest(metrics_of(controller).registry).decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert 0 <= values["cloud_controller_cloud_auth_feed_age_seconds"] < 5
    assert values["cloud_controller_cloud_auth_feed_seq"] == controller.cloud_auth.seq > 0
