"""cloud: the cluster user's command for the cloud controller (docs/client.md)."""

import os

import click
from click.shell_completion import get_completion_class

from agent.cloud import (account_commands, conveniences, credential_commands, formats, output, resource_commands,
                         server_commands, settings)
from agent.entry import run

COMPLETE_VAR = "_CLOUD_COMPLETE"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, default=False, help="Print exactly one JSON document.")
@click.option("-f", "--format", "fmt", type=click.Choice(formats.FORMATS), default=None,
              help="Output format: the API's document as json, yaml, csv or bare values (also after the "
                   "command name; default table).")
@click.option("-c", "--column", "columns", multiple=True, metavar="FIELD",
              help="With -f: only this field of the API's document (repeatable; also after the command name).")
@click.option("--url", help="The service's base URL (default: $CC_URL, then the kept login's).")
@click.option("--cluster", help="At a cloud auth serving several clusters: the cluster to act on, by name or id "
                                "(default: $CC_CLUSTER, then the default cluster; `cloud cluster list`).")
@click.version_option(conveniences.installed_version(), prog_name="cloud")
@click.pass_context
def cli(click_ctx, as_json, fmt, columns, url, cluster):
    """Servers, your home volume, groups and your limits on the cloud controller.

    Configuration: `cloud login`, or CC_URL with CC_API_KEY and CC_API_SECRET
    (or CC_EMAIL and CC_PASSWORD).

    Example: cloud login --url http://head-node:8080 --api-key KEY --keep
    """
    click_ctx.obj = {"as_json": as_json, "fmt": fmt, "columns": tuple(columns), "url": url, "cluster": cluster}


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for bash, zsh or fish; it completes commands,
    options, and the names of your servers, images, flavors and groups.

    \b
    Example: eval "$(cloud completion bash)"   (in ~/.bashrc; zsh: in ~/.zshrc)
    Example: cloud completion fish > ~/.config/fish/completions/cloud.fish
    """
    output.no_document_options(click.get_current_context())
    cls = get_completion_class(shell)
    click.echo(cls(cli, {}, "cloud", COMPLETE_VAR).source())


for _command in (account_commands.login, account_commands.logout, account_commands.limits, account_commands.user,
                 account_commands.cluster,
                 server_commands.server, resource_commands.volume, resource_commands.group,
                 resource_commands.image, resource_commands.flavor):
    cli.add_command(_command)
for _command in (credential_commands.whoami, credential_commands.credentials, credential_commands.password):
    cli.add_command(_command)


def _servers():
    return [(s.hostname or s.id, s.status) for s in settings.client().list_servers()]


def _images():
    return [(i.name, i.os) for i in settings.client().list_images() if i.active]


def _flavors():
    return [(f.name, f"{f.vcpu} vCPU, {f.memory} MB") for f in settings.client().list_flavors()]


def _groups():
    return [(g.name, f"{len(g.members)} members") for g in settings.client().list_groups()]


def _complete_names() -> None:
    """Names a person types complete from the service: a server's, an image's, a flavor's or a
    group's NAME, and server create's --image and --flavor (not a NAME that `create` makes)."""
    kinds = {"server": conveniences.completer("server", _servers), "image": conveniences.completer("image", _images),
             "flavor": conveniences.completer("flavor", _flavors), "group": conveniences.completer("group", _groups)}
    for group_name, complete in kinds.items():
        group = cli.commands[group_name]
        stack = list(group.commands.values())
        while stack:
            cmd = stack.pop()
            if isinstance(cmd, click.Group):
                stack.extend(cmd.commands.values())
                continue
            if cmd.name == "create":
                continue
            for param in cmd.params:
                if isinstance(param, click.Argument) and param.name == "name":
                    param._custom_shell_complete = complete  # click's own hook for shell_complete=
    for param in cli.commands["server"].commands["create"].params:
        if param.name in ("image", "flavor"):
            param._custom_shell_complete = kinds[param.name]


conveniences.apply(cli)
_complete_names()


def main(argv: list[str] | None = None) -> None:
    if COMPLETE_VAR in os.environ:
        cli.main(prog_name="cloud", complete_var=COMPLETE_VAR)  # click answers the shell and exits
    run(cli, "cloud", argv)
