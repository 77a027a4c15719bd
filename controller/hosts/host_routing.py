"""Which Hypervisor answers for a host or an instance, and asking several hosts at once.

The config's `[libvirt] uri` is the host named `[libvirt] host_name`: its row
is written by `cloud-agent init`, at the service's start and, in a process
that did neither, before its first use here. Other hosts are added with
`cloud-agent host add` (controller/hosts/host_records.py).
"""

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from controller.context import Context
from controller.errors import ControllerError, HostUnavailable
from host_adapters.factory import config_host
from host_adapters.host_pool import HostSpec
from host_adapters.hypervisor import Hypervisor

# Hosts asked at once (statuses of a list, capacities, `host list`): a dead one costs
# one connect timeout, not one per host.
PARALLEL_HOSTS = 8


def spec_of(row: dict) -> HostSpec:
    return HostSpec(name=row["name"], uri=row["uri"], storage_pool=row["storage_pool"], network=row["network"])


# -- the config's own host --------------------------------------------------------------------
def record_config_host(ctx: Context) -> HostSpec:
    """Write the config's host row (made, or its uri, pool and network set)."""
    spec = config_host(ctx.config)
    ctx.store.upsert_config_host({"name": spec.name, "uri": spec.uri, "storage_pool": spec.storage_pool,
                                  "network": spec.network})
    ctx.adapters.hosts.config_host_recorded = True
    return spec


def ensure_config_host(ctx: Context) -> None:
    if not ctx.adapters.hosts.config_host_recorded:
        record_config_host(ctx)


# -- one host's or one instance's Hypervisor -----------------------------------------------------
def hypervisor_of_host(ctx: Context, host_name: str) -> Hypervisor:
    """The Hypervisor of a host by its name."""
    pool = ctx.adapters.hosts
    built = pool.built(host_name)
    if built is not None:
        return built
    ensure_config_host(ctx)
    row = ctx.store.get_host(host_name)
    if row is None:
        raise HostUnavailable(f"hypervisor host {host_name} is not recorded; see `cloud-agent host list`")
    return pool.hypervisor(spec_of(row))


def hypervisor_of_instance(ctx: Context, row: dict) -> Hypervisor:
    """The Hypervisor of the host an instance row is recorded on (its `host`)."""
    return hypervisor_of_host(ctx, row["host"])


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
