#!/usr/bin/env bash
# Sets up everything the test suite needs (system packages, the venv) and runs
# all tests: fast ones on fakes, and integration tests against a real libvirtd
# with KVM, a btrfs loop filesystem, a scratch system root and a private slapd,
# which the fixtures start and stop. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh

# The whole suite runs in lanes (scripts/test_lanes.py: fakes beside daemons, then the real
# guests alone); a selection (a path, a node id, -m, -k, or CC_TEST_LANES=0) runs as one pytest.
set +e
.venv/bin/python scripts/test_lanes.py .venv/bin/python "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
