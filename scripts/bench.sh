#!/usr/bin/env bash
# The benchmark (docs/performance.md): loads a sandbox at cluster scale in a temporary
# state folder, serves it, measures it and a bare Falcon + waitress app with wrk over
# loopback, prints one table and writes it as JSON. About 3 minutes with the defaults
# (libvirt's test driver runs in a private libvirtd: scripts/bench/private_libvirtd.py).
# Arguments go to scripts/bench/run.py (--duration S, --json-out PATH, --keep, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
# Bounded: a hung server or client ends the run.
exec timeout 900 "${PYTHON:-.venv/bin/python}" scripts/bench/run.py "$@"
