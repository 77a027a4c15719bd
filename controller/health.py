"""Health checks shared by GET /healthz and `cloud-agent check`."""

import sqlite3

from controller.context import Context
from controller.errors import ControllerError
from controller.security import SecretBox


def run_checks(ctx: Context, *, thorough: bool = False) -> list[dict]:
    """Every check the service depends on, each {"name", "ok", "detail"}.

    thorough (the agent's `check`) adds what costs a real guest start: whether
    QEMU starts a guest with the configured virt_type and cpu_mode; and, on a local
    QEMU host, whether its virtiofsd can confine a home's share to the home's owner.
    """
    results = []

    def record(name, fn):
        try:
            said = fn()  # a check that passes may say something worth knowing
            results.append({"name": name, "ok": True, "detail": said if isinstance(said, str) else ""})
        except (ControllerError, sqlite3.Error, OSError) as e:
            results.append({"name": name, "ok": False, "detail": getattr(e, "message", None) or str(e)})

    record("database", ctx.store.ping)
    # Read the key file anew: a key deleted under a running service must show here,
    # not only at the next restart.
    record("secret_key", lambda: SecretBox(ctx.config.get("auth", "secret_key_file")))
    if ctx.adapters is not None:
        for name, check in ctx.adapters.checks():
            record(name, check)
        if thorough:
            record("guest_start", ctx.adapters.hypervisor.probe_guest)
            if ctx.adapters.shares is not None:
                # Passes whether or not shares can be confined: it says which holds here.
                record("virtiofs", ctx.adapters.shares.describe)
            results.extend(_other_hosts(ctx))
    return results


def _other_hosts(ctx: Context) -> list[dict]:
    """One check per hypervisor host besides the config's own (checked as "libvirt"):
    reachable, its storage pool, its network. Whether the cluster filesystem holding
    [volumes] home_root is mounted there libvirt cannot tell: the detail says so."""
    from controller import hosts

    try:
        own = hosts.record_config_host(ctx).name
        rows = [r for r in ctx.store.list_hosts() if r["name"] != own]
    except (ControllerError, sqlite3.Error):
        return []  # no host records to read: the database check above says why
    home_root = ctx.config.get("volumes", "home_root")
    answers = hosts.each_host((r["name"] for r in rows),
                              lambda name: hosts.hypervisor_of(ctx, name).check())
    out = []
    for row in rows:
        got = answers[row["name"]]
        note = (f"{home_root} not checked there (libvirt cannot see a node's filesystems): the cluster "
                "filesystem must be mounted at that path, with virtiofsd installed and the same uids")
        if isinstance(got, ControllerError):
            out.append({"name": f"host {row['name']}", "ok": False, "detail": f"{row['uri']}: {got.message}"})
        else:
            out.append({"name": f"host {row['name']}", "ok": True,
                        "detail": f"{row['uri']}: reachable, pool {row['storage_pool']} and network "
                                  f"{row['network']} usable{'' if row['enabled'] else ' (disabled)'}; {note}"})
    return out
