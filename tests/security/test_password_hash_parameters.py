"""argon2id's parameters: RFC 9106's second recommended profile by default (t=3, 64 MiB, 4 lanes),
never below OWASP's argon2id floor, and a hash made with older parameters takes the current ones
at the user's next successful password login, once, without ending any session or token."""

import pytest
from argon2.profiles import RFC_9106_LOW_MEMORY

from controller.config import DEFAULTS, config_from_dict
from controller.errors import InvalidInput
from controller.security.crypto import Passwords
from tests.fixtures.api import PASSWORD, make_caller, user_envelope

OLD = Passwords(time_cost=1, memory_kib=1024, parallelism=1)


@pytest.fixture
def alice(ctx):
    return make_caller(ctx, "alice@example.org")


def stored(ctx, user_id: str) -> str:
    return ctx.store.get_user(user_id)["password_hash"]


def login(client, password=PASSWORD):
    return client.simulate_post("/v1/auth/token", json={"email": "alice@example.org", "password": password})


def test_the_defaults_are_the_libraries_recommended_profile_and_above_owasps_floor(tmp_path):
    auth = DEFAULTS["auth"]
    assert (int(auth["argon2_time_cost"]), int(auth["argon2_memory_kib"]), int(auth["argon2_parallelism"])) == (
        RFC_9106_LOW_MEMORY.time_cost, RFC_9106_LOW_MEMORY.memory_cost, RFC_9106_LOW_MEMORY.parallelism)
    made = Passwords().hash(PASSWORD)  # the class's own defaults: the same profile
    assert made.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    # OWASP's argon2id floor at three passes is 12 MiB with one lane: even one lane of the
    # four alone (16 MiB) is above it.
    assert int(auth["argon2_memory_kib"]) // int(auth["argon2_parallelism"]) >= 12 * 1024
    assert int(auth["argon2_time_cost"]) >= 3


def test_the_parallelism_is_configured_and_checked(tmp_path, config_values, ctx, alice):
    assert f",p={ctx.config.auth.argon2_parallelism}$" in stored(ctx, alice.id)
    assert ctx.config.auth.argon2_parallelism == 4
    bad = dict(config_values, auth=dict(config_values["auth"], argon2_parallelism=0))
    with pytest.raises(InvalidInput, match="argon2_parallelism"):
        config_from_dict(bad)


def test_a_login_upgrades_an_older_hash_once_and_ends_nothing(ctx, user_client, alice):
    old = OLD.hash(PASSWORD)
    ctx.store.set_password_hash(alice.id, old)
    assert user_client.simulate_get(f"/v1/user/view/{alice.id}", headers=alice.headers).status_code == 200

    # A wrong password changes nothing.
    assert login(user_client, "wrong-password-9").status_code == 401
    assert stored(ctx, alice.id) == old

    token = user_envelope(login(user_client), 200, data=True)["token"]
    upgraded = stored(ctx, alice.id)
    assert upgraded != old and ctx.passwords.verify(upgraded, PASSWORD)
    assert upgraded.startswith(f"$argon2id$v=19$m={ctx.config.auth.argon2_memory_kib},"
                               f"t={ctx.config.auth.argon2_time_cost},p={ctx.config.auth.argon2_parallelism}$")
    # The same password: the API-key token from before and the new password token both live.
    for headers in (alice.headers, {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": alice.id}):
        assert user_client.simulate_get(f"/v1/user/view/{alice.id}", headers=headers).status_code == 200

    # Once: the next login leaves the current hash as it is.
    assert login(user_client).status_code == 200
    assert stored(ctx, alice.id) == upgraded


def test_an_upgrade_never_replaces_a_password_changed_meanwhile(ctx, alice):
    old = OLD.hash(PASSWORD)
    ctx.store.set_password_hash(alice.id, old)
    changed = ctx.passwords.hash("Changed-meanwhile-1")
    ctx.store.set_password_hash(alice.id, changed)
    assert ctx.store.upgrade_password_hash(alice.id, old=old, new=ctx.passwords.hash(PASSWORD)) is False
    assert stored(ctx, alice.id) == changed
    assert ctx.store.upgrade_password_hash(alice.id, old=changed, new=old) is True


def test_no_upgrade_without_a_free_hash_slot(ctx):
    passwords = Passwords(time_cost=1, memory_kib=1024, max_concurrent_checks=1, max_checks_per_source=1)
    old = OLD.hash(PASSWORD)
    with passwords._slots.admit("10.0.0.1", known=True):
        assert passwords.rehashed(old, PASSWORD, source="10.0.0.2") is None
    assert passwords.rehashed(old, PASSWORD, source="10.0.0.2").startswith("$argon2id$v=19$m=1024,t=1,p=4$")
    assert passwords.rehashed(passwords.hash(PASSWORD), PASSWORD, source="10.0.0.2") is None
