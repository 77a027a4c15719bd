"""What every `cloud` command shares: --json, tables, one-line errors, confirmation."""

import functools
import inspect
import json
import sys
from collections.abc import Callable

import click
from click.core import ParameterSource

from agent.cloud import formats, settings
from agent.cloud.tables import fields, printable, table  # noqa: F401 - the commands' one table style
from common.client import ApiError, Client, ClientError


class Run:
    """One command's run: whether it prints JSON, and the client (made on first use)."""

    def __init__(self, as_json: bool, url: str | None = None, fmt: str = "table", columns: tuple[str, ...] = (),
                 cluster: str | None = None):
        self.as_json = as_json or fmt == "json"
        self.url = url  # `cloud --url`
        self.cluster = cluster  # `cloud --cluster`
        self.fmt, self.columns = fmt, columns  # -f and -c (agent/cloud/formats.py)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = settings.client(self.url, self.cluster)
        return self._client

    def emit(self, document, human: Callable[[], str] | str) -> None:
        """Print the API's document with --json, else the text for people."""
        if self.fmt in ("yaml", "csv", "value") or (self.columns and self.as_json):
            try:
                click.echo(formats.render(document, "json" if self.as_json else self.fmt, self.columns))
            except ValueError as e:
                raise ClientError(str(e)) from None
        elif self.as_json:
            click.echo(json.dumps(document, indent=1))
        else:
            text = human() if callable(human) else human
            if text:
                # Names and messages come from other people: nothing in them drives the terminal.
                click.echo(printable(text, keep="\n\t"))

    def progress(self, message: str) -> None:
        """Progress goes to stderr, so that stdout keeps one document."""
        click.echo(printable(message), err=True)


def fail(run: Run, message: str, *, status: int | None = None, code: int = 1, extra: dict | None = None):
    if run.as_json:
        click.echo(json.dumps({"error": message, **({"status": status} if status else {}), **(extra or {})}))
    click.echo(f"error: {printable(message)}", err=True)
    sys.exit(code)


def no_document_options(click_ctx: click.Context) -> None:
    """A command that prints no document (`server ssh` runs ssh, `completion` a script) takes
    no -f or -c: given before its name they are a usage error, not silently ignored."""
    root = click_ctx.find_root().obj or {}
    if root.get("fmt") or root.get("columns"):
        raise click.UsageError(f"-f/--format and -c/--column do not apply to `{click_ctx.command_path}`: "
                               "it prints no document", ctx=click_ctx)


def _format_of(click_ctx: click.Context, fmt: str, columns: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """-f and -c given after the command name, else before it (`cloud -f value server list`)."""
    root = click_ctx.find_root().obj or {}
    given_here = click_ctx.get_parameter_source("fmt") not in (None, ParameterSource.DEFAULT)
    return (fmt if given_here else root.get("fmt") or fmt), (tuple(columns) or tuple(root.get("columns") or ()))


def cloud_command(fn=None, *, formats_options: bool = True):
    """Adds --json (also accepted before the command name), and -f/-c (also accepted before
    it) unless told not to (`server ssh` prints no document and passes its own options on to
    ssh), and turns every failure into one line on stderr and a non-zero exit."""
    if fn is None:
        return functools.partial(cloud_command, formats_options=formats_options)

    @functools.wraps(fn)
    def wrapper(click_ctx, as_json, *args, fmt="table", columns=(), **kwargs):
        root = click_ctx.find_root().obj or {}
        if formats_options:
            fmt, columns = _format_of(click_ctx, fmt, columns)
        else:
            no_document_options(click_ctx)
        run = Run(as_json or root.get("as_json", False), root.get("url"), fmt, tuple(columns), root.get("cluster"))
        try:
            return fn(run, *args, **kwargs)
        except ApiError as e:
            fail(run, e.message, status=e.status)
        except ClientError as e:
            fail(run, e.message)
        except OSError as e:
            fail(run, f"{e.strerror or e}: {e.filename}" if e.filename else str(e))

    wrapper = click.pass_context(wrapper)
    if formats_options:
        wrapper = click.option("-c", "--column", "columns", multiple=True, metavar="FIELD",
                               help="With -f: only this field of the API's document (repeatable).")(wrapper)
        wrapper = click.option("-f", "--format", "fmt", type=click.Choice(formats.FORMATS), default="table",
                               show_default=True,
                               help="Output format: the API's document as json, yaml, csv or bare values.")(wrapper)
    return click.option("--json", "as_json", is_flag=True, default=False,
                        help="Print exactly one JSON document.")(wrapper)


def confirm(run: Run, yes: bool, question: str) -> None:
    """A destructive command asks on a terminal; elsewhere it needs --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(run, "not on a terminal: add --yes to confirm", code=2)
    if not click.confirm(question, default=False, err=True):
        fail(run, "not confirmed", code=1)


def read_secret(prompt: str) -> str:
    """A secret: prompted without echo on a terminal, else the first line of stdin."""
    if sys.stdin.isatty():
        return click.prompt(prompt, hide_input=True)
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        raise ClientError(f"{prompt.lower()}: none given on stdin")
    return line


# The service's password rule, told before a new password is asked for.
PASSWORD_RULE = "A password is 14 to 24 characters long and mixes at least two of: letters, digits, punctuation."


def read_new_password(prompt: str) -> str:
    """A new password: on a terminal the rule first, then asked twice; else stdin's first line."""
    if sys.stdin.isatty():
        click.echo(PASSWORD_RULE, err=True)
        return click.prompt(prompt, hide_input=True, confirmation_prompt="Repeat the password", err=True)
    return read_secret(prompt)


# -- commands of one shape, made once ----------------------------------------------------
def list_command(parent: click.Group, name: str, *, help: str, fetch: Callable,
                 columns: list[tuple[str, Callable]] | Callable[[Client], list[tuple[str, Callable]]]):
    """`PARENT list`: fetch(client) -> typed objects; a table, or with --json their API documents.
    `columns` may be a function of the client, for columns that name the ids a row holds
    (agent.cloud.names.Labels): it is called only for the table."""

    @parent.command(name, help=inspect.cleandoc(help))
    @cloud_command
    def command(run: Run):
        items = fetch(run.client)
        run.emit([i.raw for i in items],
                 lambda: table(items, columns(run.client) if callable(columns) else columns))

    return command


def show_command(parent: click.Group, *, help: str, resolve: Callable, render: Callable):
    """`PARENT show NAME`: resolve(client, name) -> an object; render(client, obj) for people."""

    @parent.command("show", help=inspect.cleandoc(help))
    @click.argument("name")
    @cloud_command
    def command(run: Run, name):
        obj = resolve(run.client, name)
        run.emit(obj.raw, lambda: render(run.client, obj))

    return command


def members_command(parent: click.Group, verb: str, *, help: str, apply: Callable, render: Callable):
    """`PARENT VERB NAME MEMBER...` (`set` may give none): apply(client, name, members) -> the object."""

    @parent.command(verb, help=inspect.cleandoc(help))
    @click.argument("name")
    @click.argument("members", nargs=-1, required=verb != "set")
    @cloud_command
    def command(run: Run, name, members):
        obj = apply(run.client, name, members)
        run.emit(obj.raw, lambda: render(run.client, obj))

    return command
