#!/usr/bin/env bash
# Sets up everything the test suite needs (system packages, the venv) and runs
# all tests: fast ones on fakes, and integration tests against a real libvirtd
# with KVM, a btrfs loop filesystem, a scratch system root and a private slapd,
# which the fixtures start and stop. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
