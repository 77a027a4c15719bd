"""cloud-agent controller: at a cloud auth that serves several clusters, the controllers it
serves (one per cluster's head node), each with one secret."""

import click

from agent.common import Options, command_options, confirm, emit
from controller.cloud_auth import registry


def _line(c: dict) -> str:
    seen = c["last_seen"] or "never"
    return (f"{c['id']:<6} {c['name']:<20} {c['url']}  [{'enabled' if c['enabled'] else 'disabled'}]  "
            f"{c['accounts']} accounts, last seen {seen}")


@click.group("controller")
def controller():
    """Register the clusters' controllers that use this cloud auth (one login for every cluster)."""


@controller.command("add")
@click.argument("name")
@click.option("--id", "controller_id", type=int, required=True,
              help="The cluster's controller id (its [controller] id, the accounts' cloud_controller_id).")
@click.option("--url", required=True, help="The controller's API as clients reach it, e.g. https://hpc1.example.org:8080.")
@command_options
def controller_add(opts: Options, name, controller_id, url):
    """Register a controller and print its secret, once: put it in the controller's
    [cloud_auth] secret_file (mode 0600). Only a hash of it is kept here.

    \b
    Example:
      cloud-agent controller add hpc1 --id 2 --url https://hpc1.example.org:8080
    """
    made = registry.add_controller(opts.context(), controller_id=controller_id, name=name, url=url)
    emit(opts, made, f"added controller {made['id']} ({made['name']}, {made['url']})\n"
                     f"secret (shown once; put it in the controller's [cloud_auth] secret_file, mode 0600):\n"
                     f"{made['secret']}")


@controller.command("list")
@command_options
def controller_list(opts: Options):
    """List the controllers: id, name, URL, enabled, accounts registered, last call (UTC)."""
    found = registry.list_controllers(opts.context())
    emit(opts, {"controllers": found}, "\n".join(_line(c) for c in found) if found else "no controllers")


def _set_enabled(opts: Options, controller_id: int, enabled: bool) -> None:
    row = registry.set_enabled(opts.context(), controller_id, enabled)
    emit(opts, row, f"controller {row['id']} ({row['name']}) {'enabled' if enabled else 'disabled'}")


@controller.command("disable")
@click.argument("controller_id", type=int)
@command_options
def controller_disable(opts: Options, controller_id):
    """Refuse a controller's calls (403) until it is enabled: its cluster authenticates only the
    tokens it has seen, until its offline grace ends."""
    _set_enabled(opts, controller_id, False)


@controller.command("enable")
@click.argument("controller_id", type=int)
@command_options
def controller_enable(opts: Options, controller_id):
    """Accept a disabled controller's calls again."""
    _set_enabled(opts, controller_id, True)


@controller.command("rotate-secret")
@click.argument("controller_id", type=int)
@command_options
def controller_rotate_secret(opts: Options, controller_id):
    """Give a controller a new secret (printed once); the old one stops working at once."""
    made = registry.rotate_secret(opts.context(), controller_id)
    emit(opts, made, f"new secret of controller {made['id']} (shown once; replace its [cloud_auth] "
                     f"secret_file):\n{made['secret']}")


@controller.command("remove")
@click.argument("controller_id", type=int)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@command_options
def controller_remove(opts: Options, controller_id, yes):
    """Forget a controller (refused while accounts are registered for it)."""
    confirm(opts, yes, f"Remove controller {controller_id}?")
    row = registry.remove_controller(opts.context(), controller_id)
    emit(opts, row, f"removed controller {row['id']} ({row['name']})")


def register(cli) -> None:
    cli.add_command(controller)
