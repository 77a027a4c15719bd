"""cloud-agent account / image / flavor / volume: what feeds the controller interface."""

import sys

import click

from agent.common import (Options, command_options, confirm, email_of, emit, require_one_user, table,
                          target_user, user_argument, yes_no)
from controller.users import accounts
from controller.storage import images, volumes
from controller.instances import instance_table
from controller.users.users import account_object


# -- account ---------------------------------------------------------------------
@click.group("account")
def account():
    """Enable or disable a user's system account."""


@account.command("enable")
@user_argument
@click.option("--username", required=True, help="System username: 1 to 32 characters: lowercase letters, "
              "digits, - and _, starting with a letter or _.")
@click.option("--uid", type=int, default=None, help="uid to use; default: the directory allocates one.")
@command_options
def account_enable(opts: Options, email, userid, username, uid):
    """Create the system account of a user (by EMAIL or --userid) in the configured directory and record it.

    \b
    Examples:
      cloud-agent account enable alice@example.org --username alice
      cloud-agent account enable --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 --username alice
    """
    with target_user(opts, email, userid, adapters=True) as user:
        row = accounts.enable_account(opts.context(), user["id"], username=username, uid=uid)
    emit(opts, account_object(row),
         f"enabled {username} (uid {row['uid']}) for {user['email']}, user id {row['uuid']}")


@account.command("disable")
@user_argument
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@command_options
def account_disable(opts: Options, email, userid, yes):
    """Remove a user's system account, by EMAIL or --userid (refused while the user has a volume,
    instances or groups).

    \b
    Examples:
      cloud-agent account disable alice@example.org --yes
      cloud-agent account disable --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 --yes
    """
    require_one_user(email, userid)
    # Asked before the user is looked up, so a prompt left open holds no reservation.
    confirm(opts, yes, f"Remove the system account of {email or f'user {userid}'}?")
    with target_user(opts, email, userid, adapters=True) as user:
        row = accounts.disable_account(opts.context(), user["id"])
    emit(opts, account_object(row), f"disabled {row['username']} for {user['email']}")


# -- image ----------------------------------------------------------------------------
@click.group("image")
def image():
    """Register and manage server-images."""


def _progress(opts: Options):
    if opts.as_json or not sys.stderr.isatty():
        return None

    def show(sent: int, total: int) -> None:
        pct = 100 * sent // total if total else 100
        click.echo(f"\ruploading: {pct:3d}% ({sent >> 20} of {total >> 20} MiB)", err=True, nl=sent >= total)

    return show


@image.command("add")
@click.option("--name", required=True)
@click.option("--os-name", required=True)
@click.option("--os-major", required=True)
@click.option("--os-minor", required=True)
@click.option("--min-disk", type=int, required=True, help="GB; also the size of a blank base disk.")
@click.option("--min-ram", type=int, required=True, help="MB.")
@click.option("--private", is_flag=True, help="Only users granted with `image grant` may use it.")
@click.option("--inactive", is_flag=True, help="Listed, but new instances cannot boot from it.")
@click.option("--source", type=click.Path(exists=True, dir_okay=False), default=None,
              help="qcow2 file to upload as the base disk; default: a blank disk of --min-disk GB.")
@command_options
def image_add(opts: Options, name, os_name, os_major, os_minor, min_disk, min_ram, private, inactive, source):
    """Register a server-image.

    Example: cloud-agent image add --name "Debian 12" --os-name debian --os-major 12 --os-minor 7 --min-disk 2 --min-ram 512
    """
    obj = images.add_image(
        opts.context(adapters=True), name=name, os_name=os_name, os_major=os_major, os_minor=os_minor,
        min_disk=min_disk, min_ram=min_ram, public=not private, active=not inactive, source=source,
        progress=_progress(opts),
    )
    emit(opts, obj, f"image {obj['id']} ({name})")


@image.command("grant")
@click.argument("image_id")
@user_argument
@command_options
def image_grant(opts: Options, image_id, email, userid):
    """Let a user (by EMAIL or --userid) boot from a private image.

    \b
    Examples:
      cloud-agent image grant 3f0c... alice@example.org
      cloud-agent image grant 3f0c... --userid 1b4e28ba-2fa1-11d2-883f-0016d3cca427
    """
    with target_user(opts, email, userid) as user:
        obj = images.grant_image(opts.context(), image_id, user["id"])
    emit(opts, obj, f"{user['email']} may use image {obj['id']} ({obj['name']})")


def _activation(active: bool):
    @click.argument("image_id")
    @command_options
    def command(opts: Options, image_id):
        obj = images.set_image_active(opts.context(), image_id, active)
        emit(opts, obj, f"image {obj['id']} ({obj['name']}) {'active' if active else 'inactive'}")

    return command


image.command("activate", help="Allow new instances from an image.\n\nExample: cloud-agent image activate 3f0c...")(
    _activation(True))
image.command("deactivate", help="Refuse new instances from an image.\n\nExample: cloud-agent image deactivate 3f0c...")(
    _activation(False))


@image.command("list")
@command_options
def image_list(opts: Options):
    """List every image: active or not, public or private.

    Example: cloud-agent image list --json
    """
    found = images.list_all_images(opts.context())
    emit(opts, {"images": found}, table(found, [
        ("ID", lambda i: i["id"]), ("NAME", lambda i: i["name"]),
        ("OS", lambda i: "{name} {major_version}.{minor_version}".format(**i["operating-system"])),
        ("MIN-DISK", lambda i: i["min-disk"]), ("MIN-RAM", lambda i: i["min-ram"]),
        ("PUBLIC", lambda i: yes_no(i["public"])), ("ACTIVE", lambda i: yes_no(i["active"]))]))


@image.command("update")
@click.argument("image_id", metavar="IMAGE")
@click.option("--name", default=None, help="A new name (unique among active images).")
@click.option("--os-name", default=None)
@click.option("--os-major", default=None)
@click.option("--os-minor", default=None)
@click.option("--min-ram", type=int, default=None, help="MB.")
@click.option("--public/--private", default=None, help="Whether every user may use it.")
@command_options
def image_update(opts: Options, image_id, name, os_name, os_major, os_minor, min_ram, public):
    """Change an image's name, operating system version, min-ram or visibility (by id or name).

    \b
    Example:
      cloud-agent image update "Debian 12" --os-minor 8
    """
    obj = images.update_image(opts.context(), image_id, name=name, os_name=os_name, os_major=os_major,
                              os_minor=os_minor, min_ram=min_ram, public=public)
    emit(opts, obj, f"image {obj['id']} ({obj['name']}) updated")


@image.command("delete")
@click.argument("image_id", metavar="IMAGE")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@command_options
def image_delete(opts: Options, image_id, yes):
    """Forget an image and remove its base disk from every host (by id or name); refused while a
    server-instance uses it.

    \b
    Example:
      cloud-agent image delete 3f0c... --yes
    """
    confirm(opts, yes, f"Delete image {image_id} and its base disks?")
    obj = images.delete_image(opts.context(adapters=True), image_id)
    kept = f"; kept on unreachable host(s) {', '.join(obj['kept_on'])}" if obj["kept_on"] else ""
    emit(opts, obj, f"deleted image {obj['id']} ({obj['name']}){kept}")


# -- flavor ----------------------------------------------------------------------------
@click.group("flavor")
def flavor():
    """Manage server-flavors."""


@flavor.command("add")
@click.option("--name", required=True)
@click.option("--memory", type=int, required=True, help="MB of RAM.")
@click.option("--disk", type=int, required=True, help="GB of disk.")
@click.option("--vcpu", type=int, required=True, help="Number of virtual CPUs.")
@click.option("--private", is_flag=True, help="Only users granted with `flavor grant` may see and use it.")
@click.option("--lease-default", default=None, metavar="D",
              help="The lease its instances get (36h, 7d; 0: none), over [leases] default.")
@click.option("--lease-max", default=None, metavar="D",
              help="The longest a renewal may ask for (0: no bound), over [leases] max.")
@command_options
def flavor_add(opts: Options, name, memory, disk, vcpu, private, lease_default, lease_max):
    """Add a server-flavor.

    \b
    Examples:
      cloud-agent flavor add --name small --memory 1024 --disk 10 --vcpu 1
      cloud-agent flavor add --name big --memory 65536 --disk 100 --vcpu 32 --lease-default 2d --lease-max 7d
    """
    obj = images.add_flavor(opts.context(), name=name, memory=memory, disk=disk, vcpu=vcpu, public=not private,
                            lease_default=lease_default, lease_max=lease_max)
    emit(opts, obj, f"flavor {obj['id']} ({name}{', private' if private else ''})")


@flavor.command("grant")
@click.argument("flavor_id")
@click.argument("email")
@command_options
def flavor_grant(opts: Options, flavor_id, email):
    """Let a user see and use a private flavor.

    Example: cloud-agent flavor grant 3 alice@example.org
    """
    obj = images.grant_flavor(opts.context(), flavor_id, email)
    emit(opts, obj, f"{email} may use flavor {obj['id']} ({obj['name']})")


@flavor.command("list")
@command_options
def flavor_list(opts: Options):
    """List every flavor, public or private.

    Example: cloud-agent flavor list --json
    """
    found = images.list_all_flavors(opts.context())
    emit(opts, {"flavors": found}, table(found, [
        ("ID", lambda f: f["id"]), ("NAME", lambda f: f["name"]), ("VCPU", lambda f: f["vcpu"]),
        ("MEMORY", lambda f: f["memory"]), ("DISK", lambda f: f["disk"]), ("PUBLIC", lambda f: yes_no(f["public"])),
        ("LEASE-DEFAULT", lambda f: f["lease-default"] or "-"), ("LEASE-MAX", lambda f: f["lease-max"] or "-")]))


@flavor.command("update")
@click.argument("flavor_id", metavar="FLAVOR")
@click.option("--name", default=None, help="A new name (flavor names are unique).")
@click.option("--public/--private", default=None, help="Whether every user may see and use it.")
@click.option("--lease-default", default=None, metavar="D",
              help="The lease its new instances get (36h, 7d; 0: [leases] default).")
@click.option("--lease-max", default=None, metavar="D",
              help="The longest a renewal may ask for (0: [leases] max).")
@command_options
def flavor_update(opts: Options, flavor_id, name, public, lease_default, lease_max):
    """Rename a flavor, change its visibility or its lease terms (by id or name). Its sizes stay:
    instances made with it count them against their owners' limits; add a new flavor for new
    sizes. New lease terms apply to new instances and to renewals, not to the end an
    instance has now.

    \b
    Examples:
      cloud-agent flavor update small --name tiny
      cloud-agent flavor update big --lease-default 2d --lease-max 7d
    """
    obj = images.update_flavor(opts.context(), flavor_id, name=name, public=public, lease_default=lease_default,
                               lease_max=lease_max)
    emit(opts, obj, f"flavor {obj['id']} ({obj['name']}) updated")


@flavor.command("delete")
@click.argument("flavor_id", metavar="FLAVOR")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@command_options
def flavor_delete(opts: Options, flavor_id, yes):
    """Forget a flavor (by id or name); refused while a server-instance uses it.

    \b
    Example:
      cloud-agent flavor delete small --yes
    """
    confirm(opts, yes, f"Delete flavor {flavor_id}?")
    obj = images.delete_flavor(opts.context(), flavor_id)
    emit(opts, obj, f"deleted flavor {obj['id']} ({obj['name']})")


# -- server -------------------------------------------------------------------------------
@click.group("server")
def server():
    """Read the server-instances of every user."""


@server.command("list")
@click.option("--owner", default=None, help="Only this user's (email or id).")
@click.option("--host", default=None, help="Only those on this hypervisor host.")
@command_options
def server_list(opts: Options, owner, host):
    """List every server-instance with its owner, image, flavor and host.

    Example: cloud-agent server list --host node01
    """
    found = instance_table.admin_list(opts.context(), owner=owner, host=host)
    emit(opts, {"servers": found}, table(found, [
        ("ID", lambda s: s["id"]), ("HOSTNAME", lambda s: s["hostname"]), ("STATUS", lambda s: s["status"]),
        ("OWNER", lambda s: s["owner"]), ("IMAGE", lambda s: s["image"]), ("FLAVOR", lambda s: s["flavor"]),
        ("HOST", lambda s: s["host"]), ("PRIVATE-IP", lambda s: s["private-ip"]),
        ("EXPIRES", lambda s: s["expires-at"] or "-")]))


@server.command("lease")
@click.argument("instance_id", metavar="ID")
@click.option("--hours", type=float, default=None, help="The instance ends this many hours from now (any length).")
@click.option("--never", is_flag=True, help="The instance no longer ends (expires-at null).")
@command_options
def server_lease(opts: Options, instance_id, hours, never):
    """Set when a server-instance ends (by id or hostname), past the lease's max and whether
    leases are on, or clear it with --never. An expired instance given a new end can be
    powered on again by its owner.

    \b
    Examples:
      cloud-agent server lease 3f0c... --hours 720
      cloud-agent server lease alice-vm1 --never
    """
    from controller.errors import InvalidInput
    from controller.instances import leases

    if (hours is None) == (not never):
        raise InvalidInput("give --hours H or --never (one of them)")

    obj = leases.admin_lease(opts.context(adapters=True), instance_id, hours=None if never else hours)
    emit(opts, obj, f"server-instance {obj['id']} ends at {obj['expires-at']}" if obj["expires-at"]
         else f"server-instance {obj['id']} no longer ends")


# -- volume -----------------------------------------------------------------------------
@click.group("volume")
def volume():
    """Administer storage volumes."""


def _gb(size_bytes) -> str | None:
    """Bytes as GB (GiB) with one decimal, for a table; None (shown "-") when not known."""
    return None if size_bytes is None else f"{size_bytes / (1 << 30):.1f}"


@volume.command("list")
@command_options
def volume_list(opts: Options):
    """List every home volume: its owner, account, size, what it uses (where the quota
    backend can tell: btrfs, xfs, setquota), mount point and creation date.

    Example: cloud-agent volume list --json
    """
    ctx = opts.context(adapters=True)
    found = volumes.list_all_volumes(ctx)
    columns = [("ID", lambda v: v["volume-id"]), ("OWNER", lambda v: v["owner"]),
               ("USERNAME", lambda v: v["username"]), ("SIZE-GB", lambda v: v["volume-size"])]
    if ctx.adapters.homes.reports_usage:
        columns.append(("USED-GB", lambda v: _gb(v["used-bytes"])))
    columns += [("MOUNT-POINT", lambda v: v["volume-type"]["mount-point"]), ("CREATED", lambda v: v["creation-date"])]
    emit(opts, {"volumes": found}, table(found, columns))


@volume.command("resize")
@click.argument("volume_id", metavar="EMAIL|ID")
@click.argument("size_gb", metavar="SIZE", type=int)
@command_options
def volume_resize(opts: Options, volume_id, size_gb):
    """Grow or shrink a home volume's quota to SIZE GB (1 to [volumes] max_size_gb), the
    volume named by its owner's EMAIL or its ID. Shrinking below what the home uses is
    refused where the quota backend can tell (btrfs, xfs, setquota).

    \b
    Examples:
      cloud-agent volume resize alice@example.org 200
      cloud-agent volume resize 9b1e... 50
    """
    ctx = opts.context(adapters=True)
    obj = volumes.resize_volume(ctx, volume_id, size_gb)
    owner = email_of(ctx, [obj["cloudauth-id"]]).get(obj["cloudauth-id"], obj["cloudauth-id"])
    emit(opts, obj, f"volume {obj['volume-id']} of {owner} is now {size_gb} GB")


def register(cli) -> None:
    for group in (account, image, flavor, server, volume):
        cli.add_command(group)
