"""`cloud-agent check` and GET /healthz on a sandbox: what is healthy, and what names the failure."""

import json
import os

import pytest
from falcon import testing

from controller.config import load_config
from controller.context import build_context
from tests.agent.test_agent_controller import Sandbox, sandbox, sandbox_template  # noqa: F401 (fixtures)
from tests.fixtures.agent import run_agent

CHECKS = ["database", "secret_key", "libvirt", "directory", "quota_backend", "system_root", "guest_start"]


def check(sandbox) -> tuple[int, dict]:
    proc = sandbox.run("--json", "check")
    assert proc.stderr == ""
    return proc.returncode, json.loads(proc.stdout)


def healthz(sandbox):
    from api.app import create_app
    from host_adapters.factory import build_adapters

    config = load_config(sandbox.config)
    app = create_app(build_context(config, adapters=build_adapters(config)))
    return testing.TestClient(app).simulate_get("/healthz")


def test_healthy_sandbox(sandbox):
    code, out = check(sandbox)
    assert code == 0
    assert out == {"ok": True, "checks": [{"name": n, "ok": True, "detail": ""} for n in CHECKS]}
    r = healthz(sandbox)
    assert r.status_code == 200 and r.json == {"status": "ok"}


def test_human_output(sandbox):
    proc = sandbox.run("check")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [f"ok   {n}" for n in CHECKS]


def _remove_key(sandbox):
    os.remove(sandbox.root / "secret.key")
    return {"secret_key": f"secret key file missing: {sandbox.root / 'secret.key'}"}


def _remove_group_file(sandbox):
    os.remove(sandbox.root / "sysroot" / "etc" / "group")
    missing = f"{sandbox.root / 'sysroot' / 'etc' / 'group'} is missing"
    return {"system_root": missing, "directory": missing}


def _remove_home_root(sandbox):
    os.rmdir(sandbox.root / "home")
    return {"quota_backend": f"home_root {sandbox.root / 'home'} does not exist"}


def _remove_database(sandbox):
    os.remove(sandbox.db_path)
    return {"database": "run `cloud-agent init`"}


@pytest.mark.parametrize("breakage", [_remove_key, _remove_group_file, _remove_home_root, _remove_database])
def test_a_broken_part_is_named(sandbox, breakage):
    expected = breakage(sandbox)
    code, out = check(sandbox)
    assert code == 1
    assert out["ok"] is False
    assert [c["name"] for c in out["checks"]] == CHECKS
    failed = {c["name"]: c["detail"] for c in out["checks"] if not c["ok"]}
    assert set(failed) == set(expected)
    for name, detail in expected.items():
        assert detail in failed[name]

    proc = sandbox.run("check")
    assert proc.returncode == 1
    for name in expected:
        assert f"FAIL {name}: {failed[name]}" in proc.stdout.splitlines()

    r = healthz(sandbox)
    assert r.status_code == 503
    # Anonymous callers get the names only; the details above stay with the admin.
    assert r.json == {"status": "unavailable", "failed": [{"check": n} for n in CHECKS if n in failed]}
    for detail in failed.values():
        assert detail not in r.text
    assert str(sandbox.root) not in r.text


def test_check_without_a_config_fails_cleanly(tmp_path):
    proc = run_agent("--config", str(tmp_path / "missing.ini"), "--json", "check")
    assert proc.returncode == 1
    assert proc.stdout.strip() == '{"error": "config file not found: %s"}' % (tmp_path / "missing.ini")


def _set_config(sandbox, **sections) -> None:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(sandbox.config)
    for section, keys in sections.items():
        if not parser.has_section(section):
            parser.add_section(section)
        for key, value in keys.items():
            parser[section][key] = value
    with open(sandbox.config, "w") as f:
        parser.write(f)


def test_check_refuses_guest_sudo_with_a_quota_guest_root_escapes(sandbox):
    """setquota limits the user's uid; guest root writes as root (issue 16, finding 11)."""
    _set_config(sandbox, guest={"sudo": "owner"}, volumes={"quota_backend": "setquota"})
    line = sandbox.error("check")
    assert "[guest] sudo = owner cannot be used with [volumes] quota_backend = setquota" in line
    assert "btrfs or xfs" in line


@pytest.mark.parametrize("sudo, backend, refused", [
    ("owner", "setquota", True),
    ("owner", "btrfs", False),
    ("owner", "xfs", False),
    ("owner", "none", False),  # no limit at all: nothing for guest root to escape
    ("none", "setquota", False),
])
def test_config_validation_at_start_refuses_guest_sudo_with_setquota(tmp_path, sudo, backend, refused):
    from controller.config import config_from_dict, sandbox_values
    from controller.errors import InvalidInput

    values = sandbox_values(str(tmp_path))
    values["guest"] = {"sudo": sudo}
    values["volumes"]["quota_backend"] = backend
    if refused:
        with pytest.raises(InvalidInput, match=r"sudo = owner cannot be used with .* quota_backend = setquota"):
            config_from_dict(values)
    else:
        assert config_from_dict(values).guest.sudo == sudo
