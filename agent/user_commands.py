"""cloud-agent user ...: the first superuser and roles."""

import sys

import click

from agent.common import Options, command_options, emit
from controller import users
from controller.permissions import ROLES, SUPERUSER


@click.group("user")
def user():
    """Manage cloud auth users."""


@user.command("create-superuser")
@click.option("--email", required=True, help="Email of the new superuser.")
@click.option("--password", default=None,
              help="Password (14-24 characters, two of letters/digits/punctuation); prompted twice when absent.")
@click.option("--password-file", type=click.File("r"), default=None,
              help="Read the password from this file's first line (keeps it out of `ps`); - for stdin.")
@click.option("--name", default="", help="Display name.")
@command_options
def create_superuser(opts: Options, email, password, password_file, name):
    """Create a superuser and print its id, API key and API secret.

    Example: cloud-agent user create-superuser --email admin@example.org
    """
    if password is not None and password_file is not None:
        raise click.UsageError("give --password or --password-file, not both")
    if password_file is not None:
        password = password_file.readline().rstrip("\r\n")
    if password is None:
        if not sys.stdin.isatty():
            raise click.UsageError("--password is required when not on a terminal")
        password = click.prompt("Password", hide_input=True, confirmation_prompt="Repeat password", err=True)
    ctx = opts.context()
    row, secret = users.insert_user(
        ctx, email=email, password=password, name=name, roles=(SUPERUSER,), registration_source="cloud-agent"
    )
    emit(
        opts,
        {"userid": row["id"], "api_key": row["api_key"], "api_secret": secret},
        f"superuser {email}\n  userid:     {row['id']}\n  api_key:    {row['api_key']}\n  api_secret: {secret}",
    )


def _role_command(grant: bool):
    @click.argument("email")
    @click.argument("role", type=click.Choice(ROLES))
    @command_options
    def command(opts: Options, email, role):
        ctx = opts.context()
        row = users.change_role(ctx, email, role, grant=grant)
        obj = users.user_object(ctx, row, superuser_view=True)
        emit(opts, obj, f"{email}: roles {', '.join(obj['roles']) or '(none)'}")

    return command


user.command("grant", help="Give a user a role.\n\nExample: cloud-agent user grant alice@example.org create_user")(
    _role_command(True)
)
user.command("revoke", help="Take a role from a user.\n\nExample: cloud-agent user revoke alice@example.org create_user")(
    _role_command(False)
)


def register(cli) -> None:
    cli.add_command(user)
