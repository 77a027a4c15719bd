"""The self-service credential functions (controller/auth/credentials.py), on the service layer."""

import pytest

from controller.auth import credentials
from controller.auth.tokens import authenticate, issue_token
from controller.errors import InvalidInput, TooManyRequests, Unauthenticated
from controller.permissions import Requester
from tests.fixtures.api import PASSWORD, make_caller

NEW_PASSWORD = "battery-staple-77"


def me(caller) -> Requester:
    return Requester(id=caller.id, roles=frozenset())


def alive(ctx, token: str, caller) -> bool:
    try:
        authenticate(ctx, token=token, user_id=caller.id)
        return True
    except Unauthenticated:
        return False


def test_show_credentials_names_the_key_and_never_the_secret(ctx):
    alice = make_caller(ctx, "alice@example.org")
    make_caller(ctx, "bob@example.org")
    shown = credentials.show_credentials(ctx, me(alice))
    assert shown == {"userid": alice.id, "api_key": alice.api_key, "api_secret_set": True}
    assert alice.api_secret not in repr(shown)


def test_rotate_with_the_password_gives_a_new_secret_and_ends_key_tokens_only(ctx):
    alice = make_caller(ctx, "alice@example.org")
    by_password = issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")["token"]
    out = credentials.rotate_api_secret(ctx, me(alice), password=PASSWORD, client="10.0.0.1")
    assert out["api_key"] == alice.api_key and out["api_secret"] != alice.api_secret
    # The key-issued token died, the password-issued one lives.
    assert not alive(ctx, alice.token, alice)
    assert alive(ctx, by_password, alice)
    with pytest.raises(Unauthenticated):
        issue_token(ctx, api_key=alice.api_key, api_secret=alice.api_secret)
    assert issue_token(ctx, api_key=alice.api_key, api_secret=out["api_secret"])["userid"] == alice.id


def test_rotate_with_the_current_secret(ctx):
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org")
    out = credentials.rotate_api_secret(ctx, me(alice), api_secret=alice.api_secret, client="10.0.0.1")
    assert issue_token(ctx, api_key=alice.api_key, api_secret=out["api_secret"])["userid"] == alice.id
    # Only the requester's secret changed.
    assert issue_token(ctx, api_key=bob.api_key, api_secret=bob.api_secret)["userid"] == bob.id
    assert alive(ctx, bob.token, bob)


@pytest.mark.parametrize("proof", [{}, {"password": PASSWORD, "api_secret": "x"}, {"password": ""},
                                   {"api_secret": 5}])
def test_rotate_needs_exactly_one_proof(ctx, proof):
    alice = make_caller(ctx, "alice@example.org")
    with pytest.raises(InvalidInput):
        credentials.rotate_api_secret(ctx, me(alice), client="10.0.0.1", **proof)
    assert issue_token(ctx, api_key=alice.api_key, api_secret=alice.api_secret)["userid"] == alice.id
    assert alive(ctx, alice.token, alice)


def test_wrong_proof_is_a_failed_login_of_that_user_and_repeats_are_429(ctx):
    alice = make_caller(ctx, "alice@example.org")
    bob = make_caller(ctx, "bob@example.org")
    failures = ctx.config.auth.max_failures
    for i in range(failures):
        proof = {"password": "not-the-password-1"} if i % 2 else {"api_secret": "not-the-secret"}
        with pytest.raises(Unauthenticated):
            credentials.rotate_api_secret(ctx, me(alice), client="10.0.0.1", **proof)
    # Locked out: the right proof is refused too, and so is alice's password login.
    with pytest.raises(TooManyRequests):
        credentials.rotate_api_secret(ctx, me(alice), password=PASSWORD, client="10.0.0.1")
    with pytest.raises(TooManyRequests):
        credentials.change_password(ctx, me(alice), password=PASSWORD, new_password=NEW_PASSWORD,
                                    client="10.0.0.1")
    with pytest.raises(TooManyRequests):
        issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")
    # Nothing changed, and bob is not locked out.
    assert issue_token(ctx, api_key=alice.api_key, api_secret=alice.api_secret)["userid"] == alice.id
    assert issue_token(ctx, email=bob.email, password=PASSWORD, source="10.0.0.1")["userid"] == bob.id


def test_failed_logins_count_against_the_self_service_proof(ctx):
    alice = make_caller(ctx, "alice@example.org")
    for _ in range(ctx.config.auth.max_failures):
        with pytest.raises(Unauthenticated):
            issue_token(ctx, email=alice.email, password="not-the-password-1", source="10.0.0.1")
    with pytest.raises(TooManyRequests):
        credentials.rotate_api_secret(ctx, me(alice), api_secret=alice.api_secret, client="10.0.0.1")


def test_change_password_ends_password_tokens_only(ctx):
    alice = make_caller(ctx, "alice@example.org")
    by_password = issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")["token"]
    assert credentials.change_password(ctx, me(alice), password=PASSWORD, new_password=NEW_PASSWORD,
                                       client="10.0.0.1") is None
    assert not alive(ctx, by_password, alice)
    assert alive(ctx, alice.token, alice)
    with pytest.raises(Unauthenticated):
        issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")
    assert issue_token(ctx, email=alice.email, password=NEW_PASSWORD, source="10.0.0.1")["userid"] == alice.id


@pytest.mark.parametrize("new, says", [("short-1", "14 to 24"), ("onlylettersinhere", "two of"),
                                       (PASSWORD, "differ"), (None, "required")])
def test_change_password_refuses_a_new_password_against_the_rule(ctx, new, says):
    alice = make_caller(ctx, "alice@example.org")
    by_password = issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")["token"]
    with pytest.raises(InvalidInput, match=says):
        credentials.change_password(ctx, me(alice), password=PASSWORD, new_password=new, client="10.0.0.1")
    assert alive(ctx, by_password, alice)
    assert issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")["userid"] == alice.id


def test_change_password_with_a_wrong_old_password_changes_nothing(ctx):
    alice = make_caller(ctx, "alice@example.org")
    with pytest.raises(Unauthenticated, match="wrong password"):
        credentials.change_password(ctx, me(alice), password="not-the-password-1", new_password=NEW_PASSWORD,
                                    client="10.0.0.1")
    with pytest.raises(Unauthenticated):
        issue_token(ctx, email=alice.email, password=NEW_PASSWORD, source="10.0.0.1")
    assert issue_token(ctx, email=alice.email, password=PASSWORD, source="10.0.0.1")["userid"] == alice.id


def test_a_requester_deactivated_meanwhile_is_unauthenticated(ctx):
    alice = make_caller(ctx, "alice@example.org")
    ctx.store.update_user(alice.id, {"active": 0})
    with pytest.raises(Unauthenticated):
        credentials.show_credentials(ctx, me(alice))
    with pytest.raises(Unauthenticated):
        credentials.rotate_api_secret(ctx, me(alice), password=PASSWORD, client="10.0.0.1")
