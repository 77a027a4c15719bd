"""The test command's lanes (scripts/test_lanes.py): every test in exactly one lane, the
real guests alone after the others, and a lane's failure or empty lane is the run's failure.

A stand-in for Python records each pytest it is asked to run and answers with the exit
code the test gives that lane, so the order and the codes are seen without running pytest.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LANES = ROOT / "scripts" / "test_lanes.py"


def stand_in(tmp_path: Path, codes: dict[str, int], seconds: dict[str, float] | None = None) -> Path:
    """A `python` that logs `-m pytest -m MARKS ARGS` with start and end times, sleeps as told,
    prints a line and exits with the lane's code."""
    script = tmp_path / "python"
    script.write_text(f"""#!{sys.executable}
import json, sys, time
marks = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "-m" else ""
codes, seconds = {json.dumps(codes)}, {json.dumps(seconds or {})}
start = time.monotonic()
time.sleep(seconds.get(marks, 0))
with open({str(tmp_path / "calls")!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "start": start, "end": time.monotonic()}}) + "\\n")
print("ran", marks)
sys.exit(codes.get(marks, 0))
""")
    script.chmod(0o755)
    return script


def calls(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]


FAKES, DAEMONS, GUESTS = "not integration and not guest", "integration and not guest", "guest"


def test_three_lanes_cover_the_suite_guests_last_and_alone(tmp_path):
    python = stand_in(tmp_path, {}, {FAKES: 1.0, DAEMONS: 0.5})
    out = subprocess.run([sys.executable, str(LANES), str(python), "-q", "--durations=40"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    ran = calls(tmp_path)
    assert [c["argv"][:4] for c in ran] == [["-m", "pytest", "-m", DAEMONS], ["-m", "pytest", "-m", FAKES],
                                            ["-m", "pytest", "-m", GUESTS]]
    assert all(c["argv"][4:] == ["-q", "--durations=40"] for c in ran)
    daemons, fakes, guests = ran
    assert fakes["start"] < daemons["end"]  # side by side
    assert guests["start"] >= max(fakes["end"], daemons["end"])  # alone, after both
    # The quiet lane's output is in the run's output (the skip and duration summaries are read from it).
    assert f"ran {FAKES}" in out.stdout and f"ran {DAEMONS}" in out.stdout and f"ran {GUESTS}" in out.stdout


@pytest.mark.parametrize("lane", [FAKES, DAEMONS, GUESTS])
@pytest.mark.parametrize("code", [1, 5])
def test_a_lane_that_fails_or_finds_no_test_fails_the_run(tmp_path, lane, code):
    python = stand_in(tmp_path, {lane: code})
    out = subprocess.run([sys.executable, str(LANES), str(python)], capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stdout
    assert len(calls(tmp_path)) == 3  # the other lanes still run and report


MARKED = """\
import pytest


def test_plain():
    pass


@pytest.mark.integration
def test_daemon():
    pass


@pytest.mark.integration
@pytest.mark.guest
def test_guest():
    pass


@pytest.mark.guest
def test_guest_only():
    pass
"""


def test_the_lanes_markers_choose_every_test_once(tmp_path):
    """Real pytest collections with each lane's marker expression: each of the four kinds of
    test (no marker, integration, guest, both) is chosen by exactly one lane."""
    (tmp_path / "test_marked.py").write_text(MARKED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: x\n    guest: y\n")
    chosen = []
    for marks in (FAKES, DAEMONS, GUESTS):
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                              "-m", marks, str(tmp_path)], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        chosen += [line.split("::")[-1] for line in out.stdout.splitlines() if "::" in line]
    assert sorted(chosen) == ["test_daemon", "test_guest", "test_guest_only", "test_plain"]


@pytest.mark.parametrize("selection", [["tests/groups"], ["tests/ci/test_ci_skips.py::test_x"], ["-m", "not x"],
                                       ["-k", "name"], ["-kname"], ["-q", "tests"]])
def test_a_selection_runs_one_pytest_as_given(tmp_path, selection):
    python = stand_in(tmp_path, {})
    out = subprocess.run([sys.executable, str(LANES), str(python), *selection], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout
    assert [c["argv"] for c in calls(tmp_path)] == [["-m", "pytest", *selection]]


def test_lanes_can_be_turned_off(tmp_path):
    python = stand_in(tmp_path, {})
    out = subprocess.run([sys.executable, str(LANES), str(python), "-q"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "CC_TEST_LANES": "0"})
    assert out.returncode == 0, out.stdout
    assert [c["argv"] for c in calls(tmp_path)] == [["-m", "pytest", "-q"]]
