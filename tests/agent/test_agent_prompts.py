"""cloud-agent on a real terminal (pexpect): confirmation of destructive commands.

`account disable` asks on a terminal (default no) and, off a terminal,
refuses without --yes. The password prompt of `user create-superuser` is
tested in test_agent_users.py, progress on a terminal in test_agent_progress.py.
"""

import json
import os

import pexpect
import pytest

from tests.agent.test_agent_controller import BOB_EMAIL, Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.fixtures.agent import AGENT

QUESTION = f"Remove the system account of {BOB_EMAIL}? [y/N]: "


def spawn(sandbox, *args: str) -> pexpect.spawn:
    env = dict(os.environ, CLOUD_CONTROLLER_CONFIG=sandbox.config)
    return pexpect.spawn(str(AGENT), list(args), env=env, timeout=30, encoding="utf-8", dimensions=(24, 200))


def finish(child: pexpect.spawn) -> tuple[int, str]:
    child.expect(pexpect.EOF)
    child.close()
    assert "Traceback" not in child.before, child.before
    return child.exitstatus, child.before


@pytest.fixture
def enabled(sandbox) -> dict:
    return sandbox.ok("account", "enable", BOB_EMAIL, "--username", "bob")


def account_is_there(sandbox) -> bool:
    in_db = bool(sandbox.rows("SELECT * FROM system_accounts WHERE username = 'bob'"))
    in_passwd = "bob" in sandbox.entries("passwd")
    assert in_db == in_passwd == ("bob" in sandbox.entries("group"))
    return in_db


# -- account disable ---------------------------------------------------------------
@pytest.mark.parametrize("answer", ["n", "N", "no", ""])
def test_disable_on_a_terminal_keeps_the_account_unless_confirmed(sandbox, enabled, answer):
    child = spawn(sandbox, "account", "disable", BOB_EMAIL)
    child.expect_exact(QUESTION)
    child.sendline(answer)
    status, output = finish(child)
    assert status == 1
    assert "error: aborted: nothing was changed" in output
    assert account_is_there(sandbox)


def test_disable_on_a_terminal_removes_the_account_on_yes(sandbox, enabled):
    child = spawn(sandbox, "account", "disable", BOB_EMAIL)
    child.expect_exact(QUESTION)
    child.sendline("y")
    status, output = finish(child)
    assert status == 0, output
    assert "disabled bob" in output
    assert not account_is_there(sandbox)


def test_disable_with_json_on_a_terminal_prints_the_account_after_the_question(sandbox, enabled):
    child = spawn(sandbox, "--json", "account", "disable", BOB_EMAIL)
    child.expect_exact(QUESTION)
    child.sendline("yes")
    status, output = finish(child)
    assert status == 0, output
    # After the echoed answer, the document and nothing else.
    answer, _, document = output.partition("\n")
    assert answer.strip() == "yes"
    assert json.loads(document) == enabled
    assert not account_is_there(sandbox)


def test_disable_with_yes_does_not_ask(sandbox, enabled):
    child = spawn(sandbox, "account", "disable", BOB_EMAIL, "--yes")
    status, output = finish(child)
    assert status == 0, output
    assert "[y/N]" not in output
    assert not account_is_there(sandbox)


def test_disable_off_a_terminal_needs_yes(sandbox, enabled):
    proc = sandbox.run("account", "disable", BOB_EMAIL)
    assert proc.returncode == 2
    assert proc.stderr == "error: not on a terminal: add --yes to confirm\n" and proc.stdout == ""
    proc = sandbox.run("--json", "account", "disable", BOB_EMAIL)
    assert proc.returncode == 2
    assert json.loads(proc.stdout) == {"error": "not on a terminal: add --yes to confirm"}
    assert account_is_there(sandbox)
    # Input on a pipe is not a confirmation either.
    proc = sandbox.run("account", "disable", BOB_EMAIL, input="y\n")
    assert proc.returncode == 2
    assert account_is_there(sandbox)
