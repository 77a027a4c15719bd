"""Hypervisor host records and the admin's commands on them (`cloud-agent host ...`).

The host a new instance goes to is picked by controller/placement.py; which Hypervisor
answers for a host is controller/host_routing.py. See docs/scaling.md and
docs/decisions.md.
"""

import logging
import time

from controller.config import HOST_NAME
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable, InvalidInput, NotFound
from controller.host_routing import each_host, ensure_config_host, spec_of
from controller.libvirt_uri import transport_risks
from host_adapters.factory import config_host
from host_adapters.host_pool import HostSpec
from host_adapters.hypervisor import HostCapacity

log = logging.getLogger(__name__)


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


def read_capacity(ctx: Context, row: dict) -> HostCapacity:
    """Ask the host for its CPUs and memory now and record them."""
    capacity = ctx.adapters.hosts.hypervisor(spec_of(row)).host_capacity()
    ctx.store.set_host_capacity(row["name"], vcpus=capacity.vcpus, memory_mb=capacity.memory_mb,
                                read_at=int(time.time()))
    return capacity


# -- the admin's commands (cloud-agent host ...) ----------------------------------------------
def check_host_name(name: object) -> str:
    if not isinstance(name, str) or not HOST_NAME.fullmatch(name):
        raise InvalidInput(f"invalid host name {name!r}: must match {HOST_NAME.pattern}")
    return name


def _probe(ctx: Context, rows: list[dict]) -> dict[str, bool]:
    """Ask every host (several at once) for its capacity, recording it; name -> reachable."""
    by_name = {r["name"]: r for r in rows}
    answers = each_host(by_name, lambda name: read_capacity(ctx, by_name[name]))
    reachable = {}
    for name, got in answers.items():
        reachable[name] = not isinstance(got, ControllerError)
        if not reachable[name]:
            log.warning("hypervisor host %s: %s", name, got.message)
    return reachable


def list_hosts(ctx: Context) -> list[dict]:
    """Every host, each asked now whether it answers (and its capacity read again)."""
    ensure_config_host(ctx)
    reachable = _probe(ctx, ctx.store.list_hosts())
    # Read again: the probe recorded the capacities it read.
    return [host_object(r, reachable=reachable[r["name"]]) for r in ctx.store.list_hosts()]


def get_host(ctx: Context, name: str, *, probe: bool = True) -> dict:
    ensure_config_host(ctx)
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
    ensure_config_host(ctx)
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
    ensure_config_host(ctx)
    if not ctx.store.set_host_enabled(check_host_name(name), enabled):
        raise NotFound(f"no hypervisor host named {name}")
    return get_host(ctx, name)


def remove_host(ctx: Context, name: str) -> dict:
    """Forget a host that holds no instance (Conflict otherwise: nothing changes)."""
    ensure_config_host(ctx)
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
