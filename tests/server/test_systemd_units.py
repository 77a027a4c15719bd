"""The systemd units: `systemd-analyze verify` passes, and they fit what cloud-agent does.

(That `serve` speaks Type=notify is tested in test_serve_systemd.py.)

The units name /opt/cloud-controller/.venv/bin/cloud-agent, the installed
path; verify checks that ExecStart binaries exist, so the units are verified
from a copy that names this venv's cloud-agent instead.
"""

import configparser
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.agent import AGENT

UNITS = Path(__file__).resolve().parents[2] / "systemd"
INSTALLED_AGENT = "/opt/cloud-controller/.venv/bin/cloud-agent"
INSTALLED_GUEST_RULES = "/opt/cloud-controller/.venv/bin/cloud-guest-rules"
UNIT_NAMES = ["cloud-controller.service", "cloud-controller-reconcile.service", "cloud-controller-reconcile.timer",
              "cloud-controller-guest-rules.service"]


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
        text = text.replace(INSTALLED_GUEST_RULES, str(AGENT.parent / "cloud-guest-rules"))
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


# -- what the services may do -------------------------------------------------------------
SERVICES = ["cloud-controller.service", "cloud-controller-reconcile.service", "cloud-controller-guest-rules.service"]
# `systemd-analyze security --offline=yes` before the services kept CAP_NET_ADMIN (systemd 252):
# 4.9 and 4.5. Adding it cost 0.2 each; the system call filter paid for it. Never above these.
# The boot unit of the guests' table keeps CAP_NET_ADMIN alone: 1.9 when it was written.
EXPOSURE_AT_MOST = {"cloud-controller.service": 4.9, "cloud-controller-reconcile.service": 4.5,
                    "cloud-controller-guest-rules.service": 1.9}


def bounding_set(name: str) -> list[str]:
    """The unit's CapabilityBoundingSet as setpriv names them (`net_admin`)."""
    caps = unit(name)["Service"]["CapabilityBoundingSet"].split()
    assert caps and all(c.startswith("CAP_") for c in caps), caps
    return [c.removeprefix("CAP_").lower() for c in caps]


def nft_with_caps(caps: list[str], table: str) -> subprocess.CompletedProcess:
    """`nft -f -` making `table` and listing it, with only `caps` (as a root service of the unit
    gets them: the bounding set, nothing inheritable), in a network namespace made for it and
    gone when it exits."""
    for tool in ("unshare", "setpriv", "nft"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            pytest.fail(f"{tool} is not installed: run scripts/setup-host.sh (util-linux, nftables)", pytrace=False)
    only = ",".join(["-all", *(f"+{c}" for c in caps)])
    argv = ["unshare", "--net", "--", "setpriv", f"--bounding-set={only}", "--inh-caps=-all", "--",
            "nft", "-f", "-"]
    batch = f"add table bridge {table}\nadd chain bridge {table} probe\nlist table bridge {table}\n"
    return subprocess.run(argv, input=batch, capture_output=True, text=True, timeout=30)


@pytest.mark.real_commands
@pytest.mark.parametrize("name", SERVICES)
def test_the_services_can_write_nft_rules(name):
    """The guests' network rules are written by `nft`: each service's capabilities must allow it."""
    table = f"cc_unit_{name.split('.')[0].replace('-', '_')}"
    proc = nft_with_caps(bounding_set(name), table)
    assert proc.returncode == 0, f"nft under {name}'s CapabilityBoundingSet: {proc.stderr}"
    assert f"table bridge {table}" in proc.stdout and "chain probe" in proc.stdout, proc.stdout


@pytest.mark.real_commands
def test_nft_needs_net_admin():
    """The check above means something: without CAP_NET_ADMIN, the same caps cannot."""
    caps = [c for c in bounding_set("cloud-controller.service") if c != "net_admin"]
    proc = nft_with_caps(caps, "cc_unit_without_net_admin")
    assert proc.returncode != 0
    assert "Operation not permitted" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", SERVICES)
def test_exposure_stays_at_or_below_before(systemd_analyze, name, tmp_path):
    proc = subprocess.run([systemd_analyze, "security", "--offline=yes", "--no-pager", str(UNITS / name)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_COLORS="0"))
    found = re.search(rf"Overall exposure level for {re.escape(name)}: (\d+\.\d)", proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr
    assert float(found.group(1)) <= EXPOSURE_AT_MOST[name], proc.stdout
