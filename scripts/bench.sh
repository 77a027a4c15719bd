#!/usr/bin/env bash
# The benchmark (docs/performance.md): loads a sandbox at cluster scale in a temporary
# state folder, serves it, measures it and a bare Falcon + waitress app with wrk over
# loopback, prints one table and writes it as JSON. About 3 minutes with the defaults
# (libvirt's test driver runs in a private libvirtd: scripts/bench/private_libvirtd.py).
# Arguments go to scripts/bench/run.py (--duration S, --json-out PATH, --keep, ...).
# With --against REF it compares this checkout with commit REF instead, in one run
# (scripts/bench/compare.py: reads interleaved against the bare app, one create and a
# burst of creates on a private real libvirtd; about 15 minutes).
# With --portal it measures the cloud portal instead (scripts/bench/portal.py: its pages for
# a user with 50 instances and the login to the overview, one client; about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
# Bounded: a hung server or client ends the run.
for arg in "$@"; do
  if [ "$arg" = "--portal" ]; then
    rest=()
    for a in "$@"; do [ "$a" = "--portal" ] || rest+=("$a"); done
    exec timeout 900 "${PYTHON:-.venv/bin/python}" scripts/bench/portal.py "${rest[@]}"
  fi
  if [ "$arg" = "--lease-sweep" ]; then
    rest=()
    for a in "$@"; do [ "$a" = "--lease-sweep" ] || rest+=("$a"); done
    exec timeout 900 "${PYTHON:-.venv/bin/python}" scripts/bench/lease_sweep.py "${rest[@]}"
  fi
  if [ "$arg" = "--against" ] || [[ "$arg" == --against=* ]]; then
    exec timeout 2700 "${PYTHON:-.venv/bin/python}" scripts/bench/compare.py "$@"
  fi
done
exec timeout 900 "${PYTHON:-.venv/bin/python}" scripts/bench/run.py "$@"
