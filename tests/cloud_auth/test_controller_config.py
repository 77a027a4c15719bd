"""A controller's `[cloud_auth]` keys: it serves the controller interface alone, its secret
file is its owner's only, and its user commands say where users live."""

import configparser
import tempfile
from pathlib import Path

import pytest

from controller.config import config_from_dict
from controller.errors import InvalidInput
from tests.fixtures.agent import agent_call, agent_ok, run_agent
from tests.fixtures.api import config_values_for
from tests.fixtures.server import free_port


@pytest.mark.parametrize("interfaces", ["controller,user", "controller,user,portal", "user"])
def test_a_controller_following_a_cloud_auth_serves_nothing_else(tmp_path, interfaces):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = interfaces
    values["cloud_auth"] = {"url": "https://auth.example.org", "secret_file": str(tmp_path / "s")}
    with pytest.raises(InvalidInput, match="interfaces must be controller alone"):
        config_from_dict(values)


@pytest.mark.parametrize("key,value,message", [
    ("url", "ftp://auth.example.org", "http"),
    ("poll_seconds", "0", "above 0"),
    ("timeout_seconds", "-1", "0 or more"),
    ("offline_grace_seconds", "x", "seconds"),
])
def test_bad_cloud_auth_keys(tmp_path, key, value, message):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = "controller"
    values["cloud_auth"] = {"url": "https://auth.example.org", "secret_file": str(tmp_path / "s"), key: value}
    with pytest.raises(InvalidInput, match=message):
        config_from_dict(values)


def test_the_secret_file_is_required(tmp_path):
    values = config_values_for(tmp_path)
    values["server"]["interfaces"] = "controller"
    values["cloud_auth"] = {"url": "https://auth.example.org"}
    with pytest.raises(InvalidInput, match="secret_file is required"):
        config_from_dict(values)


@pytest.fixture
def controller_config():
    state = Path(tempfile.mkdtemp(prefix="cc-follower-"))
    config = state / "controller.ini"
    agent_ok(config, "init", "--sandbox", str(state / "sandbox"), timeout=120)
    secret = state / "secret"
    secret.write_text("ccs_" + "0" * 64 + "\n")
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    parser.set("server", "interfaces", "controller")
    parser.add_section("cloud_auth")
    # Nothing listens there: cloud auth is down for these tests.
    parser.set("cloud_auth", "url", f"http://127.0.0.1:{free_port()}")
    parser.set("cloud_auth", "secret_file", str(secret))
    parser.set("cloud_auth", "timeout_seconds", "1")
    with open(config, "w") as f:
        parser.write(f)
    return config, secret


def test_a_secret_file_others_may_read_stops_serve_and_check(controller_config):
    config, secret = controller_config
    secret.chmod(0o644)
    for command in (["check"], ["serve", "--port", str(free_port())]):
        proc = run_agent("--config", str(config), *command, timeout=60)
        assert proc.returncode != 0 and "readable by others" in proc.stderr and "chmod 600" in proc.stderr, \
            proc.stderr


def test_check_says_cloud_auth_does_not_answer(controller_config):
    config, secret = controller_config
    secret.chmod(0o600)
    code, out = agent_call(config, "check", timeout=120)
    checks = {c["name"]: c for c in out["checks"]}
    assert code == 1 and checks["cloud_auth"]["ok"] is False and "did not answer" in checks["cloud_auth"]["detail"]


@pytest.mark.parametrize("command", [
    ["user", "create-superuser", "--email", "x@example.org", "--password", "Long-enough-pass-1"],
    ["user", "password", "admin@example.org", "--password-file", "-"],
    ["user", "secret", "admin@example.org", "--reset"],
    ["user", "grant", "admin@example.org", "view_user"],
])
def test_user_commands_on_a_controller_say_where_users_live(controller_config, command):
    config, secret = controller_config
    secret.chmod(0o600)
    code, out = agent_call(config, *command, input="Long-enough-pass-1\n")
    assert code == 1 and "users live at cloud auth http://127.0.0.1:" in out["error"], out
