"""`.ci/run` ends with the ten slowest tests and the total: where a developer looks first
when the test command grows."""

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / ".ci" / "slowest.py"

LOG = """\
....                                                                      [100%]
============================= slowest 40 durations =============================
300.50s call     tests/guests/test_guest_e2e.py::test_users_log_in
120.00s setup    tests/guests/test_guest_power.py::test_reboot
10.00s call     tests/guests/test_guest_power.py::test_reboot
0.50s teardown tests/guests/test_guest_e2e.py::test_users_log_in
""" + "".join(f"{i}.00s call     tests/t.py::test_{i}\n" for i in range(1, 13)) + """\
4 passed in 431.00s (0:07:11)
"""


def test_the_ten_slowest_add_up_their_phases_and_the_total_is_printed(tmp_path):
    (tmp_path / "log").write_text(LOG)
    out = subprocess.run([sys.executable, str(CHECK), str(tmp_path / "log"), "2712"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = [line for line in lines if line.startswith("ci: ") and " s  tests/" in line]
    assert len(rows) == 10
    assert rows[0].split()[-1] == "tests/guests/test_guest_e2e.py::test_users_log_in" and "301.0 s" in rows[0]
    assert rows[1].split()[-1] == "tests/guests/test_guest_power.py::test_reboot" and "130.0 s" in rows[1]
    assert rows[-1].split()[-1] == "tests/t.py::test_5"  # 12 .. 5 follow; 4 .. 1 are cut
    assert lines[-1] == "ci: the test command took 45.2 min (2712 s)"
