"""`cloud volume|group|image|flavor ...`: the home volume, UNIX groups and the catalogue."""

import click

from agent.cloud import names
from agent.cloud.output import Run, cloud_command, confirm, fields, list_command, members_command, show_command
from common.client import Client, ClientError, Flavor, Group, Image, Volume


# -- volume ---------------------------------------------------------------------
@click.group("volume")
def volume():
    """Your home volume (one per user), mounted as $HOME in every server you can use.

    Example: cloud volume create --size 10
    """


def _volume_fields(client: Client, v: Volume) -> str:
    return fields([("volume-id", v.id), ("name", v.name), ("size-gb", v.size), ("mount-point", v.mount_point),
                   ("owner", names.Labels(client).user(v.owner)), ("created", v.created)])


def _volume_columns(client: Client) -> list:
    label = names.Labels(client)
    return [("ID", lambda v: v.id), ("NAME", lambda v: v.name), ("SIZE-GB", lambda v: v.size),
            ("MOUNT-POINT", lambda v: v.mount_point), ("OWNER", lambda v: label.user(v.owner)),
            ("CREATED", lambda v: v.created)]


def _the_volume(run: Run, given: str | None) -> Volume:
    """The named volume, or with no id the caller's own (its one home volume)."""
    if given:
        return run.client.get_volume(given)
    me = run.client.me()
    mine = [v for v in run.client.list_volumes(owner=me.id)]
    if not mine:
        raise ClientError("you have no volume: `cloud volume create --size GB`")
    return mine[0]


@volume.command("create")
@click.option("--size", required=True, type=click.IntRange(1), help="Size in GB.")
@click.option("--name", help="A description.")
@cloud_command
def volume_create(run: Run, size, name):
    """Create your home volume.

    Example: cloud volume create --size 10 --name home
    """
    v = run.client.create_volume(size=size, name=name)
    run.emit(v.raw, lambda: _volume_fields(run.client, v))


list_command(volume, "list", fetch=lambda c: c.list_volumes(), columns=_volume_columns, help="""
    List the volumes you see (yours, and your managed users').

    Example: cloud volume list --json
    """)


@volume.command("show")
@click.argument("volume_id", required=False)
@cloud_command
def volume_show(run: Run, volume_id):
    """Show a volume (by default your own).

    Example: cloud volume show
    """
    v = _the_volume(run, volume_id)
    run.emit(v.raw, lambda: _volume_fields(run.client, v))


@volume.command("delete")
@click.argument("volume_id", required=False)
@click.option("--yes", is_flag=True, help="Do not ask (needed when not on a terminal).")
@cloud_command
def volume_delete(run: Run, volume_id, yes):
    """Delete a volume (by default your own): every file on it, and the owner's logins.

    Example: cloud volume delete --yes
    """
    v = _the_volume(run, volume_id)
    confirm(run, yes, f"Delete volume {v.id} ({v.size} GB, mounted at {v.mount_point})? Every file on it is "
                      "lost for good, and its owner can no longer log in to any server.")
    run.client.delete_volume(v.id)
    run.emit({"deleted": v.id}, f"deleted volume {v.id}")


# -- group ----------------------------------------------------------------------
@click.group("group")
def group():
    """UNIX groups (secondary groups) you own or manage.

    Example: cloud group create lab --member alice --member bob
    """


def _group_fields(client: Client, g: Group) -> str:
    return fields([("group-id", g.id), ("group-name", g.name), ("members", g.members),
                   ("owner", names.Labels(client).user(g.owner))])


@group.command("create")
@click.argument("name")
@click.option("--member", "members", multiple=True, help="A UNIX user name to add (repeatable).")
@cloud_command
def group_create(run: Run, name, members):
    """Create a UNIX group.

    Example: cloud group create lab --member alice
    """
    g = run.client.create_group(name, members)
    run.emit(g.raw, lambda: _group_fields(run.client, g))


def _group_columns(client: Client) -> list:
    label = names.Labels(client)
    return [("ID", lambda g: g.id), ("NAME", lambda g: g.name), ("MEMBERS", lambda g: ",".join(g.members)),
            ("OWNER", lambda g: label.user(g.owner))]


list_command(group, "list", fetch=lambda c: c.list_groups(), columns=_group_columns, help="""
    List the groups you see.

    Example: cloud group list --json
    """)
show_command(group, resolve=names.group, render=_group_fields, help="""
    Show a group (by id or name).

    Example: cloud group show lab
    """)


def _members(verb: str, action: str, what: str):
    members_command(group, verb, render=_group_fields, help=f"""
    {what} (UNIX user names).

    Example: cloud group {verb} lab alice bob
    """, apply=lambda c, name, members: c.update_group(names.group(c, name).id, action, members))


_members("add", "add", "Add members to a group")
_members("remove", "delete", "Remove members from a group")
_members("set", "replace", "Make these the group's only members")


@group.command("delete")
@click.argument("name")
@cloud_command
def group_delete(run: Run, name):
    """Delete a group (its members keep their accounts).

    Example: cloud group delete lab
    """
    g = names.group(run.client, name)
    run.client.delete_group(g.id)
    run.emit({"deleted": g.id}, f"deleted group {g.name}")


# -- image and flavor ---------------------------------------------------------------
@click.group("image")
def image():
    """Operating system images servers are made from.

    Example: cloud image list
    """


def _image_fields(i: Image) -> str:
    return fields([("id", i.id), ("name", i.name), ("os", i.os), ("min-disk", i.min_disk),
                   ("min-ram", i.min_ram), ("public", i.public), ("active", i.active), ("created", i.created)])


list_command(image, "list", fetch=lambda c: c.list_images(), columns=[
    ("ID", lambda i: i.id), ("NAME", lambda i: i.name), ("OS", lambda i: i.os), ("MIN-DISK", lambda i: i.min_disk),
    ("MIN-RAM", lambda i: i.min_ram), ("ACTIVE", lambda i: "yes" if i.active else "no")], help="""
    List the images you may use.

    Example: cloud image list --json
    """)
show_command(image, resolve=names.image, render=lambda c, i: _image_fields(i), help="""
    Show an image (by id or name).

    Example: cloud image show "Debian 12"
    """)


@click.group("flavor")
def flavor():
    """Sizes of servers: vCPUs, memory, disk.

    Example: cloud flavor list
    """


def _flavor_fields(f: Flavor) -> str:
    return fields([("id", f.id), ("name", f.name), ("vcpu", f.vcpu), ("memory-mb", f.memory), ("disk-gb", f.disk)])


list_command(flavor, "list", fetch=lambda c: c.list_flavors(), columns=[
    ("ID", lambda f: f.id), ("NAME", lambda f: f.name), ("VCPU", lambda f: f.vcpu),
    ("MEMORY-MB", lambda f: f.memory), ("DISK-GB", lambda f: f.disk)], help="""
    List the flavors you may use.

    Example: cloud flavor list
    """)
show_command(flavor, resolve=names.flavor, render=lambda c, f: _flavor_fields(f), help="""
    Show a flavor (by id or name).

    Example: cloud flavor show small --json
    """)
