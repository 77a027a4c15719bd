"""Placement: which host a new instance goes to.

It runs inside the transaction that inserts the instance (store.insert_instance's
`place`). See docs/scaling.md and docs/decisions.md.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable

from controller import limits
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostUnavailable
from controller.hosts.host_records import read_capacity
from controller.hosts.host_routing import each_host, ensure_config_host
from host_adapters.hypervisor import HostCapacity

log = logging.getLogger(__name__)


def capacity_stale(ctx: Context, row: dict) -> bool:
    """The host's recorded capacity is missing or older than [hosts] capacity_max_age_seconds."""
    max_age = ctx.config.hosts.capacity_max_age_seconds
    return row["vcpus"] is None or row["capacity_read_at"] is None or time.time() - row["capacity_read_at"] > max_age


def placement(ctx: Context, flavor: dict, *, failed: dict[str, str] | None = None) -> Callable[[list[dict]], str]:
    """The `place` callback of store.insert_instance for one instance of `flavor`.

    Host capacities older than [hosts] capacity_max_age_seconds are read first, here,
    outside the write transaction (a libvirt call must not hold the database's lock).
    The callback, inside it, picks among the enabled, reachable hosts with room (by
    [capacity], against each host's CPUs and memory and what its live instances
    allocate) the one with the most free memory (ties: by name).

    `failed` (host name -> why) are hosts an earlier attempt of this create was placed on
    and that did not answer (a reschedule): they are left out, and when no other host
    has room the create is 503, not 409: the cluster is not full, a host is down.
    """
    ensure_config_host(ctx)
    pool = ctx.adapters.hosts
    rescheduled = dict(failed or {})
    rows = ctx.store.list_hosts()
    candidates = [r for r in rows if r["enabled"] and pool.reachable(r["name"]) and r["name"] not in rescheduled]
    stale = {r["name"]: r for r in candidates if capacity_stale(ctx, r)}
    fresh = each_host(stale, lambda name: read_capacity(ctx, stale[name]))
    usable: dict[str, HostCapacity] = {}
    failed = dict(rescheduled)
    for r in candidates:
        got = fresh.get(r["name"])
        if isinstance(got, ControllerError):
            failed[r["name"]] = got.message
        elif got is not None:
            usable[r["name"]] = got
        else:
            usable[r["name"]] = HostCapacity(vcpus=r["vcpus"], memory_mb=r["memory_mb"])
    unreachable = [r["name"] for r in rows
                   if r["enabled"] and not pool.reachable(r["name"]) and r["name"] not in rescheduled]
    disabled = [r["name"] for r in rows if not r["enabled"]]
    what = f"{flavor['name']}: {flavor['vcpu']} vCPU{'s' if flavor['vcpu'] != 1 else ''}, {flavor['memory']} MB"

    def place(hosts: list[dict]) -> str:
        short: Counter[str] = Counter()
        best = None
        for h in hosts:
            capacity = usable.get(h["name"])
            if capacity is None:
                continue
            reason, free = limits.host_room(ctx.config, flavor=flavor, capacity=capacity,
                                            allocated={"vcpus": h["allocated_vcpus"],
                                                       "memory_mb": h["allocated_memory_mb"]})
            if reason is not None:
                short[reason] += 1
                continue
            if best is None or (-free, h["name"]) < best[0]:
                best = ((-free, h["name"]), h["name"])
        if best is not None:
            return best[1]
        if rescheduled:
            why = "; ".join(f"{n}: {m}" for n, m in sorted(rescheduled.items()))
            raise HostUnavailable(f"no live hypervisor host has room for this flavor ({what}): the host(s) it was "
                                  f"placed on did not answer ({why})")
        if not usable and (failed or unreachable):
            # Nothing says the cluster is full: the hosts that could take it do not answer.
            why = "; ".join(f"{n}: {m}" for n, m in sorted(failed.items())) or "marked unreachable"
            names = sorted({*failed, *unreachable})
            raise HostUnavailable(f"no hypervisor host is reachable for this flavor ({what}); "
                                  f"unreachable: {', '.join(names)} ({why})")
        parts = [f"{n} host{'s' if n > 1 else ''} short of {k}" for k, n in sorted(short.items())]
        if unreachable or failed:
            parts.append(f"unreachable: {', '.join(sorted({*failed, *unreachable}))}")
        if disabled:
            parts.append(f"disabled: {', '.join(disabled)}")
        if short:
            log.warning("placement: no host has room for flavor %s (%s)", flavor["name"], "; ".join(parts))
        raise Conflict(f"no hypervisor host has room for this flavor ({what}; {'; '.join(parts) or 'no host'})")

    return place


def refuse_without_room(ctx: Context, name: str, rows: list[dict], *, done: str) -> None:
    """Placement tried for every instance of host `name` (evacuated, drained: `done`) against
    what the other hosts hold, before anything changes: Conflict naming how much is missing
    when some would find no room."""
    flavors = {r["flavor_id"]: ctx.store.get_flavor(r["flavor_id"]) for r in rows}
    places = {fid: placement(ctx, f, failed={name: f"being {done}"}) for fid, f in flavors.items()}
    simulated = [dict(h) for h in ctx.store.list_hosts() if h["name"] != name]
    by_name = {h["name"]: h for h in simulated}
    short = Counter()
    for r in rows:
        flavor = flavors[r["flavor_id"]]
        try:
            picked = by_name[places[r["flavor_id"]](simulated)]
        except ControllerError:
            short["instances"] += 1
            short["vCPUs"] += flavor["vcpu"]
            short["MB"] += flavor["memory"]
            continue
        picked["allocated_vcpus"] += flavor["vcpu"]
        picked["allocated_memory_mb"] += flavor["memory"]
    if short:
        raise Conflict(f"host {name} not {done}: the other hosts lack room for {short['instances']} of its "
                       f"{len(rows)} instance(s) ({short['vCPUs']} vCPUs and {short['MB']} MB missing); "
                       "nothing was changed")
