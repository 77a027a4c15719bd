"""cloud-agent: the administrator's command for the cloud controller."""

import click

from agent import (cloud_auth_commands, controller_commands, host_commands, ops_commands, setup_commands,
                   user_commands)
from agent.cloud import conveniences
from agent.common import Options
from agent.entry import run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: $CLOUD_CONTROLLER_CONFIG, then /etc/cloud-controller/controller.ini).")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print exactly one JSON document.")
@click.version_option(conveniences.installed_version(), prog_name="cloud-agent")
@click.pass_context
def cli(click_ctx, config_path, as_json):
    """Administer the cloud controller: set up, serve, and maintain users and host state.

    Example: cloud-agent --config ./state/controller.ini user create-superuser --email admin@example.org
    """
    click_ctx.obj = Options(config_path, as_json)


for _module in (setup_commands, user_commands, controller_commands, host_commands, cloud_auth_commands,
                ops_commands):
    _module.register(cli)
conveniences.apply(cli)


def main(argv: list[str] | None = None) -> None:
    run(cli, "cloud-agent", argv)
