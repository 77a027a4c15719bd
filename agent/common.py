"""What every cloud-agent command shares: --config, --json, output and error handling."""

import functools
import getpass
import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from agent.cloud.tables import printable, table, yes_no  # noqa: F401 - one table style for both commands
from controller.audit import request_ids
from controller.config import default_config_path, load_config
from controller.context import Context, build_context
from controller.errors import ControllerError, InvalidInput


class Options:
    def __init__(self, config_path: str | None = None, as_json: bool = False):
        self.config_path = config_path
        self.as_json = as_json
        self._ctx: Context | None = None
        self.emitted = None  # the document the command printed (names a new object for the audit)
        self.target_user: dict | None = None  # the user the command acts on, once looked up
        self.audit_args: dict | None = None  # the arguments to record, when not the command's parameters

    @property
    def path(self) -> str:
        return self.config_path or default_config_path()

    def config(self):
        return load_config(self.path)

    def context(self, *, adapters: bool = False, require_database: bool = True) -> Context:
        """The service context; host adapters only for the commands that change the host.

        Unless told otherwise, the database must be one `cloud-agent init` made:
        SQLite would silently create an empty file, and sqlite-utils tables in it.
        """
        if self._ctx is None:
            config = self.config()
            path = config.database_path
            if require_database and not Path(path).is_file():
                raise InvalidInput(f"database {path} does not exist: run `cloud-agent init`")
            built = None
            if adapters:
                from host_adapters.factory import build_adapters

                built = build_adapters(config)
            ctx = build_context(config, adapters=built)
            if require_database:
                ctx.store.ping()
            self._ctx = ctx
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
        command = click_ctx.command_path.split(" ", 1)[-1]
        # One request id per run: its audit row, history rows and log lines share it.
        request_ids.bind(request_ids.new())
        try:
            result = fn(opts, *args, **kwargs)
        except ControllerError as e:
            _audit(opts, command, kwargs, f"error: {e.message}")
            fail(opts, e.message)
        except sqlite3.Error as e:
            # Most often a database that `cloud-agent init` has not created or migrated
            # (so no audit row either).
            fail(opts, f"database error: {e} (has `cloud-agent init` been run?)")
        except OSError as e:
            fail(opts, f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
        except SystemExit as e:
            # A command that acted and then exits non-zero (reconcile --fix with drift left).
            _audit(opts, command, kwargs, "ok" if e.code in (0, None) else f"exit {e.code}")
            raise
        _audit(opts, command, kwargs, "ok")
        return result

    return wrapper


# Commands that change nothing leave no audit row.
_READ_ONLY_COMMANDS = {"serve", "check", "backup", "host list", "server list", "image list", "flavor list",
                       "user list", "controller list", "volume list"}


def _audit(opts: Options, command: str, kwargs: dict, result: str) -> None:
    if (command in _READ_ONLY_COMMANDS or (command == "reconcile" and not kwargs.get("fix"))
            or (command == "audit" and not kwargs.get("prune"))):
        return
    ctx = opts._ctx
    if ctx is None:
        return
    from controller.audit import trail as audit

    # Arguments are kept for the record, but never a password or secret.
    given = kwargs if opts.audit_args is None else opts.audit_args
    shown = {k: v for k, v in given.items() if v not in (None, False) and "password" not in k and "secret" not in k}
    if opts.target_user is not None:
        # The user's id, not the email the admin typed: a user may change its email, and the
        # row must keep naming whom the command acted on (the email stays in the detail).
        target = opts.target_user["id"]
        shown.pop("userid", None)
    else:
        # A host command names its host (its NAME argument); a flavor command its flavor.
        keys = ("name",) if command.startswith("host ") else ("email", "userid", "image_id", "volume_id", "flavor_id",
                                                              "controller_id", "instance_id")
        target = next((str(shown.pop(k)) for k in keys if k in shown), "")
    if not target and isinstance(opts.emitted, dict):
        # A command that creates something (image add, flavor add) names it in its output.
        target = str(opts.emitted.get("id", ""))
    audit.record(
        ctx.store,
        actor=f"cloud-agent:{getpass.getuser()}",
        action=f"cloud-agent {command}",
        target=target,
        result=result,
        detail=" ".join(f"{k}={v}" for k, v in sorted(shown.items())),
    )


def fail(opts: Options, message: str, code: int = 1):
    if opts.as_json:
        click.echo(json.dumps({"error": message}))
    click.echo(f"error: {printable(message)}", err=True)
    sys.exit(code)


def confirm(opts: Options, yes: bool, question: str) -> None:
    """Destructive commands ask on a terminal; elsewhere they need --yes.

    Refusals go through fail() so that --json still prints one document.
    """
    if yes:
        return
    if not sys.stdin.isatty():
        fail(opts, "not on a terminal: add --yes to confirm", code=2)
    if not click.confirm(question, default=False, err=True):
        fail(opts, "aborted: nothing was changed")


def status_line(opts: Options, what: str):
    """Progress of a long command on a terminal (one line, rewritten); None with --json or
    when stderr is not a terminal. The caller clears it with end_status_line."""
    if opts.as_json or not sys.stderr.isatty():
        return None

    def show(message: str) -> None:
        click.echo(f"\r\033[K{what}: {message}", err=True, nl=False)

    return show


def end_status_line(progress) -> None:
    if progress:
        click.echo("\r\033[K", err=True, nl=False)


def emit(opts: Options, document, human: str | None = None) -> None:
    """Print the command's result: the JSON document with --json, else a human line."""
    opts.emitted = document
    if opts.as_json:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    elif human is not None:
        click.echo(printable(human, keep="\n\t"))
    else:
        click.echo(json.dumps(document, indent=2, sort_keys=True))


def email_of(ctx: Context, user_ids) -> dict[str, str]:
    """User id -> email, for the ids among `user_ids` that name a user: what a person reads in
    place of an id (an owner, an actor); any other value is left out, to be shown as it is."""
    found = {}
    for user_id in set(user_ids) - {None, ""}:
        row = ctx.store.get_user(user_id)
        if row is not None:
            found[user_id] = row["email"]
    return found


# -- commands that act on one user -------------------------------------------------
def userid_option(fn):
    """--userid UUID: the user by id instead of by EMAIL."""
    return click.option(
        "--userid", type=click.UUID, default=None,
        help="The user's id instead of EMAIL (a user may change its email; its id never changes).",
    )(fn)


def user_argument(fn):
    """[EMAIL] and --userid UUID: the user a command acts on, by either (require_one_user)."""
    return click.argument("email", required=False)(userid_option(fn))


def require_one_user(email: str | None, userid) -> None:
    if (email is None) == (userid is None):
        raise click.UsageError("give the user's EMAIL or --userid UUID (exactly one of them)")


@contextmanager
def target_user(opts: Options, email: str | None, userid, *, adapters: bool = False) -> Iterator[dict]:
    """The user named by exactly one of EMAIL and --userid, looked up once; while the command
    runs, no other user can take that user's email (users.admin_target)."""
    require_one_user(email, userid)
    from controller.users import users

    ctx = opts.context(adapters=adapters)
    command = click.get_current_context().command_path.split(" ", 1)[-1]
    with users.admin_target(ctx, holder=f"cloud-agent {command} ({getpass.getuser()})", email=email,
                            userid=None if userid is None else str(userid)) as user:
        opts.target_user = user
        yield user
