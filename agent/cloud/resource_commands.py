"""`cloud volume|group|image|flavor ...`: the home volume, UNIX groups and the catalogue."""

import inspect

import click

from agent.cloud import names
from agent.cloud.output import Run, cloud_command, confirm, fields, table
from common.client import ClientError, Flavor, Group, Image, Volume


# -- volume ---------------------------------------------------------------------
@click.group("volume")
def volume():
    """Your home volume (one per user), mounted as $HOME in every server you can use.

    Example: cloud volume create --size 10
    """


def _volume_fields(v: Volume) -> str:
    return fields([("volume-id", v.id), ("name", v.name), ("size-gb", v.size), ("mount-point", v.mount_point),
                   ("owner", v.owner), ("created", v.created)])


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
    run.emit(v.raw, lambda: _volume_fields(v))


@volume.command("show")
@click.argument("volume_id", required=False)
@cloud_command
def volume_show(run: Run, volume_id):
    """Show a volume (by default your own).

    Example: cloud volume show
    """
    v = _the_volume(run, volume_id)
    run.emit(v.raw, lambda: _volume_fields(v))


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


def _group_fields(g: Group) -> str:
    return fields([("group-id", g.id), ("group-name", g.name), ("members", g.members), ("owner", g.owner)])


@group.command("create")
@click.argument("name")
@click.option("--member", "members", multiple=True, help="A UNIX user name to add (repeatable).")
@cloud_command
def group_create(run: Run, name, members):
    """Create a UNIX group.

    Example: cloud group create lab --member alice
    """
    g = run.client.create_group(name, members)
    run.emit(g.raw, lambda: _group_fields(g))


@group.command("list")
@cloud_command
def group_list(run: Run):
    """List the groups you see.

    Example: cloud group list --json
    """
    groups = run.client.list_groups()
    run.emit([g.raw for g in groups], lambda: table(groups, [
        ("ID", lambda g: g.id), ("NAME", lambda g: g.name), ("MEMBERS", lambda g: ",".join(g.members))]))


@group.command("show")
@click.argument("name")
@cloud_command
def group_show(run: Run, name):
    """Show a group (by id or name).

    Example: cloud group show lab
    """
    g = names.group(run.client, name)
    run.emit(g.raw, lambda: _group_fields(g))


def _members_command(verb: str, action: str, what: str):
    @group.command(verb)
    @click.argument("name")
    @click.argument("members", nargs=-1, required=verb != "set")
    @cloud_command
    def change(run: Run, name, members):
        g = run.client.update_group(names.group(run.client, name).id, action, members)
        run.emit(g.raw, lambda: _group_fields(g))

    change.help = inspect.cleandoc(f"""{what} (UNIX user names).

    Example: cloud group {verb} lab alice bob
    """)
    return change


_members_command("add", "add", "Add members to a group")
_members_command("remove", "delete", "Remove members from a group")
_members_command("set", "replace", "Make these the group's only members")


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


@image.command("list")
@cloud_command
def image_list(run: Run):
    """List the images you may use.

    Example: cloud image list --json
    """
    images = run.client.list_images()
    run.emit([i.raw for i in images], lambda: table(images, [
        ("ID", lambda i: i.id), ("NAME", lambda i: i.name), ("OS", lambda i: i.os),
        ("MIN-DISK", lambda i: i.min_disk), ("MIN-RAM", lambda i: i.min_ram),
        ("ACTIVE", lambda i: "yes" if i.active else "no")]))


@image.command("show")
@click.argument("name")
@cloud_command
def image_show(run: Run, name):
    """Show an image (by id or name).

    Example: cloud image show "Debian 12"
    """
    i = names.image(run.client, name)
    run.emit(i.raw, lambda: _image_fields(i))


@click.group("flavor")
def flavor():
    """Sizes of servers: vCPUs, memory, disk.

    Example: cloud flavor list
    """


def _flavor_fields(f: Flavor) -> str:
    return fields([("id", f.id), ("name", f.name), ("vcpu", f.vcpu), ("memory-mb", f.memory), ("disk-gb", f.disk)])


@flavor.command("list")
@cloud_command
def flavor_list(run: Run):
    """List the flavors you may use.

    Example: cloud flavor list
    """
    flavors = run.client.list_flavors()
    run.emit([f.raw for f in flavors], lambda: table(flavors, [
        ("ID", lambda f: f.id), ("NAME", lambda f: f.name), ("VCPU", lambda f: f.vcpu),
        ("MEMORY-MB", lambda f: f.memory), ("DISK-GB", lambda f: f.disk)]))


@flavor.command("show")
@click.argument("name")
@cloud_command
def flavor_show(run: Run, name):
    """Show a flavor (by id or name).

    Example: cloud flavor show small --json
    """
    f = names.flavor(run.client, name)
    run.emit(f.raw, lambda: _flavor_fields(f))
