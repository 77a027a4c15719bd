"""cloud: the cluster user's command for the cloud controller (docs/client.md)."""

import os

import click
from click.shell_completion import get_completion_class

from agent.cloud import account_commands, credential_commands, resource_commands, server_commands
from agent.entry import run

COMPLETE_VAR = "_CLOUD_COMPLETE"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, default=False, help="Print exactly one JSON document.")
@click.option("--url", help="The service's base URL (default: $CC_URL, then the kept login's).")
@click.pass_context
def cli(click_ctx, as_json, url):
    """Servers, your home volume, groups and your limits on the cloud controller.

    Configuration: `cloud login`, or CC_URL with CC_API_KEY and CC_API_SECRET
    (or CC_EMAIL and CC_PASSWORD).

    Example: cloud login --url http://head-node:8080 --api-key KEY --keep
    """
    click_ctx.obj = {"as_json": as_json, "url": url}


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh"]))
def completion(shell):
    """Print the shell completion script for bash or zsh.

    Example: eval "$(cloud completion bash)"   (in ~/.bashrc; zsh: in ~/.zshrc)
    """
    cls = get_completion_class(shell)
    click.echo(cls(cli, {}, "cloud", COMPLETE_VAR).source())


for _command in (account_commands.login, account_commands.logout, account_commands.limits, account_commands.user,
                 server_commands.server, resource_commands.volume, resource_commands.group,
                 resource_commands.image, resource_commands.flavor):
    cli.add_command(_command)
for _command in (credential_commands.whoami, credential_commands.credentials, credential_commands.password):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    if COMPLETE_VAR in os.environ:
        cli.main(prog_name="cloud", complete_var=COMPLETE_VAR)  # click answers the shell and exits
    run(cli, "cloud", argv)
