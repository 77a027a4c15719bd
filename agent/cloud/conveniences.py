"""What people expect of a command line, applied once to a whole command tree (`cloud` and
`cloud-agent` alike): examples in --help kept verbatim, `ls` and `rm` for `list` and
`delete`, --version, and completion of server, image and flavor names.
"""

import importlib.metadata

import click
from click.shell_completion import CompletionItem

ALIASES = {"ls": "list", "rm": "delete"}


class AliasGroup(click.Group):
    """A group where `ls` and `rm` name its `list` and `delete` (not listed in --help)."""

    def get_command(self, ctx, cmd_name):
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in ALIASES:
            found = super().get_command(ctx, ALIASES[cmd_name])
        return found

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        # The command's own name, so that usage lines and audit rows say `list`, not `ls`.
        return (cmd.name if cmd is not None else name), cmd, rest


def _verbatim_examples(text: str | None) -> str | None:
    """click re-wraps every paragraph to the terminal's width, cutting an example line
    between an option and its value (`--os-` / `major`); a paragraph that starts with
    `\\b` is kept as written. Each paragraph that begins `Example` gets one."""
    if not text:
        return text
    paragraphs = text.split("\n\n")
    kept = []
    for p in paragraphs:
        stripped = p.lstrip()
        if stripped.startswith("Example") and not stripped.startswith("\b"):
            indent = p[: len(p) - len(stripped)]
            p = f"{indent}\b\n{p}"
        kept.append(p)
    return "\n\n".join(kept)


def installed_version() -> str:
    for dist in ("cloud-controller", "cloud-controller-client"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def apply(root: click.Group) -> None:
    """Make every group of the tree an AliasGroup and keep every example verbatim."""
    stack: list[click.Command] = [root]
    while stack:
        cmd = stack.pop()
        cmd.help = _verbatim_examples(cmd.help)
        if isinstance(cmd, click.Group):
            if type(cmd) is click.Group:
                # The groups are declared with @click.group in many modules; this one place
                # gives them all the aliases (an AliasGroup adds no state of its own).
                cmd.__class__ = AliasGroup
            stack.extend(cmd.commands.values())


def completer(kind: str, listing):
    """A shell_complete for a name of `kind`: listing() -> [(name, help)], asked only when the
    shell asks; any failure (not logged in, no service) completes nothing."""

    def complete(ctx, param, incomplete: str):
        try:
            found = listing()
        except Exception:  # completion must never print a traceback into the shell
            return []
        return [CompletionItem(name, help=about) for name, about in found if name.startswith(incomplete)]

    complete.kind = kind
    return complete
