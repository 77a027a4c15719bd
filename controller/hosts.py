"""Hypervisor hosts: the record, placement, and every instance's calls to its own host.

The config's `[libvirt] uri` is the host named `[libvirt] host_name`: its row
is written by `cloud-agent init`, at the service's start and, in a process
that did neither, before its first use here. Other hosts are added with
`cloud-agent host add`. Placement (CONTRACT.md section 9) runs inside the
transaction that inserts the instance (store.insert_instance's `place`).
See docs/scaling.md and docs/decisions.md.
"""

import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from controller import limits
from controller.config import HOST_NAME
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable, InvalidInput, NotFound
from controller.libvirt_uri import transport_risks
from controller.locks import one_at_a_time
from host_adapters.factory import config_host
from host_adapters.hosts import HostSpec
from host_adapters.hypervisor import HostCapacity, Hypervisor, base_file_limit

log = logging.getLogger(__name__)

# Hosts asked at once (statuses of a list, capacities, `host list`): a dead one costs
# one connect timeout, not one per host.
PARALLEL_HOSTS = 8


def spec_of(row: dict) -> HostSpec:
    return HostSpec(name=row["name"], uri=row["uri"], storage_pool=row["storage_pool"], network=row["network"])


def host_object(row: dict, *, reachable: bool) -> dict:
    """A host as `cloud-agent host ... --json` prints it (CONTRACT.md section 9)."""
    return {
        "name": row["name"],
        "uri": row["uri"],
        "enabled": bool(row["enabled"]),
        "reachable": reachable,
        "vcpus": row["vcpus"],
        "memory_mb": row["memory_mb"],
        "allocated_vcpus": row["allocated_vcpus"],
        "allocated_memory_mb": row["allocated_memory_mb"],
        "instances": row["instances"],
    }


# -- the config's own host --------------------------------------------------------------------
def record_config_host(ctx: Context) -> HostSpec:
    """Write the config's host row (made, or its uri, pool and network set)."""
    spec = config_host(ctx.config)
    ctx.store.upsert_config_host({"name": spec.name, "uri": spec.uri, "storage_pool": spec.storage_pool,
                                  "network": spec.network})
    ctx.adapters.hosts.config_host_recorded = True
    return spec


def _ensure_config_host(ctx: Context) -> None:
    if not ctx.adapters.hosts.config_host_recorded:
        record_config_host(ctx)


# -- one instance's host ----------------------------------------------------------------------
def hypervisor_of(ctx: Context, host_name: str) -> Hypervisor:
    """The Hypervisor of a host by name (an instance's `host`)."""
    pool = ctx.adapters.hosts
    built = pool.built(host_name)
    if built is not None:
        return built
    _ensure_config_host(ctx)
    row = ctx.store.get_host(host_name)
    if row is None:
        raise HostUnavailable(f"hypervisor host {host_name} is not recorded; see `cloud-agent host list`")
    return pool.hypervisor(spec_of(row))


def hypervisor_for(ctx: Context, row: dict) -> Hypervisor:
    """The Hypervisor of the host an instance row is recorded on."""
    return hypervisor_of(ctx, row["host"])


def each_host(names: Iterable[str], call: Callable[[str], object]) -> dict[str, object]:
    """call(name) for each host, several at once; name -> result, or the ControllerError it raised."""
    names = list(dict.fromkeys(names))
    if len(names) <= 1:
        out = {}
        for name in names:
            try:
                out[name] = call(name)
            except ControllerError as e:
                out[name] = e
        return out

    def guarded(name):
        try:
            return call(name)
        except ControllerError as e:
            return e

    with ThreadPoolExecutor(max_workers=min(PARALLEL_HOSTS, len(names))) as pool:
        return dict(zip(names, pool.map(guarded, names)))


# -- capacity ---------------------------------------------------------------------------------
def _read_capacity(ctx: Context, row: dict) -> HostCapacity:
    capacity = ctx.adapters.hosts.hypervisor(spec_of(row)).host_capacity()
    ctx.store.set_host_capacity(row["name"], vcpus=capacity.vcpus, memory_mb=capacity.memory_mb,
                                read_at=int(time.time()))
    return capacity


def _stale(ctx: Context, row: dict) -> bool:
    max_age = ctx.config.hosts.capacity_max_age_seconds
    return row["vcpus"] is None or row["capacity_read_at"] is None or time.time() - row["capacity_read_at"] > max_age


# -- placement --------------------------------------------------------------------------------
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
    _ensure_config_host(ctx)
    pool = ctx.adapters.hosts
    rescheduled = dict(failed or {})
    rows = ctx.store.list_hosts()
    candidates = [r for r in rows if r["enabled"] and pool.reachable(r["name"]) and r["name"] not in rescheduled]
    stale = {r["name"]: r for r in candidates if _stale(ctx, r)}
    fresh = each_host(stale, lambda name: _read_capacity(ctx, stale[name]))
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


# -- images on every host ---------------------------------------------------------------------
def ensure_image_on_host(ctx: Context, image: dict, host_name: str, *, progress=None) -> None:
    """The image's base volume is in the host's storage pool afterwards.

    A host that lacks it gets it over its libvirt connection: the content is read
    over a stream from a host that has it (the config's own host first), spooled
    to a private temporary file beside the database, and uploaded like `image add
    --source` (under a temporary name, checked, then published: a failure leaves no
    volume there, a crash only a temporary one reconcile reports).

    Creates of one image on one host look and copy one at a time: the others wait
    (at most [hosts] image_copy_wait_seconds, then 503) for the one copy and use it,
    never a copy in progress and never a second upload. The lock is this process's:
    the server makes every copy (a create), except `reconcile --fix`, which holds the
    host-change lock exclusive, so no create runs beside it.
    """
    wait = ctx.config.hosts.image_copy_wait_seconds
    busy = HostUnavailable(f"image {image['id']} is still being copied to host {host_name} after {wait} s; "
                           "try again later")
    with one_at_a_time("image-copy", f"{host_name}/{image['id']}", wait_seconds=wait, busy=busy):
        _copy_image_to_host(ctx, image, host_name, progress=progress)


def _copy_image_to_host(ctx: Context, image: dict, host_name: str, *, progress=None) -> None:
    target = hypervisor_of(ctx, host_name)
    if image["id"] in target.list_base_images():
        return
    _ensure_config_host(ctx)
    own = config_host(ctx.config).name
    pool = ctx.adapters.hosts
    sources = sorted((r for r in ctx.store.list_hosts() if r["name"] != host_name and pool.reachable(r["name"])),
                     key=lambda r: (r["name"] != own, r["name"]))
    spool_dir = os.path.dirname(os.path.abspath(ctx.store.path)) if ctx.store.path != ":memory:" else None
    errors = []
    for row in sources:
        source = pool.hypervisor(spec_of(row))
        fd, path = tempfile.mkstemp(prefix=".image-", suffix=".qcow2", dir=spool_dir)
        try:
            try:
                if image["id"] not in source.list_base_images():
                    continue
                log.info("copying image %s from host %s to host %s", image["id"], row["name"], host_name)
                kept = source.read_base_image(image["id"], fd, max_bytes=base_file_limit(image["min_disk"]))
            except ControllerError as e:
                errors.append(f"{row['name']}: {e.message}")
                continue
            # A host without content (the test driver) has a blank stand-in: so does the target.
            target.create_base_image(image["id"], size_gb=image["min_disk"], source=path if kept else None,
                                     progress=progress)
            return
        except Conflict:
            return  # another create uploaded it meanwhile
        finally:
            os.close(fd)
            os.unlink(path)
    raise HostError(f"image {image['id']} is on no reachable host to copy to host {host_name} from"
                    + (f" ({'; '.join(errors)})" if errors else ""))


# -- the admin's commands (cloud-agent host ...) ----------------------------------------------
def check_host_name(name: object) -> str:
    if not isinstance(name, str) or not HOST_NAME.fullmatch(name):
        raise InvalidInput(f"invalid host name {name!r}: must match {HOST_NAME.pattern}")
    return name


def _probe(ctx: Context, rows: list[dict]) -> dict[str, bool]:
    """Ask every host (several at once) for its capacity, recording it; name -> reachable."""
    by_name = {r["name"]: r for r in rows}
    answers = each_host(by_name, lambda name: _read_capacity(ctx, by_name[name]))
    reachable = {}
    for name, got in answers.items():
        reachable[name] = not isinstance(got, ControllerError)
        if not reachable[name]:
            log.warning("hypervisor host %s: %s", name, got.message)
    return reachable


def list_hosts(ctx: Context) -> list[dict]:
    """Every host, each asked now whether it answers (and its capacity read again)."""
    _ensure_config_host(ctx)
    reachable = _probe(ctx, ctx.store.list_hosts())
    # Read again: the probe recorded the capacities it read.
    return [host_object(r, reachable=reachable[r["name"]]) for r in ctx.store.list_hosts()]


def get_host(ctx: Context, name: str, *, probe: bool = True) -> dict:
    _ensure_config_host(ctx)
    row = ctx.store.get_host(check_host_name(name))
    if row is None:
        raise NotFound(f"no hypervisor host named {name}")
    reachable = _probe(ctx, [row])[name] if probe else ctx.adapters.hosts.reachable(name)
    return host_object(ctx.store.host_with_allocation(name), reachable=reachable)


def add_host(ctx: Context, *, name: str, uri: str, storage_pool: str | None = None,
             network: str | None = None, insecure: bool = False) -> dict:
    """Record a host after connecting to it: its pool and network must be usable and its
    capacity is read. An unreachable URI is refused (nothing recorded), and so is one whose
    transport is not encrypted and authenticated unless `insecure` (controller/libvirt_uri.py)."""
    _ensure_config_host(ctx)
    check_host_name(name)
    if not isinstance(uri, str) or not uri.strip() or any(c.isspace() for c in uri):
        raise InvalidInput(f"invalid libvirt URI {uri!r}")
    risks = transport_risks(uri)
    if risks and not insecure:
        raise InvalidInput(f"host {name} not added: {'; '.join(risks)}. Whoever can reach that traffic controls "
                           "the host's guests; --insecure accepts it on a network only trusted machines reach")
    spec = HostSpec(name=name, uri=uri, storage_pool=storage_pool or ctx.config.libvirt.storage_pool,
                    network=network or ctx.config.network.name)
    if ctx.store.get_host(name) is not None:
        raise Conflict(f"a hypervisor host named {name!r} exists")
    hv = ctx.adapters.hosts.hypervisor(spec)
    try:
        capacity = hv.host_capacity()
        hv.check()
    except HostError as e:
        ctx.adapters.hosts.forget(name)
        raise HostUnavailable(f"host {name} not added: {e.message}") from None
    ctx.store.insert_host({"name": name, "uri": spec.uri, "storage_pool": spec.storage_pool,
                           "network": spec.network, "vcpus": capacity.vcpus, "memory_mb": capacity.memory_mb,
                           "capacity_read_at": int(time.time())})
    return host_object(ctx.store.host_with_allocation(name), reachable=True)


def set_enabled(ctx: Context, name: str, enabled: bool) -> dict:
    """A disabled host takes no new instance; its instances keep running and answering."""
    _ensure_config_host(ctx)
    if not ctx.store.set_host_enabled(check_host_name(name), enabled):
        raise NotFound(f"no hypervisor host named {name}")
    return get_host(ctx, name)


def remove_host(ctx: Context, name: str) -> dict:
    """Forget a host that holds no instance (Conflict otherwise: nothing changes)."""
    _ensure_config_host(ctx)
    check_host_name(name)
    row = ctx.store.host_with_allocation(name)
    if row is None:
        raise NotFound(f"no hypervisor host named {name}")
    if name == config_host(ctx.config).name:
        raise Conflict(f"host {name} is the config's [libvirt] uri and comes back at every start; "
                       "disable it instead")
    ctx.store.delete_host(name)  # refuses, in its transaction, a host that holds instances
    ctx.adapters.hosts.forget(name)
    return host_object(row, reachable=ctx.adapters.hosts.reachable(name))
