"""The systemd units: `systemd-analyze verify` passes, and they fit what cloud-agent does.

(That `serve` speaks Type=notify is tested in test_serve_systemd.py.)

The units name /opt/cloud-controller/.venv/bin/cloud-agent, the installed
path; verify checks that ExecStart binaries exist, so the units are verified
from a copy that names this venv's cloud-agent instead.
"""

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.agent import AGENT

UNITS = Path(__file__).resolve().parents[2] / "systemd"
INSTALLED_AGENT = "/opt/cloud-controller/.venv/bin/cloud-agent"
UNIT_NAMES = ["cloud-controller.service", "cloud-controller-reconcile.service", "cloud-controller-reconcile.timer"]


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        # Fails rather than skips: the units would go unverified in a green run.
        pytest.fail("systemd-analyze is not installed: run scripts/setup-host.sh (package systemd)",
                    pytrace=False)
    return path


def local_copies(tmp_path: Path) -> list[str]:
    out = []
    for name in UNIT_NAMES:
        text = (UNITS / name).read_text()
        target = tmp_path / name
        target.write_text(text.replace(INSTALLED_AGENT, str(AGENT)))
        out.append(str(target))
    return out


def verify(systemd_analyze: str, paths: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([systemd_analyze, "verify", *paths], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=dict(os.environ, SYSTEMD_LOG_COLOR="0"))


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(UNITS / name)
    return parser


def test_the_units_are_all_there():
    assert sorted(p.name for p in UNITS.iterdir()) == sorted(UNIT_NAMES)


def test_systemd_analyze_verify_passes(systemd_analyze, tmp_path):
    assert AGENT.is_file(), f"{AGENT} is missing: run scripts/setup-host.sh"
    proc = verify(systemd_analyze, local_copies(tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout + proc.stderr == "", "verify warned: " + proc.stdout + proc.stderr


def test_verify_does_check_the_commands(systemd_analyze, tmp_path):
    """The copies matter: the units name the installed cloud-agent, absent here, and verify notices."""
    for name in UNIT_NAMES[:2]:
        assert INSTALLED_AGENT in (UNITS / name).read_text()
    paths = local_copies(tmp_path)
    Path(paths[0]).write_text(Path(paths[0]).read_text().replace(str(AGENT), str(tmp_path / "no-such-agent")))
    proc = verify(systemd_analyze, paths, tmp_path)
    assert proc.returncode != 0
    assert "no-such-agent" in proc.stderr


def test_the_units_run_cloud_agent_commands_that_exist():
    service = unit("cloud-controller.service")["Service"]
    assert service["ExecStartPre"] == f"{INSTALLED_AGENT} init"
    assert service["ExecStart"] == f"{INSTALLED_AGENT} serve"
    assert service["Type"] == "notify"
    assert service["Environment"] == "CLOUD_CONTROLLER_CONFIG=/etc/cloud-controller/controller.ini"
    reconcile = unit("cloud-controller-reconcile.service")["Service"]
    assert reconcile["Type"] == "oneshot"
    assert reconcile["ExecStart"] == f"{INSTALLED_AGENT} reconcile"
    timer = unit("cloud-controller-reconcile.timer")
    # The timer starts the service of its own name.
    assert "Unit" not in timer["Timer"]
    assert timer["Install"]["WantedBy"] == "timers.target"
    for command in ("init", "serve", "reconcile"):
        proc = subprocess.run([str(AGENT), command, "--help"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
