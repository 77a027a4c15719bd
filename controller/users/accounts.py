"""System accounts: enabling a cloud auth user on this cluster (the agent's `account` commands)."""

import logging
import os
from collections.abc import Callable

from controller.context import Context
from controller.errors import Conflict, InvalidInput, NotFound
from controller.users.groups import check_account_username, drop_member_everywhere
from controller.instances.guests import drop_account_everywhere
from controller.locks import host_changes
from controller.lookups import account_of, find_user, user_account
from controller.rules import new_id
from controller.store import utc_now
from host_adapters.names import check_username, privileged_group_name

log = logging.getLogger(__name__)

# Usernames no user's account may take, whether or not the host has them (yet): a package
# or a cluster node may make them later, and files, sudoers rules and services trust them.
# Debian's base-passwd accounts (passwd.master, Debian 12), then the service accounts
# that common packages, other distributions and HPC stacks make. An account's private
# group takes its name too, so every name reserved for groups (host_adapters/names.py,
# plus `[groups] refused_names`) is refused as well. Any other name the host's directory
# already holds below its first uid is refused by asking the directory (system_account).
SYSTEM_USERNAMES = frozenset({
    # base-passwd's passwd.master
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "_gnats", "nobody",
    # other distributions' and common packages' system accounts
    "adm", "operator", "halt", "shutdown", "ftp", "toor", "nfsnobody", "_apt", "messagebus", "sshd",
    "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump", "polkitd", "avahi",
    "colord", "dnsmasq", "libvirt-qemu", "libvirt-dnsmasq", "qemu", "postfix", "postgres", "mysql",
    "openldap", "nslcd", "sssd", "chrony", "_chrony", "ntp", "tss", "uuidd", "tcpdump", "statd", "rpc",
    "rpcuser", "_rpc", "usbmux", "pulse", "rtkit", "syslog", "ldap", "nscd", "dbus",
    # HPC services whose account can act for every user
    "slurm", "munge", "pbs", "torque", "lsfadmin",
})


def check_not_system_username(ctx: Context, username: str) -> None:
    """Refuse (400) the name of one of the system's own accounts: a reserved name
    (SYSTEM_USERNAMES, a group name reserved for its privileges) or a name the directory
    already holds below its first uid."""
    if (username in SYSTEM_USERNAMES or privileged_group_name(username, frozenset(ctx.config.groups.refused_names))
            or ctx.adapters.directory.system_account(username)):
        raise InvalidInput(f"{username} is a system account name; choose another")


def enable_account(ctx: Context, who: str, *, username: str, uid: int | None = None) -> dict:
    """Create the directory account of the user `who` (email or id) and record it; all or nothing."""
    check_username(username)
    check_not_system_username(ctx, username)
    check_account_username(ctx, username)
    user = find_user(ctx, who)
    email = user["email"]
    if account_of(ctx, user["id"]) is not None:
        raise Conflict(f"{email} already has a system account on this controller")
    if ctx.store.get_account_by_username(username) is not None:
        raise Conflict(f"system account {username} is already recorded")
    home = os.path.join(ctx.config.volumes.home_root, username)
    with host_changes(ctx):
        return _create(ctx, user, username, home, uid)


def _create(ctx: Context, user: dict, username: str, home: str, uid: int | None) -> dict:
    adapters, controller_id = ctx.adapters, ctx.config.controller_id
    posix = adapters.directory.create_account(username, home=home, uid=uid)
    account_id = new_id()
    registry = cloud_auth_registry(ctx)
    registered = False
    try:
        if registry is not None:
            # A cluster of a cloud auth serving several: the username is taken there first
            # (409 when another user holds it on this cluster); a refusal undoes the account.
            registry.register(username, user_id=user["id"], uuid=account_id, uid=posix.uid)
            registered = True
        if not user["active"]:  # an inactive user's account is born locked
            adapters.directory.lock_account(username)
        return ctx.store.insert_account(
            {
                "user_id": user["id"],
                "username": posix.username,
                "uuid": account_id,
                "uid": posix.uid,
                "gid": posix.gid,
                "home": posix.home,
                "cloud_controller_id": controller_id,
                "created_at_utc": utc_now(),
            }
        )
    except BaseException:
        if registered:
            _unregister_or_log(registry, username)
        adapters.directory.delete_account(username)
        raise


def cloud_auth_registry(ctx: Context):
    """The cloud auth this controller registers its accounts at, or None (a single node)."""
    if not ctx.config.cloud_auth.url:
        return None
    from controller.cloud_auth.client import CloudAuthClient, read_secret

    return CloudAuthClient(ctx.config, read_secret(ctx.config.cloud_auth.secret_file))


def _unregister_or_log(registry, username: str) -> None:
    try:
        registry.unregister(username)
    except Exception as e:  # noqa: BLE001 - the undo of an undo: said, not raised over the first error
        log.warning("cloud auth still lists the account %s of this cluster: %s", username, e)


def disable_account(ctx: Context, who: str) -> dict:
    """Remove the system account of the user `who` (email or id); refused while it still has a
    volume or owns instances."""
    user = find_user(ctx, who)
    email = user["email"]
    account = user_account(ctx, user)
    if ctx.store.volume_of_user(user["id"]) is not None:
        raise Conflict(f"{email} still has a storage volume: delete it first")
    if ctx.store.list_instances(visible_to=None, owner_id=user["id"]):
        raise Conflict(f"{email} still owns server-instances: delete them first")
    if ctx.store.list_groups(visible_to=None, owner_id=user["id"]):
        raise Conflict(f"{email} still owns groups: delete them first")
    registry = cloud_auth_registry(ctx)
    with host_changes(ctx):
        # The intent first: a crash half way is finished by reconcile, which never
        # re-creates an account an admin disabled.
        if not ctx.store.set_account_state(account["id"], "deleting", expect="ready"):
            raise Conflict(f"the system account of {email} is already being disabled")
        unregistered = False
        try:
            if registry is not None:
                # Cloud auth forgets the name on this cluster first: a refusal changes nothing.
                try:
                    registry.unregister(account["username"])
                    unregistered = True
                except NotFound:
                    pass  # not registered (made before this cluster joined a cloud auth)
            finish_disable(ctx, account)
        except BaseException:
            ctx.store.set_account_state(account["id"], "ready", expect="deleting")
            if unregistered:
                try:
                    registry.register(account["username"], user_id=account["user_id"], uuid=account["uuid"],
                                      uid=account["uid"])
                except Exception as e:  # noqa: BLE001 - said; the first error is the one raised
                    log.warning("cloud auth no longer lists the account %s of this cluster: %s",
                                account["username"], e)
            raise
    return account


def finish_disable(ctx: Context, account: dict) -> None:
    """Take the account out of every instance and group, remove it from the directory, drop its row."""
    drop_account_everywhere(ctx, account)
    drop_member_everywhere(ctx, account["username"])
    ctx.adapters.directory.delete_account(account["username"])
    ctx.store.delete_account(account["id"])


def follow_active(ctx: Context, user_id: str, active: int) -> Callable[[], None]:
    """Make the user's system account follow `active` (issue 8, finding 9): 0 locks it
    (no login of any kind; uid, files, groups and instances stay), above 0 unlocks it.

    Called before the user's row changes; returns the undo for when that change fails.
    A user without an account here, or a process without host adapters (the user
    interface served alone), changes nothing: `cloud-agent reconcile` reports and
    repairs the lock (`account-lock`).
    """
    account = account_of(ctx, user_id)
    if account is None or ctx.adapters is None:
        return lambda: None
    directory, username = ctx.adapters.directory, account["username"]
    posix = directory.get_account(username)
    if posix is None:  # reconcile reports account-missing
        return lambda: None
    if not active and not posix.locked:
        directory.lock_account(username)
        return lambda: directory.unlock_account(username)
    if active and posix.locked:
        directory.unlock_account(username)
        return lambda: directory.lock_account(username)
    return lambda: None
