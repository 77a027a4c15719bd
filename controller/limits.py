"""Per-user limits and host admission.

A user may hold at once at most `[limits] instances` live instances it owns,
`vcpus` and `memory_mb` summed over those instances' flavors, `groups` it
owns and `managed_users` (users whose owner it is). `cloud-agent user limits`
overrides any of them for one user; -1 means no limit. Lowering a limit below
what a user holds removes nothing: only new requests are refused.

A new instance is admitted on the host, with Nova's meanings, only while

    allocated vCPUs + flavor vcpu  <= host CPUs * cpu_allocation_ratio
    allocated MB + flavor memory   <= (host MB - reserved_host_memory_mb) * ram_allocation_ratio

where "allocated" sums the flavors of every live instance in the database and
the host's CPUs and memory come from the hypervisor.

The store runs these checks inside the write transaction that inserts the
row (it calls the admit_* functions with what it counted there), so
concurrent requests can never pass a limit together.
"""

import logging
from dataclasses import dataclass

from controller import permissions as perms
from controller.errors import Conflict, InvalidInput
from controller.rules import as_decimal, as_uuid, find_or_404

log = logging.getLogger(__name__)

KINDS = ("instances", "vcpus", "memory_mb", "groups", "managed_users")
UNLIMITED = -1

# The sandbox profile's values, generous for demos and load tests. libvirt's test
# driver reports a host of 16 CPUs and 3,072 MB: these ratios make it hold 10,240
# instances of 2 vCPU / 2 GiB (the sandbox must hold at least 2,000). A sandbox
# config written before these sections existed gets them too.
SANDBOX_LIMITS = {"instances": 10000, "vcpus": 20000, "memory_mb": 10000 * 2048, "groups": 1000,
                  "managed_users": 1000}
SANDBOX_CAPACITY = {"cpu_allocation_ratio": 1280.0, "ram_allocation_ratio": 7000.0, "reserved_host_memory_mb": 0}


def check_value(kind: str, value: object, *, where: str | None = None) -> int:
    """A limit: a whole number from 0, or -1 for no limit."""
    label = where or kind
    if isinstance(value, bool) or not isinstance(value, int) or value < UNLIMITED:
        raise InvalidInput(f"{label} must be a whole number from 0, or -1 for no limit; got {value!r}")
    return value


def number_or_none(convert, raw: str):
    """convert(raw) (int or float), or None where raw spells no such number."""
    try:
        return convert(raw)
    except ValueError:
        return None


def parse_limit(raw: str, where: str) -> int:
    """A [limits] key's text (controller/config.py reads the section with it)."""
    raw = raw.strip()
    value = number_or_none(int, raw)
    return check_value(where, raw if value is None else value, where=where)


def parse_ratio(raw: str, where: str) -> float:
    """[capacity] cpu_allocation_ratio or ram_allocation_ratio: a number above 0."""
    raw = raw.strip()
    value = number_or_none(float, raw)
    if value is None or not value > 0 or value == float("inf"):
        raise InvalidInput(f"{where} must be a number above 0, got {raw!r}")
    return value


def parse_reserved_mb(raw: str, where: str) -> int:
    """[capacity] reserved_host_memory_mb: a whole number of MB."""
    raw = raw.strip()
    reserved = as_decimal(raw)  # not str.isdigit(): "\u00b9" passed it and then failed int()
    if reserved is None or reserved < 0:
        raise InvalidInput(f"{where} must be a whole number of MB, got {raw!r}")
    return reserved


def defaults(config) -> dict[str, int]:
    """The [limits] section: what every user may hold unless overridden."""
    return {kind: getattr(config.limits, kind) for kind in KINDS}


def in_force(config, overrides: dict[str, int]) -> dict[str, int]:
    """The limits that apply to a user: its overrides over the config's defaults."""
    return {**defaults(config), **{k: v for k, v in overrides.items() if k in KINDS and v is not None}}


@dataclass(frozen=True)
class Ratios:
    cpu: float
    ram: float
    reserved_mb: int


def ratios(config) -> Ratios:
    """The [capacity] section."""
    capacity = config.capacity
    return Ratios(cpu=capacity.cpu_allocation_ratio, ram=capacity.ram_allocation_ratio,
                  reserved_mb=capacity.reserved_host_memory_mb)


def host_limits(config, *, vcpus: int, memory_mb: int) -> tuple[float, float]:
    """(vCPUs, memory MB) a host of `vcpus` CPUs and `memory_mb` may allocate by [capacity]."""
    r = ratios(config)
    return vcpus * r.cpu, (memory_mb - r.reserved_mb) * r.ram


def _reached(limit: int, used: int, wanted: int) -> bool:
    return limit != UNLIMITED and used + wanted > limit


def admit_owner(config, *, flavor: dict, overrides: dict, owned: dict) -> None:
    """Conflict, naming the limit, unless one more instance of `flavor` fits the owner's limits
    (`owned`: instances, vcpus, memory_mb it holds)."""
    limits = in_force(config, overrides)
    if _reached(limits["instances"], owned["instances"], 1):
        raise Conflict(f"limit reached: instances ({limits['instances']} per user)")
    if _reached(limits["vcpus"], owned["vcpus"], flavor["vcpu"]):
        raise Conflict(
            f"limit reached: vcpus ({limits['vcpus']} per user; {owned['vcpus']} in use, "
            f"flavor {flavor['name']} needs {flavor['vcpu']})"
        )
    if _reached(limits["memory_mb"], owned["memory_mb"], flavor["memory"]):
        raise Conflict(
            f"limit reached: memory_mb ({limits['memory_mb']} MB per user; {owned['memory_mb']} MB in use, "
            f"flavor {flavor['name']} needs {flavor['memory']} MB)"
        )


def host_room(config, *, flavor: dict, capacity, allocated: dict) -> tuple[str | None, float]:
    """(what the host is short of for one more instance of `flavor`: "vCPUs", "memory", or
    None when it fits; the memory MB it has free by the ratios) for a host of `capacity`
    (a HostCapacity) whose live instances allocate `allocated` (vcpus, memory_mb)."""
    cpu_limit, ram_limit = host_limits(config, vcpus=capacity.vcpus, memory_mb=capacity.memory_mb)
    free = ram_limit - allocated["memory_mb"]
    if allocated["vcpus"] + flavor["vcpu"] > cpu_limit:
        return "vCPUs", free
    if allocated["memory_mb"] + flavor["memory"] > ram_limit:
        return "memory", free
    return None, free


def admit_instance(config, *, flavor: dict, capacity, overrides: dict, owned: dict, allocated: dict) -> None:
    """Conflict, naming the limit, unless one more instance of `flavor` fits the owner's limits
    (admit_owner) and one host (`capacity`: a HostCapacity; `allocated`: vcpus and memory_mb
    of every live instance on it)."""
    admit_owner(config, flavor=flavor, overrides=overrides, owned=owned)
    r = ratios(config)
    cpu_limit = capacity.vcpus * r.cpu
    ram_limit = (capacity.memory_mb - r.reserved_mb) * r.ram
    # Clients learn which resource is short, not the host's totals; the log has those.
    if allocated["vcpus"] + flavor["vcpu"] > cpu_limit:
        log.warning("host capacity: %d vCPUs allocated of %g (%d CPUs, cpu_allocation_ratio %g); refused %d more",
                    allocated["vcpus"], cpu_limit, capacity.vcpus, r.cpu, flavor["vcpu"])
        raise Conflict(f"host capacity: not enough vCPUs for flavor {flavor['name']} ({flavor['vcpu']} vCPUs)")
    if allocated["memory_mb"] + flavor["memory"] > ram_limit:
        log.warning("host capacity: %d MB allocated of %g (%d MB, %d MB reserved, ram_allocation_ratio %g); "
                    "refused %d MB more", allocated["memory_mb"], ram_limit, capacity.memory_mb, r.reserved_mb,
                    r.ram, flavor["memory"])
        raise Conflict(f"host capacity: not enough memory for flavor {flavor['name']} ({flavor['memory']} MB)")


def admit_count(config, kind: str, *, overrides: dict, owned: int) -> None:
    """Conflict, naming the limit, unless the user may hold one more of `kind` (groups, managed_users)."""
    limit = in_force(config, overrides)[kind]
    if _reached(limit, owned, 1):
        raise Conflict(f"limit reached: {kind} ({limit} per user)")


# -- the admin's view (cloud-agent user limits) ------------------------------------
def limits_object(ctx, user: dict) -> dict:
    """What `cloud-agent --json user limits` prints: the limits in force for the user."""
    return {"userid": user["id"], "email": user["email"], **in_force(ctx.config, ctx.store.limit_overrides(user["id"]))}


def set_limits(ctx, user: dict, changes: dict[str, int | None], *, reset: bool = False) -> dict:
    """Store the given overrides (after dropping all of them with reset); return limits_object."""
    unknown = set(changes) - set(KINDS)
    if unknown:
        raise InvalidInput(f"unknown limits: {', '.join(sorted(unknown))}")
    given = {k: check_value(k, v) for k, v in changes.items() if v is not None}
    if given or reset:
        ctx.store.set_limit_overrides(user["id"], given, reset=reset)
    return limits_object(ctx, user)


# -- a user's own view (GET /v1/limits; a limit of -1 is no limit) ----------------
def usage_object(ctx, requester, *, cloudauth_id: str | None = None) -> dict:
    """The limits in force and what is held now, for the requester or a user it sees.

    A user the requester does not see is 404, as for the controller's resources (never 403).
    """
    if cloudauth_id is None:
        cloudauth_id = requester.id
    elif as_uuid(cloudauth_id) is None:
        raise InvalidInput("cloudauth-id must be a UUID")

    def visible(user_id: str) -> dict | None:
        user = ctx.store.get_user(user_id)
        return user if user is not None and perms.can_view_user(requester, user) else None

    user = find_or_404("user", cloudauth_id, visible)
    limits = in_force(ctx.config, ctx.store.limit_overrides(user["id"]))
    used = ctx.store.usage_of(user["id"])
    return {"cloudauth-id": user["id"], **{k: {"limit": limits[k], "used": used[k]} for k in KINDS}}
