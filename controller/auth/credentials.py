"""A user's own credentials (self-service): see its key, rotate its secret, change its password.

Every function acts on the requester only: there is no user id to pass, so no
permission rule is needed beyond being authenticated. Rotating the secret or
changing the password needs a proof (the password, or the current API secret):
a stolen token alone must not turn into lasting credentials. A wrong proof is
a failed login of that user: it feeds the same throttle as `POST
/v1/auth/token` with the user's email (controller/auth/tokens.py), so guessing the
password through these calls is no faster than through a login, and a locked
out user is answered 429 here too.

The tokens of the kind that changed die in the same transaction as the change
(controller/store/users.py `set_api_secret`, `set_password_hash`): key-issued tokens
on a rotation, password-issued tokens on a password change. Nothing here logs
or records a secret; the new secret is returned once, to the caller.
"""

from controller.auth.tokens import email_throttle_key
from controller.context import Context
from controller.errors import InvalidInput, Unauthenticated
from controller.permissions import Requester
from controller.rules import check_password
from controller.security.crypto import new_api_secret, same

WRONG_PROOF = "wrong password or API secret"
WRONG_PASSWORD = "wrong password"
_MAX_CREDENTIAL = 256


def _requester_row(ctx: Context, requester: Requester) -> dict:
    user = ctx.store.get_user(requester.id)
    # authenticate() let the request in a moment ago; a user deleted or deactivated since
    # (or whose secret was nulled) is as good as logged out.
    if user is None or user["active"] <= 0 or user["api_secret_enc"] is None:
        raise Unauthenticated("your login has ended; log in again")
    return user


def show_credentials(ctx: Context, requester: Requester) -> dict:
    """{"userid", "api_key", "api_secret_set"}: never the secret itself."""
    user = _requester_row(ctx, requester)
    return {"userid": user["id"], "api_key": user["api_key"], "api_secret_set": user["api_secret_enc"] is not None}


def _proof_value(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a non-empty string")
    return value


def _check_proof(ctx: Context, user: dict, *, password: str | None, api_secret: str | None, client: str,
                 wrong: str) -> None:
    """Unauthenticated (counted as a failed login of this user) unless the proof holds;
    TooManyRequests while the user's logins are locked out or every hash slot is busy."""
    key = email_throttle_key(user["email"])
    ctx.throttle.check(key)
    if password is not None:
        # Longer than any password can be: wrong without costing a hash.
        ok = len(password) <= _MAX_CREDENTIAL and ctx.passwords.verify_login(
            user["password_hash"], password, source=client)
    else:
        stored = ctx.secret_box.decrypt(user["api_secret_enc"])
        ok = same(stored, api_secret)
    if not ok:
        ctx.throttle.failed(key)
        raise Unauthenticated(wrong)
    ctx.throttle.succeeded(key)


def rotate_api_secret(ctx: Context, requester: Requester, *, password: str | None = None,
                      api_secret: str | None = None, client: str) -> dict:
    """A new API secret for the requester, proven by its password or its current secret.

    Returns {"api_key", "api_secret"}; the secret is shown this once. The requester's
    key-issued tokens die at once (the one this call came with too, when it was one).
    `client` is the caller's address (api/client_address.py): a password proof takes a hash
    slot like a login from that address."""
    password = _proof_value("password", password)
    api_secret = _proof_value("api_secret", api_secret)
    if (password is None) == (api_secret is None):
        raise InvalidInput("give either password or api_secret (the current one) as proof")
    user = _requester_row(ctx, requester)
    _check_proof(ctx, user, password=password, api_secret=api_secret, client=client, wrong=WRONG_PROOF)
    secret = new_api_secret()
    ctx.store.set_api_secret(user["id"], ctx.secret_box.encrypt(secret))
    return {"api_key": user["api_key"], "api_secret": secret}


def change_password(ctx: Context, requester: Requester, *, password: str, new_password: str, client: str) -> None:
    """The requester's password changed from `password` (proof) to `new_password` (the
    password rule applies: 400 with the rule otherwise). Every password-issued token of the
    user dies at once, in the same transaction (store.set_password_hash): a portal session
    or client login made with the old password ends with it."""
    password = _proof_value("password", password)
    if password is None:
        raise InvalidInput("password (the current one) is required")
    if new_password is None:
        raise InvalidInput("new_password is required")
    # The rule is public and cheap: told before the proof costs a hash.
    check_password(new_password)
    if new_password == password:
        raise InvalidInput("new_password must differ from the current password")
    user = _requester_row(ctx, requester)
    _check_proof(ctx, user, password=password, api_secret=None, client=client, wrong=WRONG_PASSWORD)
    ctx.store.set_password_hash(user["id"], ctx.passwords.hash(new_password))
