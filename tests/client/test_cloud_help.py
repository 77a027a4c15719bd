"""The `cloud` command's help and shell completion (no service needed)."""

import os
import subprocess

import click
from click.testing import CliRunner

from agent.cloud.cli import cli
from tests.fixtures.cloud import CLOUD


def _commands(group: click.Group, path=()):
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


def test_every_command_has_help_with_an_example():
    seen = []
    for path, _cmd in _commands(cli):
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        example = [line for line in result.output.splitlines() if "Example:" in line]
        assert example, f"cloud {' '.join(path)} --help has no example"
        assert "cloud " in example[0] and ("cloud " + " ".join(path[:1])) in result.output, (path, example)
        seen.append(" ".join(path))
    # The commands docs/client.md lists, and the rest of issue 18.
    wanted = {"login", "logout", "limits", "server create", "server list", "server show", "server delete",
              "server reboot", "server start", "server stop", "server users add", "server users remove",
              "server users set", "server ssh", "server console", "volume create", "volume show", "volume delete",
              "group create", "group list", "group show", "group add", "group remove", "group set", "group delete",
              "image list", "image show", "flavor list", "flavor show", "user create", "user list", "user show",
              "user update", "completion", "server actions", "cluster list", "server renew"}
    assert wanted <= set(seen), wanted - set(seen)


def test_every_leaf_command_takes_json():
    for path, cmd in _commands(cli):
        if not isinstance(cmd, click.Group) and path != ("completion",):
            assert "--json" in [o for p in cmd.params for o in p.opts], path


def test_completion_scripts_for_bash_and_zsh_from_the_entry_point():
    bash = subprocess.run([str(CLOUD), "completion", "bash"], capture_output=True, text=True, timeout=30)
    assert bash.returncode == 0 and "_CLOUD_COMPLETE=bash_complete" in bash.stdout and "complete -o" in bash.stdout
    zsh = subprocess.run([str(CLOUD), "completion", "zsh"], capture_output=True, text=True, timeout=30)
    assert zsh.returncode == 0 and "compdef" in zsh.stdout and "_CLOUD_COMPLETE=zsh_complete" in zsh.stdout
    env = {**os.environ, "_CLOUD_COMPLETE": "bash_complete", "COMP_WORDS": "cloud server us", "COMP_CWORD": "2"}
    words = subprocess.run([str(CLOUD)], capture_output=True, text=True, timeout=30, env=env)
    assert words.returncode == 0 and words.stdout.split() == ["plain,users"]
