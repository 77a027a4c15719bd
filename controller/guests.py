"""A user's changes applied to running guests now (`cloud-agent user apply`).

Guests learn who their users are from their seed at each boot (host_adapters/seed.py):
a change of a user (deactivated, groups, home) rewrites the seeds and shares of its
instances at once, and a running guest applies it at its next boot. This module is the
"now": each guest the user's account has access to is rebuilt, and the running ones are
power-cycled (issue 16, finding 9).
"""

from controller.context import Context
from controller.errors import HostError, NotFound
from controller.hosts import hypervisor_for
from controller.locks import host_changes, one_at_a_time

# Statuses in which a QEMU process runs the guest with what it booted with.
_LIVE = ("running", "paused", "building")


def instances_of_user(ctx: Context, user: dict) -> list[dict]:
    """The instances the user's system account has access to (owned or granted), by id, each
    with the host's `status` ("error" when the host does not answer)."""
    account = ctx.store.account_of_user(user["id"], ctx.config.controller_id)
    if account is None:
        raise NotFound(f"{user['email']} has no system account on this controller")
    rows = []
    for instance_id in sorted(ctx.store.instances_with_account(account["uuid"])):
        found = ctx.store.list_instances(visible_to=None, instance_id=instance_id)
        if found:
            rows.append(dict(found[0], status=_status(ctx, found[0])))
    return rows


def _status(ctx: Context, row: dict) -> str:
    try:
        return hypervisor_for(ctx, row).status(row["id"])
    except HostError:
        return "error"


def needs_cycle(row: dict) -> bool:
    return row["status"] in _LIVE


def apply_to_instances(ctx: Context, rows: list[dict], *, may_cycle: set[str]) -> list[dict]:
    """Rebuild each instance's guest (seed, shares) from the database and power-cycle those of
    `may_cycle` a QEMU process runs (the others boot with it next time). One result per
    instance: {"id", "hostname", "host", "status" (after), "cycled", "error" (absent when it
    worked)}; a host that fails one instance does not stop the others."""
    from controller.instances import guest_spec

    results = []
    with host_changes(ctx):
        for row in rows:
            result = {"id": row["id"], "hostname": row["hostname"], "host": row["host"], "cycled": False}
            with one_at_a_time("instance", row["id"]):
                try:
                    current = ctx.store.list_instances(visible_to=None, instance_id=row["id"])
                    if not current:
                        raise NotFound(f"server-instance {row['id']} was deleted meanwhile")
                    hypervisor = hypervisor_for(ctx, current[0])
                    hypervisor.set_guest(row["id"], guest_spec(ctx, current[0]))
                    if row["id"] in may_cycle and hypervisor.status(row["id"]) in _LIVE:
                        # Off and on again: a new QEMU process with the definition's shares
                        # (a reset keeps the old ones) boots the guest with the new seed.
                        hypervisor.power_off(row["id"])
                        hypervisor.power_on(row["id"])
                        result["cycled"] = True
                    result["status"] = hypervisor.status(row["id"])
                    ctx.store.set_instance_status(row["id"], result["status"])
                except (NotFound, HostError) as e:
                    result.update(status=_status(ctx, row), error=e.message)
            results.append(result)
    return results
