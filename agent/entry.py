"""Running a click command as a program: what `cloud-agent` and `cloud` share."""

import json
import sys

import click


def run(cli: click.Group, prog_name: str, argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        cli.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        # Usage errors too must keep --json's promise of one JSON document on stdout.
        if "--json" in args:
            click.echo(json.dumps({"error": e.format_message()}))
        e.show()
        sys.exit(e.exit_code)
