"""Every user of a head node connects from 127.0.0.1: by default two of them log in at the same
moment, while one client still holds at most half of the password-hash slots."""

import threading
import time

from controller.config import config_from_dict
from tests.fixtures.api import PASSWORD, make_caller, user_envelope

CHECK_SECONDS = 0.3


class SlowHasher:
    """argon2 that takes CHECK_SECONDS per check, counting the checks running at once."""

    def __init__(self, real):
        self.real = real
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def hash(self, password):
        return self.real.hash(password)

    def verify(self, password_hash, password):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(CHECK_SECONDS)
            return self.real.verify(password_hash, password)
        finally:
            with self._lock:
                self.running -= 1


def logins_at_once(client, logins):
    """[(email, address)] sent at the same moment; their responses in that order."""
    start = threading.Barrier(len(logins))
    out = [None] * len(logins)

    def one(i, email, address):
        start.wait()
        out[i] = client.simulate_post("/v1/auth/token", json={"email": email, "password": PASSWORD},
                                      remote_addr=address)

    threads = [threading.Thread(target=one, args=(i, *login)) for i, login in enumerate(logins)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_the_defaults_fit_a_head_node(config_values):
    auth = config_from_dict(config_values).auth
    assert (auth.max_password_checks, auth.max_password_checks_per_source) == (4, 2)


def test_two_users_from_127_0_0_1_at_the_same_moment_both_log_in(ctx, user_client, monkeypatch):
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org")
    hasher = SlowHasher(ctx.passwords._hasher)
    monkeypatch.setattr(ctx.passwords, "_hasher", hasher)
    a, b = logins_at_once(user_client, [(alice.email, "127.0.0.1"), (bob.email, "127.0.0.1")])
    assert user_envelope(a, 200, data=True)["userid"] == alice.id
    assert user_envelope(b, 200, data=True)["userid"] == bob.id
    assert hasher.most == 2  # they did hash at the same time


def test_one_address_still_holds_at_most_half_of_the_slots(ctx, user_client, monkeypatch):
    callers = [make_caller(ctx, f"u{i}@example.org") for i in range(4)]
    hasher = SlowHasher(ctx.passwords._hasher)
    monkeypatch.setattr(ctx.passwords, "_hasher", hasher)
    local = logins_at_once(user_client, [(c.email, "127.0.0.1") for c in callers[:3]] + [(callers[3].email,
                                                                                         "192.0.2.9")])
    statuses = sorted(r.status_code for r in local[:3])
    assert statuses == [200, 200, 429], statuses
    refused = next(r for r in local[:3] if r.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    # Another address was not refused: the local client left it slots.
    assert user_envelope(local[3], 200, data=True)["userid"] == callers[3].id
