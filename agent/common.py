"""What every cloud-agent command shares: --config, --json, output and error handling."""

import functools
import json
import sys

import click

from controller.config import default_config_path, load_config
from controller.context import Context, build_context
from controller.errors import ControllerError


class Options:
    def __init__(self, config_path: str | None = None, as_json: bool = False):
        self.config_path = config_path
        self.as_json = as_json
        self._ctx: Context | None = None

    @property
    def path(self) -> str:
        return self.config_path or default_config_path()

    def config(self):
        return load_config(self.path)

    def context(self, *, adapters: bool = False) -> Context:
        """The service context; host adapters only for the commands that change the host."""
        if self._ctx is None:
            config = self.config()
            built = None
            if adapters:
                from host_adapters.factory import build_adapters

                built = build_adapters(config)
            self._ctx = build_context(config, adapters=built)
        return self._ctx


def command_options(fn):
    """Adds --config and --json to a command (they may also be given before the command name)."""

    @click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                  help="Config file (default: $CLOUD_CONTROLLER_CONFIG, then /etc/cloud-controller/controller.ini).")
    @click.option("--json", "as_json", is_flag=True, default=False, help="Print exactly one JSON document.")
    @click.pass_context
    @functools.wraps(fn)
    def wrapper(click_ctx, config_path, as_json, *args, **kwargs):
        root = click_ctx.find_root().obj or Options()
        opts = Options(config_path or root.config_path, as_json or root.as_json)
        try:
            return fn(opts, *args, **kwargs)
        except ControllerError as e:
            fail(opts, e.message)

    return wrapper


def fail(opts: Options, message: str, code: int = 1):
    if opts.as_json:
        click.echo(json.dumps({"error": message}))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def emit(opts: Options, document, human: str | None = None) -> None:
    """Print the command's result: the JSON document with --json, else a human line."""
    if opts.as_json:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    elif human is not None:
        click.echo(human)
    else:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
