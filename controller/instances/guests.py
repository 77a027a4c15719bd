"""What a guest is told (its spec: name, NICs, users, groups, homes), and every refresh
of guests after what they are told changed.

Guests learn who their users are from their seed at each boot (host_adapters/guests/seed.py):
a change of a user (deactivated, groups, home) rewrites the seeds and shares of its
instances at once, and a running guest applies it at its next boot. `cloud-agent user
apply` is the "now": each guest the user's account has access to is rebuilt, and the
running ones are power-cycled (issue 16, finding 9).

Below the resource modules: instances, accounts, groups, users and volumes refresh
guests through here, never through one another.
"""

import dataclasses
import logging

from controller.instances import instance_claims
from controller.addresses import hostname_for, network_plan, nics_of
from controller.context import Context
from controller.errors import Conflict, HostError, NotFound
from controller.hosts.host_routing import hypervisor_of_instance
from controller.locks import host_changes, one_at_a_time
from controller.lookups import account_of, user_account
from host_adapters.guests.guest import GuestGroup, GuestSpec, GuestUser

log = logging.getLogger(__name__)

# Statuses in which a QEMU process runs the guest with what it booted with.
_LIVE = ("running", "paused", "building")


# -- what a guest is told ---------------------------------------------------------------------
def guest_spec(ctx: Context, row: dict, account_uuids: list[str] | None = None) -> GuestSpec:
    """What the instance's guest is told: its name and NICs, and every active user with access
    (`account_uuids`, default the row's users) with uid, gid, groups and home.

    An inactive user stays on the instance's list (reactivation gives the access back) but
    is in no guest: no account in the seed, no share of its home (issue 16, finding 9)."""
    uuids = row["users"] if account_uuids is None else account_uuids
    accounts = [a for a in ctx.store.accounts_with_owners(uuids=list(uuids)) if a["user_active"]]
    mounts = ctx.store.volume_mount_points([a["user_id"] for a in accounts])
    memberships = ctx.store.group_names_of_members([a["username"] for a in accounts])
    sudo_owner = ctx.config.guest.sudo == "owner"
    group_names = sorted({g for names in memberships.values() for g in names})
    groups = []
    for name in group_names:
        gid = ctx.adapters.groups.gid(name)
        if gid is None:  # missing on the host; reconcile reports the group
            continue
        groups.append(GuestGroup(name=name, gid=gid))
    known = {g.name for g in groups}
    users = [
        GuestUser(
            username=a["username"],
            uid=a["uid"],
            gid=a["gid"],
            home=mounts.get(a["user_id"], a["home"]),
            mounted=a["user_id"] in mounts,
            groups=tuple(g for g in memberships.get(a["username"], []) if g in known),
            sudo=sudo_owner and a["user_id"] == row["owner_id"],
        )
        for a in accounts
    ]
    return GuestSpec(
        hostname=row.get("hostname") or hostname_for(row["id"], set()),
        nics=_on_host_network(ctx, row, nics_of(network_plan(ctx.config), row)),
        users=tuple(users),
        groups=tuple(groups),
    )


def _on_host_network(ctx: Context, row: dict, nics):
    """The private NICs on the libvirt network of the instance's host (each host names its own:
    the NAT network of a single node, or a bridged one on the nodes)."""
    host = ctx.store.get_host(row["host"]) if row.get("host") else None
    network = host["network"] if host else None
    if network is None or network == ctx.config.network.name:
        return nics
    return tuple(dataclasses.replace(n, network=network) if n.network else n for n in nics)


# -- refreshes after a change of accounts, volumes, groups or users ---------------------------
def refresh_guests(ctx: Context, account_uuids: list[str]) -> None:
    """Rebuild the guest (shares, seed) of every instance these accounts can access,
    after their volumes, groups or accounts changed.

    The change this follows has happened and stays; a guest that cannot be
    updated now is logged, and `cloud-agent reconcile` reports and repairs it.
    """
    instance_ids = ctx.store.instances_with_accounts(account_uuids)
    if not instance_ids:
        return
    for instance_id in instance_ids:
        with one_at_a_time("instance", instance_id):
            try:
                _claimed_or_deferred(ctx, instance_id, lambda i=instance_id: refresh_guest(ctx, i))
            except (NotFound, HostError) as e:
                log.warning("guest of instance %s not updated (reconcile will): %s", instance_id, e.message)


def refresh_guest(ctx: Context, instance_id: str) -> None:
    """Rebuild one instance's guest (shares, seed) from the database, on the host its row
    names (nothing for an instance deleted, or being created or deleted)."""
    rows = ctx.store.list_instances(visible_to=None, instance_id=instance_id)
    if rows:
        hypervisor_of_instance(ctx, rows[0]).set_guest(instance_id, guest_spec(ctx, rows[0]))


def _claimed_or_deferred(ctx: Context, instance_id: str, work, *, on_busy=None) -> None:
    """`work()` under the instance's claim; while another process holds it (a move copying
    the disk), `on_busy()` writes what the guest must get to the database and the holder is
    asked to rebuild the guest from it before it lets go instead: the change this follows is
    never lost, and never waits for a disk copy."""
    for _attempt in range(3):
        try:
            taken = instance_claims.claim(ctx, instance_id, "guest-refresh")
        except NotFound:
            return  # deleted meanwhile
        except Conflict:
            if on_busy is not None:
                on_busy()
            if instance_claims.defer_refresh(ctx, instance_id):
                return
            continue  # let go meanwhile: claimed again
        try:
            work()
        finally:
            instance_claims.release(ctx, taken, refresh=lambda: refresh_guest(ctx, instance_id))
        return
    log.warning("guest of instance %s not updated (reconcile will): its claim kept changing hands", instance_id)


def refresh_guests_of_usernames(ctx: Context, usernames) -> None:
    """refresh_guests for the accounts with these usernames (their groups changed): the
    guests of the instances they can access get their new group lists at next boot."""
    accounts = ctx.store.accounts_with_owners(usernames=sorted(set(usernames)))
    refresh_guests(ctx, [a["uuid"] for a in accounts])


def drop_account_everywhere(ctx: Context, account: dict) -> None:
    """Remove an account from the user lists (and guests) of every instance before it is disabled."""
    for instance_id in ctx.store.instances_with_account(account["uuid"]):
        with one_at_a_time("instance", instance_id):
            # Claimed elsewhere: the list is changed first, then its holder rebuilds the guest from it.
            _claimed_or_deferred(ctx, instance_id, lambda i=instance_id: _drop_account(ctx, i, account),
                                 on_busy=lambda i=instance_id: _drop_from_list(ctx, i, account))


def _drop_from_list(ctx: Context, instance_id: str, account: dict) -> None:
    row = ctx.store.find_instance(instance_id)
    if row is not None and account["uuid"] in row["users"]:
        ctx.store.set_instance_users(instance_id, [u for u in row["users"] if u != account["uuid"]])


def _drop_account(ctx: Context, instance_id: str, account: dict) -> None:
    row = ctx.store.find_instance(instance_id)
    if row is None:
        return
    users = [u for u in row["users"] if u != account["uuid"]]
    try:
        hypervisor_of_instance(ctx, row).set_guest(instance_id, guest_spec(ctx, row, users))
    except NotFound:
        pass
    ctx.store.set_instance_users(instance_id, users)


def refresh_guests_of_user(ctx: Context, user_id: str) -> None:
    """After the user's `active` changed: every guest its account has access to drops it
    (deactivated) or takes it back (reactivated), seed and home share, from that guest's
    next boot; `cloud-agent user apply` power-cycles running guests now (issue 16,
    finding 9). Without host adapters (the user interface served alone) nothing is done
    here: `cloud-agent reconcile` reports and repairs the seeds and shares."""
    account = account_of(ctx, user_id)
    if account is None or ctx.adapters is None:
        return
    with host_changes(ctx):
        refresh_guests(ctx, [account["uuid"]])


# -- `cloud-agent user apply`: now, power-cycling running guests ------------------------------
def instances_of_user(ctx: Context, user: dict) -> list[dict]:
    """The instances the user's system account has access to (owned or granted), by id, each
    with the host's `status` ("error" when the host does not answer)."""
    account = user_account(ctx, user)
    rows = []
    for instance_id in sorted(ctx.store.instances_with_account(account["uuid"])):
        found = ctx.store.list_instances(visible_to=None, instance_id=instance_id)
        if found:
            rows.append(dict(found[0], status=_status(ctx, found[0])))
    return rows


def _status(ctx: Context, row: dict) -> str:
    try:
        return hypervisor_of_instance(ctx, row).status(row["id"])
    except HostError:
        return "error"


def needs_cycle(row: dict) -> bool:
    return row["status"] in _LIVE


def apply_to_instances(ctx: Context, rows: list[dict], *, may_cycle: set[str]) -> list[dict]:
    """Rebuild each instance's guest (seed, shares) from the database and power-cycle those of
    `may_cycle` a QEMU process runs (the others boot with it next time). One result per
    instance: {"id", "hostname", "host", "status" (after), "cycled", "error" (absent when it
    worked)}; a host that fails one instance does not stop the others."""
    results = []
    with host_changes(ctx):
        for row in rows:
            result = {"id": row["id"], "hostname": row["hostname"], "host": row["host"], "cycled": False}
            with one_at_a_time("instance", row["id"]):
                try:
                    with instance_claims.held(ctx, row["id"], "user-apply",
                                              refresh=lambda i=row["id"]: refresh_guest(ctx, i)):
                        _apply_one(ctx, row, result, may_cycle)
                except (NotFound, HostError, Conflict) as e:
                    result.update(status=_status(ctx, row), error=e.message)
            results.append(result)
    return results


def _apply_one(ctx: Context, row: dict, result: dict, may_cycle: set[str]) -> None:
    instance_claims.refuse_while_moving(ctx, row["id"])
    current = ctx.store.list_instances(visible_to=None, instance_id=row["id"])
    if not current:
        raise NotFound(f"server-instance {row['id']} was deleted meanwhile")
    hypervisor = hypervisor_of_instance(ctx, current[0])
    hypervisor.set_guest(row["id"], guest_spec(ctx, current[0]))
    if row["id"] in may_cycle and hypervisor.status(row["id"]) in _LIVE:
        # Off and on again: a new QEMU process with the definition's shares
        # (a reset keeps the old ones) boots the guest with the new seed. Shut
        # down cleanly first, as a reboot is (power_tasks.py): no pulled plug.
        hypervisor.shut_down(row["id"], wait_seconds=ctx.config.guest.shutdown_timeout_seconds)
        hypervisor.power_on(row["id"])
        result["cycled"] = True
    result["status"] = hypervisor.status(row["id"])
    ctx.store.set_instance_status(row["id"], result["status"])
