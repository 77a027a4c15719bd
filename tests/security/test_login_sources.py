"""One client cannot take the password-hash slots from others (issue 16, finding 3).

Each source (client address) holds at most `[auth] max_password_checks_per_source`
logins at once; unknown emails hash the dummy in their own share of the slots and
past it are answered as a wrong password is, without a slot. The floods here run
on a hasher that takes 0.2 s per check, so the attackers' threads keep their slots
busy; the victim's own check is instant.
"""

import threading
import time
import types

import pytest

from api.client_address import client_address
from controller.config import config_from_dict
from controller.errors import InvalidInput
from tests.fixtures.api import PASSWORD, config_values_for, make_caller, user_envelope

ATTACK_SECONDS = 0.2


class DelayedHasher:
    """argon2 for the victim's hash; every other check (wrong passwords, the dummy) takes 0.2 s."""

    def __init__(self, real, fast_hash: str):
        self.real = real
        self.fast_hash = fast_hash
        self.checks = 0
        self._lock = threading.Lock()

    def hash(self, password):
        return self.real.hash(password)

    def verify(self, password_hash, password):
        with self._lock:
            self.checks += 1
        if password_hash != self.fast_hash:
            time.sleep(ATTACK_SECONDS)
        return self.real.verify(password_hash, password)


def login(client, email, password, address):
    return client.simulate_post("/v1/auth/token", json={"email": email, "password": password},
                                remote_addr=address)


class Flood:
    """Threads sending wrong-password logins without pause until stopped; counts the statuses."""

    def __init__(self, client, senders):
        self.client, self.senders = client, senders  # [(address, email_for(i))]
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._run, args=s, daemon=True) for s in senders]

    def _run(self, address, email_for):
        i = 0
        while not self.stop.is_set():
            self.statuses.append(login(self.client, email_for(i), "Wrong-password-1", address).status_code)
            i += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(3 * ATTACK_SECONDS)  # every attacker thread is in its loop
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def config_values(tmp_path):
    """Two slots, one per source: the smallest server where every rule here bites (the
    defaults, four and two, are in tests/security/test_head_node_logins.py)."""
    values = config_values_for(tmp_path)
    values["auth"].update({"max_password_checks": 2, "max_password_checks_per_source": 1})
    return values


@pytest.fixture
def victim(ctx, monkeypatch):
    alice = make_caller(ctx, "alice@example.org")
    hasher = DelayedHasher(ctx.passwords._hasher, ctx.store.get_user_by_email(alice.email)["password_hash"])
    monkeypatch.setattr(ctx.passwords, "_hasher", hasher)
    return types.SimpleNamespace(caller=alice, hasher=hasher)


def victim_logs_in(ctx, user_client, victim, times=10):
    """The victim, from its own address, gets a working token every time."""
    for _ in range(times):
        data = user_envelope(login(user_client, victim.caller.email, PASSWORD, "192.0.2.200"), 200, data=True)
        assert data["userid"] == victim.caller.id
        r = user_client.simulate_get(f"/v1/user/view/{victim.caller.id}",
                                     headers={"X-Auth-Token": data["token"], "X-Auth-Cloudauth-Id": victim.caller.id})
        assert user_envelope(r, 200, data=True)["user"]["email"] == victim.caller.email
        time.sleep(ATTACK_SECONDS / 4)


def unknown(prefix):
    return lambda i: f"{prefix}-{i}@nowhere.example"


def test_three_threads_of_unknown_emails_from_one_address_leave_a_slot(ctx, user_client, victim):
    attacker = "198.51.100.7"
    with Flood(user_client, [(attacker, unknown(f"t{n}")) for n in range(3)]) as flood:
        victim_logs_in(ctx, user_client, victim)
    # The attacker got wrong-password answers and, past its one login at a time, 429; never more.
    assert set(flood.statuses) == {401, 429}, set(flood.statuses)


def test_three_threads_on_one_known_email_from_one_address_leave_a_slot(tmp_path, config_values, victim,
                                                                         ctx, user_client):
    # An attacker who knows many emails is not stopped by the per-email lockout: here one
    # email stands for them (no lockout), so only the per-source rule is in play.
    ctx.throttle.max_failures = 10**6
    make_caller(ctx, "bob@example.org")
    with Flood(user_client, [("198.51.100.7", lambda i: "bob@example.org")] * 3) as flood:
        victim_logs_in(ctx, user_client, victim)
    assert set(flood.statuses) == {401, 429}, set(flood.statuses)


def test_unknown_emails_from_many_addresses_keep_to_their_share(ctx, user_client, victim):
    # Three addresses, one thread each: the per-source rule does not apply; unknown emails
    # hash in one slot of two, and the others are answered without a slot.
    with Flood(user_client, [(f"198.51.100.{n}", unknown(f"s{n}")) for n in range(3)]) as flood:
        victim_logs_in(ctx, user_client, victim)
    # Unknown emails past their share are answered as a wrong password is (401); 429 only in
    # the instants the victim's own check fills the second slot (every slot busy).
    assert 401 in flood.statuses and set(flood.statuses) <= {401, 429}, set(flood.statuses)


def test_past_the_share_an_unknown_email_is_answered_as_a_wrong_password_without_hashing(ctx, user_client,
                                                                                       victim):
    make_caller(ctx, "bob@example.org")
    results = {}
    holder = threading.Thread(target=lambda: results.setdefault(
        "holder", login(user_client, "first@nowhere.example", "x", "198.51.100.1")))
    holder.start()
    deadline = time.monotonic() + 10
    while victim.hasher.checks < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    # The unknown share (one slot) hashes the first unknown email: the next unknown one is
    # answered 401 without a check, a known email with a wrong password is 401 after one.
    r = login(user_client, "second@nowhere.example", "x", "198.51.100.2")
    user_envelope(r, 401)
    assert victim.hasher.checks == 1
    r_known = login(user_client, "bob@example.org", "x", "198.51.100.3")
    user_envelope(r_known, 401)
    assert r_known.json["message"] == r.json["message"]
    assert victim.hasher.checks == 2
    holder.join(10)
    user_envelope(results["holder"], 401)
    # Both counted as failures of their email, the same way.
    assert len(ctx.throttle._failures) == 3


def test_the_per_source_refusal_does_not_depend_on_the_email(ctx, user_client, victim):
    make_caller(ctx, "bob@example.org")
    holder = threading.Thread(target=lambda: login(user_client, "bob@example.org", "x", "198.51.100.1"))
    holder.start()
    deadline = time.monotonic() + 10
    while victim.hasher.checks < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        for email in ("alice@example.org", "bob@example.org", "nobody@nowhere.example"):
            r = login(user_client, email, PASSWORD, "198.51.100.1")
            user_envelope(r, 429)
            assert r.headers["retry-after"] == "1"
        assert victim.hasher.checks == 1  # refused before any check
    finally:
        holder.join(10)
    user_envelope(login(user_client, "alice@example.org", PASSWORD, "198.51.100.1"), 200, data=True)


def test_per_source_cap_comes_from_the_config(config_values):
    values = dict(config_values, auth=dict(config_values["auth"], max_password_checks_per_source=-1))
    with pytest.raises(InvalidInput, match="max_password_checks_per_source"):
        config_from_dict(values)
    values = dict(config_values, server=dict(config_values["server"], trusted_proxies="10.0.0.1, nonsense"))
    with pytest.raises(InvalidInput, match="trusted_proxies"):
        config_from_dict(values)


# -- the client address ----------------------------------------------------------------------
def request(remote, forwarded=None):
    return types.SimpleNamespace(remote_addr=remote,
                                 get_header=lambda name: forwarded if name == "X-Forwarded-For" else None)


def test_client_address_is_the_peer_unless_it_is_a_trusted_proxy(config_values):
    values = dict(config_values, server=dict(config_values["server"], trusted_proxies="127.0.0.1, 10.1.0.0/16"))
    trusted = config_from_dict(values).server.trusted_proxies
    # Not a trusted peer: its X-Forwarded-For is whatever it wrote.
    assert client_address(request("203.0.113.9", "198.51.100.1"), trusted) == "203.0.113.9"
    assert client_address(request("203.0.113.9"), ()) == "203.0.113.9"
    # Through trusted proxies: the rightmost hop that is not one of them; left of it, client text.
    assert client_address(request("127.0.0.1", "6.6.6.6, 198.51.100.1, 10.1.2.3"), trusted) == "198.51.100.1"
    assert client_address(request("127.0.0.1"), trusted) == "127.0.0.1"
    assert client_address(request("127.0.0.1", "10.1.2.3"), trusted) == "127.0.0.1"
    assert client_address(request("127.0.0.1", "198.51.100.1, garbage"), trusted) == "127.0.0.1"
    # An IPv6 client is its /64; an IPv4-mapped one its IPv4 address.
    assert client_address(request("2001:db8:1:2::5"), ()) == "2001:db8:1:2::/64"
    assert client_address(request("2001:db8:1:2:ffff::9"), ()) == "2001:db8:1:2::/64"
    assert client_address(request("::ffff:192.0.2.1"), ()) == "192.0.2.1"
