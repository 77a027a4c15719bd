"""cloud-agent host: the hypervisor hosts instances are placed on."""

import sys

import click

from agent.common import Options, command_options, emit, end_status_line, status_line, table
from controller.maintenance import drain, evacuate
from controller.hosts import host_records
from controller.hosts.libvirt_uri import transport_risks


def _line(h: dict) -> str:
    state = ("enabled" if h["enabled"] else "disabled") + ("" if h["reachable"] else ", UNREACHABLE")
    capacity = f"{h['vcpus']} CPUs, {h['memory_mb']} MB" if h["vcpus"] is not None else "capacity unknown"
    return (f"{h['name']:<16} {h['uri']}  [{state}]  {capacity}; allocated {h['allocated_vcpus']} vCPUs, "
            f"{h['allocated_memory_mb']} MB; {h['instances']} instances")


@click.group("host")
def host():
    """Manage the hypervisor hosts instances are placed on (the config's [libvirt] uri is one)."""


@host.command("add")
@click.argument("name")
@click.option("--uri", required=True, help="libvirt URI of the host, e.g. qemu+ssh://root@node01/system.")
@click.option("--storage-pool", default=None, help="Its storage pool (default: [libvirt] storage_pool).")
@click.option("--network", default=None,
              help="Its libvirt network for the private NIC, e.g. a bridged one (default: [network] name).")
@click.option("--insecure", is_flag=True, default=False,
              help="Accept a transport that is not encrypted and authenticated (qemu+tcp:// without auth=sasl, "
                   "no_verify=1, ...), with a warning.")
@command_options
def host_add(opts: Options, name, uri, storage_pool, network, insecure):
    """Add a hypervisor host: connects to it, checks its pool and network and reads its CPUs and memory.
    An unreachable URI is refused, and so is an unencrypted or unverified transport (qemu+tcp://
    without auth=sasl, ext, no_verify=1, known_hosts_verify=auto|ignore, a weak tls_priority)
    unless --insecure. One libvirt is one host: another record of a libvirt already added (the
    same URI again, or another URI for it: told by its host UUID or its pool's UUID) is
    refused. Images reach the host on first use there.

    \b
    Examples:
      cloud-agent host add node01 --uri qemu+ssh://root@node01/system --network cc-bridge
      cloud-agent host add node02 --uri qemu+tls://node02/system --storage-pool vms
    """
    if insecure:
        for risk in transport_risks(uri):
            click.echo(f"warning: host {name}: {risk}", err=True)
    obj = host_records.add_host(opts.context(adapters=True), name=name, uri=uri, storage_pool=storage_pool,
                         network=network, insecure=insecure)
    emit(opts, obj, _line(obj))


@host.command("list")
@command_options
def host_list(opts: Options):
    """List the hosts: capacity, what is allocated, instances, and whether each answers now.

    Example: cloud-agent host list --json
    """
    found = host_records.list_hosts(opts.context(adapters=True))
    emit(opts, {"hosts": found}, table(found, [
        ("NAME", lambda h: h["name"]), ("URI", lambda h: h["uri"]),
        ("STATE", lambda h: ("enabled" if h["enabled"] else "disabled") + ("" if h["reachable"] else ",unreachable")),
        ("VCPUS", lambda h: h["vcpus"]), ("MEMORY-MB", lambda h: h["memory_mb"]),
        ("ALLOC-VCPUS", lambda h: h["allocated_vcpus"]), ("ALLOC-MB", lambda h: h["allocated_memory_mb"]),
        ("INSTANCES", lambda h: h["instances"])]))


def _enabling(enabled: bool):
    @click.argument("name")
    @command_options
    def command(opts: Options, name):
        obj = host_records.set_enabled(opts.context(adapters=True), name, enabled)
        emit(opts, obj, _line(obj))

    return command


host.command("enable", help="Let new instances be placed on a host again.\n\nExample: cloud-agent host enable node01")(
    _enabling(True))
host.command("disable", help="Place no new instance on a host; its instances keep running.\n\n"
                             "Example: cloud-agent host disable node01")(_enabling(False))


@host.command("remove")
@click.argument("name")
@command_options
def host_remove(opts: Options, name):
    """Forget a host. Refused (nothing changes) while it holds instances, and for the config's own host.

    Example: cloud-agent host remove node01
    """
    obj = host_records.remove_host(opts.context(adapters=True), name)
    emit(opts, obj, f"removed host {name}")


@host.command("evacuate")
@click.argument("name")
@click.option("--host-is-down", is_flag=True, default=False,
              help="Say that the host is dead and fenced (powered off or cut off for good): required.")
@command_options
def host_evacuate(opts: Options, name, host_is_down):
    """Rebuild every instance of a dead host on other hosts, from its image: same id, hostname,
    addresses and users; the root disk is lost with the host (homes are on the cluster
    filesystem). The host is disabled first. Refused while the host answers, and when the
    other hosts lack room (nothing changes). Running it again finishes an evacuation cut
    short. Exit 0 only when every instance was rebuilt; then `host remove NAME`.

    \b
    Example:
      cloud-agent host evacuate node01 --host-is-down
    """
    progress = status_line(opts, "evacuate")
    try:
        result = evacuate.evacuate(opts.context(adapters=True), name, host_is_down=host_is_down, progress=progress)
    finally:
        end_status_line(progress)
    lines = [f"rebuilt {r['id']} on {r['to']}" for r in result["rebuilt"]]
    lines += [f"kept {k['id']} on {k['to']} with its own disk (a move to or from {name})"
              for k in result.get("kept", [])]
    lines += [f"FAILED {f['id']}: {f['error']}" for f in result["failed"]]
    lines.append(f"host {name}: {len(result['rebuilt'])} rebuilt, {len(result['failed'])} failed"
                 + ("" if result["failed"] else f"; `cloud-agent host remove {name}` forgets it"))
    emit(opts, result, "\n".join(lines))
    if result["failed"]:
        sys.exit(1)


@host.command("drain")
@click.argument("name")
@click.option("--abandon", is_flag=True, default=False,
              help="Give up the unfinished moves off the host instead (a target that died): each instance "
                   "stays on the host with its own disk, started again if it ran.")
@command_options
def host_drain(opts: Options, name, abandon):
    """Move every instance of a host to other hosts with room, for maintenance: the host is
    disabled first, then each instance is shut down (ACPI, then powered off after [hosts]
    shutdown_wait_seconds), its disk copied and its domain defined on the new host with the
    same id, hostname, addresses and users, and started there if it ran. Refused when the
    host does not answer (a dead host is evacuated), when another record reaches the same
    libvirt or it now reaches another libvirt than when it was added, and when the others
    lack room (nothing changes). Running it again finishes a drain cut short. Exit 0 only when the host holds
    no instance afterwards; `host enable NAME` takes it back after the maintenance.

    With --abandon, the moves a drain cut short are given up instead (their target died):
    each instance stays on NAME with its own disk and runs again if it ran; what the target
    holds is removed (by reconcile once it answers again). A move already committed is the
    target's: drain again finishes it, or, that host being dead and fenced, `host evacuate
    TARGET --host-is-down` returns the instance to its disk on NAME. Exit 0 only when every
    move was given up. JSON: {"host", "abandoned": [{"id", "host"}], "failed": [{"id", "error"}]}.

    \b
    Examples:
      cloud-agent host drain node01
      cloud-agent host drain node01 --abandon
    """
    ctx = opts.context(adapters=True)
    if abandon:
        _abandon(opts, ctx, name)
        return
    progress = status_line(opts, "drain")
    try:
        result = drain.drain(ctx, name, progress=progress)
    finally:
        end_status_line(progress)
    held = ctx.store.host_with_allocation(name)["instances"]
    lines = [f"moved {m['id']} to {m['to']}" for m in result["moved"]]
    lines += [f"FAILED {f['id']}: {f['error']}" for f in result["failed"]]
    lines.append(f"host {name}: {len(result['moved'])} moved, {len(result['failed'])} failed, {held} left"
                 + ("" if held else f"; `cloud-agent host enable {name}` after the maintenance"))
    emit(opts, result, "\n".join(lines))
    if held or result["failed"]:
        sys.exit(1)


def _abandon(opts: Options, ctx, name) -> None:
    progress = status_line(opts, "drain --abandon")
    try:
        result = drain.abandon(ctx, name, progress=progress)
    finally:
        end_status_line(progress)
    lines = [f"abandoned the move of {a['id']}: it stays on {a['host']}" for a in result["abandoned"]]
    lines += [f"FAILED {f['id']}: {f['error']}" for f in result["failed"]]
    lines.append(f"host {name}: {len(result['abandoned'])} moves abandoned, {len(result['failed'])} failed")
    emit(opts, result, "\n".join(lines))
    if result["failed"]:
        sys.exit(1)


def register(cli) -> None:
    cli.add_command(host)
