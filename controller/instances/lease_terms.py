"""What a lease is, without acting on it: its dates, its state and its terms (docs/leases.md).

Read by every instance answer and by the create (controller/instances/instances.py) and
acted on by the renewals and the sweep (controller/instances/leases.py), so it depends on
neither.
"""
import time
from datetime import datetime, timezone

from controller.context import Context
from controller.errors import Conflict


# -- times ---------------------------------------------------------------------------------
def rfc3339(seconds: float) -> str:
    """RFC 3339 UTC to the second, as every date of the API (and stored: text order is time order)."""
    # time.strftime: less than half of datetime's cost, and every instance answer asks for two.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


def seconds_of(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


# The latest lease_times answer, by (second, first warning): every request in one second asks
# the same (a GET of one instance costs about 0.3 ms; the two dates 15 us of it). One tuple,
# replaced whole: threads share it without a lock.
_latest: tuple[tuple[int, int], tuple[str, str]] = ((-1, -1), ("", ""))


def lease_times(ctx: Context) -> tuple[str, str]:
    """What an instance object's `lease` is read against: now, and the end of the first
    (longest) warning (expires-at by then: expiring)."""
    global _latest
    warn = ctx.config.leases.warn
    key = (int(ctx.clock()), warn[0] if warn else 0)
    held = _latest
    if held[0] == key:
        return held[1]
    times = (rfc3339(key[0]), rfc3339(key[0] + key[1]))
    _latest = (key, times)
    return times


def state_of(ctx: Context, expires_at: str | None) -> str:
    """`lease` of an instance whose lease ends at expires_at (as the stored objects say it)."""
    if expires_at is None:
        return "none"
    now, until = lease_times(ctx)
    return "expired" if expires_at <= now else "expiring" if expires_at <= until else "active"


# -- terms -------------------------------------------------------------------------------
def terms(ctx: Context, flavor: dict | None) -> tuple[int | None, int | None]:
    """(default, max) in seconds for an instance of this flavor: the flavor's own, else
    `[leases]`'s; a default beyond the max is the max. (None, None): leases are off for it."""
    config = ctx.config.leases
    flavor = flavor or {}
    longest = flavor.get("lease_max_seconds") or config.max
    default = flavor.get("lease_default_seconds") or config.default
    if default is not None and longest is not None:
        default = min(default, longest)
    return default, longest


def initial_expiry(ctx: Context, flavor: dict) -> str | None:
    """expires_at of a new instance of this flavor (None: no lease)."""
    default, _longest = terms(ctx, flavor)
    return rfc3339(ctx.clock() + default) if default else None


def refuse_expired(ctx: Context, row: dict) -> None:
    """A power-on or reboot of an instance whose lease has ended: 409 until it is renewed."""
    expires_at = row.get("expires_at")
    if expires_at is not None and expires_at <= rfc3339(ctx.clock()):
        raise Conflict(f"lease expired at {expires_at}; renew it first")
