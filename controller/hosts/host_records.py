"""Hypervisor host records and the admin's commands on them (`cloud-agent host ...`).

The host a new instance goes to is picked by controller/hosts/placement.py; which Hypervisor
answers for a host is controller/hosts/host_routing.py. See docs/scaling.md and
docs/decisions.md.
"""

import logging
import time

from common.words import HOST_NAME_RULE, quoted
from controller.config import HOST_NAME
from controller.context import Context
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable, InvalidInput, NotFound
from controller.hosts.host_routing import each_host, ensure_config_host, spec_of
from controller.hosts.libvirt_uri import transport_risks
from host_adapters.factory import config_host
from host_adapters.host_pool import HostSpec
from host_adapters.hypervisor import HostCapacity, HostIdentity

log = logging.getLogger(__name__)


def host_object(row: dict, *, reachable: bool) -> dict:
    """A host as `cloud-agent host ... --json` prints it."""
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


# -- which libvirt a record reaches: one libvirt, one record ------------------------------------
_ONE_LIBVIRT = ("one libvirt is one host: its domains and disks are the same whichever record names "
                "them, and a drain onto the second would destroy what it moves. (Two machines that report "
                "one host UUID, from cloned firmware, need host_uuid set in each libvirtd.conf.)")


def stored_identity(row: dict) -> HostIdentity | None:
    return HostIdentity(host_uuid=row["host_uuid"], pool_uuid=row["pool_uuid"]) if row.get("pool_uuid") else None


def read_identity(ctx: Context, row: dict) -> HostIdentity:
    """Ask the host which libvirt it is now (HostUnavailable when it does not answer)."""
    return ctx.adapters.hosts.hypervisor(spec_of(row)).identity()


def _identities(ctx: Context, rows: list[dict]) -> dict[str, HostIdentity]:
    """name -> identity: each host asked now (several at once), a host that does not answer
    by what was recorded of it (absent when nothing was). Records that had none get theirs."""
    by_name = {r["name"]: r for r in rows}
    answers = each_host(by_name, lambda name: read_identity(ctx, by_name[name]))
    found = {}
    for name, got in answers.items():
        if isinstance(got, HostIdentity):
            found[name] = got
            if stored_identity(by_name[name]) is None:
                try:
                    ctx.store.set_host_identity(name, host_uuid=got.host_uuid, pool_uuid=got.pool_uuid)
                except Conflict as e:
                    log.warning("hypervisor host %s: %s", name, e.message)
        elif stored_identity(by_name[name]) is not None:
            found[name] = stored_identity(by_name[name])
        else:
            log.warning("hypervisor host %s does not answer and its libvirt was never read: not compared", name)
    return found


def check_distinct(ctx: Context, name: str) -> HostIdentity:
    """Before a drain of host `name`: it still reaches the libvirt recorded for it, and no
    other record reaches that libvirt. Conflict otherwise (nothing is changed); its identity."""
    rows = ctx.store.list_hosts()
    row = next(r for r in rows if r["name"] == name)
    mine = read_identity(ctx, row)
    recorded = stored_identity(row)
    # Both changed: another libvirt. One alone is the same one (a libvirtd without a firmware
    # UUID makes a new host UUID at each start; a pool defined again has a new UUID): kept up.
    if recorded is not None and recorded.host_uuid != mine.host_uuid and recorded.pool_uuid != mine.pool_uuid:
        raise Conflict(f"host {name} ({row['uri']}) now reaches another libvirt than when it was added (host "
                       f"UUID {recorded.host_uuid or 'none'}, pool {recorded.pool_uuid}; now "
                       f"{mine.host_uuid or 'none'}, pool {mine.pool_uuid}); nothing was changed")
    others = _identities(ctx, [r for r in rows if r["name"] != name])
    same = sorted(other for other, identity in others.items() if identity.same_as(mine))
    if same:
        raise Conflict(f"host {name} and host {', '.join(same)} reach the same libvirt; {_ONE_LIBVIRT} Nothing "
                       f"was changed: `cloud-agent host remove` the record that holds no instance")
    if recorded != mine:
        ctx.store.set_host_identity(name, host_uuid=mine.host_uuid, pool_uuid=mine.pool_uuid)
    return mine


# -- the admin's commands (cloud-agent host ...) ----------------------------------------------
def check_host_name(name: object) -> str:
    if not isinstance(name, str) or not HOST_NAME.fullmatch(name):
        raise InvalidInput(f"invalid host name {quoted(name)}: {HOST_NAME_RULE}")
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
    transport is not encrypted and authenticated unless `insecure` (controller/hosts/libvirt_uri.py)."""
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
        identity = hv.identity()
    except HostError as e:
        ctx.adapters.hosts.forget(name)
        raise HostUnavailable(f"host {name} not added: {e.message}") from None
    # Records made before identities were kept are asked theirs now, so they are compared too.
    others = _identities(ctx, ctx.store.list_hosts())
    same = sorted(other for other, known in others.items() if known.same_as(identity))
    try:
        if same:
            other = ctx.store.get_host(same[0])
            raise Conflict(f"another record, host {same[0]} ({other['uri']}), reaches the same libvirt (host UUID "
                           f"{identity.host_uuid or 'none'}, storage pool UUID {identity.pool_uuid})")
        ctx.store.insert_host({"name": name, "uri": spec.uri, "storage_pool": spec.storage_pool,
                               "network": spec.network, "vcpus": capacity.vcpus, "memory_mb": capacity.memory_mb,
                               "capacity_read_at": int(time.time()), "host_uuid": identity.host_uuid,
                               "pool_uuid": identity.pool_uuid})
    except Conflict as e:
        ctx.adapters.hosts.forget(name)
        if e.message.startswith("a hypervisor host named"):
            raise
        raise Conflict(f"host {name} not added: {e.message}; {_ONE_LIBVIRT}") from None
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
