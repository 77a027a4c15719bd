"""Secrets and guessing limits: password hashes, the encrypted API secret, keys and tokens
(crypto.py), who may hash a password now (hash_slots.py), failed logins slowed (throttle.py).
Imports only controller/errors.py: context builds on it."""
