"""Secrets: password hashes, the encrypted API secret, API keys and tokens.

Passwords are kept only as argon2id hashes. The API secret must be shown to a
superuser, so it is stored encrypted (Fernet: AES-CBC + HMAC) with a key kept in
a file outside the database. Tokens are random and stored only as SHA-256
hashes, so a copy of the database yields no usable token.
"""

import hashlib
import hmac
import os
import secrets
import threading
import time
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from cryptography.fernet import Fernet, InvalidToken

from controller.errors import HostUnavailable, TooManyRequests
from controller.security.hash_slots import SIMULATE, HashSlots

# Compared against when no user matches, so a wrong email costs as much time as a wrong password.
_DUMMY_PASSWORD = "dummy-password-for-timing"


class Passwords:
    def __init__(self, *, time_cost: int = 3, memory_kib: int = 65536, parallelism: int = 4,
                 max_concurrent_checks: int = 4, max_checks_per_source: int = 2):
        # RFC 9106's second recommended profile by default (t=3, 64 MiB, 4 lanes). The lanes
        # split the same 64 MiB and the same passes over it between threads: the check takes
        # down to a quarter of the work's wall time where cores are free (docs/decisions.md,
        # "argon2's parallelism"). A hash records its own parameters, so hashes made with
        # other ones still verify, at their own cost.
        self._hasher = PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)
        # Whether a stored hash was made with other parameters than these (it reads the hash's own).
        self._needs_rehash = self._hasher.check_needs_rehash
        # Made on first use, not at start: one argon2 hash costs memory_kib (64 MiB by
        # default), which would set the server's peak memory before any request.
        self._dummy: str | None = None
        self._dummy_lock = threading.Lock()
        # argon2 costs tens of milliseconds and megabytes per check: at most this many
        # logins hash at once, so a flood of password logins cannot take every server
        # thread and all memory; and no one client, nor unknown emails, takes them all.
        self._slots = HashSlots(total=max_concurrent_checks, per_source=max_checks_per_source)

    @property
    def _dummy_hash(self) -> str:
        with self._dummy_lock:
            if self._dummy is None:
                self._dummy = self._hasher.hash(_DUMMY_PASSWORD)
            return self._dummy

    def hash(self, password: str) -> str:
        return self._hasher.hash(password)

    def verify(self, password_hash: str | None, password: str) -> bool:
        try:
            return self._hasher.verify(password_hash or self._dummy_hash, password) and bool(password_hash)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    def verify_login(self, password_hash: str | None, password: str, *, source: str) -> bool:
        """verify() for an unauthenticated caller from the client address `source`:
        TooManyRequests at once when that source or every slot is busy (controller/security/hash_slots.py).
        Waiting for a slot would park a server thread per queued login, and a flood of logins
        would park them all."""
        with self._slots.admit(source, known=password_hash is not None) as how:
            if how == SIMULATE:
                # Unknown emails past their share: as long as a check takes, without hashing.
                time.sleep(self._slots.simulated_wait())
                return False
            with self._slots.timed():
                return self.verify(password_hash, password)


    def rehashed(self, password_hash: str, password: str, *, source: str) -> str | None:
        """After a successful login: the password hashed with this server's parameters when the
        stored hash was made with others (`[auth] argon2_*` changed since), else None. Once per
        user: the stored hash has them after. It takes a hash slot as a check does; when none
        is free it waits for the user's next login (None), never for a slot."""
        try:
            if not self._needs_rehash(password_hash):
                return None
        except (InvalidHashError, ValueError):
            return None
        try:
            with self._slots.admit(source, known=True):
                return self.hash(password)
        except TooManyRequests:
            return None


def generate_key_file(path: str) -> None:
    """Write a new Fernet key readable by root only; never overwrite an existing key."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(Fernet.generate_key() + b"\n")


class SecretBox:
    """Encrypts API secrets at rest with the key from the configured key file."""

    def __init__(self, key_file: str):
        self.key_file = key_file
        try:
            key = Path(key_file).read_bytes().strip()
            self._fernet = Fernet(key)
        except FileNotFoundError:
            raise HostUnavailable(f"secret key file missing: {key_file} (run `cloud-agent init`)") from None
        except (ValueError, OSError) as e:
            raise HostUnavailable(f"secret key file unusable: {key_file}: {e.__class__.__name__}") from None

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise HostUnavailable("stored API secret cannot be decrypted with the configured key") from None


def new_api_key() -> str:
    return "ak_" + secrets.token_hex(16)


def new_api_secret() -> str:
    return secrets.token_urlsafe(32)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    """Constant-time comparison of two secrets; None never matches."""
    if a is None or b is None:
        return False
    return hmac.compare_digest(a.encode(), b.encode())
