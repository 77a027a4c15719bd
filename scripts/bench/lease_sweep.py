#!/usr/bin/env python3
"""The lease sweep's benchmark: `bash scripts/bench.sh --lease-sweep` (docs/performance.md,
"Lease sweep").

Target (issue 42): a sweep over 10,000 instances with no lease near its end takes under
50 ms and asks no host.

In a temporary state folder, in this process: `cloud-agent init --sandbox` with `[leases]
default = 7d` (every loaded instance ends in a week, none within the first warning, 24 h), loaded by
`cloud-agent sandbox load`'s own code (agent/sandbox_load.py; --instances, default 10,000)
on fake host adapters that count every call. Then --sweeps sweeps one after another (the
service's sweep, controller/instances/leases.py, as `cloud-agent serve` runs it every
`[leases] check_seconds`), each timed; the SQL statements each runs on its own connection (its
reads of the due leases and of the events not yet handed to the hook; the work on a due
instance runs on the sweep's pool) are counted through SQLite's trace hook, and the rows
its read of the due leases visits. Then the same with --due instances
moved to a lease that ends within the warning (their warnings are sent by the first sweep:
that sweep is timed on its own, the others again). Prints one table and writes it as JSON
(--json-out).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent.sandbox_load import Shape, load  # noqa: E402
from controller.config import load_config  # noqa: E402
from controller.context import build_context  # noqa: E402
from controller.instances import lease_terms, leases  # noqa: E402
from controller.store import Store  # noqa: E402
from host_adapters.factory import build_adapters, fake_adapters  # noqa: E402


def context(state: Path):
    """The sandbox `cloud-agent init --sandbox` makes, with leases on; its accounts and groups
    in its scratch root as `sandbox load` needs them, the hypervisor and homes fakes that
    count their calls (the sweep under test asks none)."""
    config_path = state / "controller.ini"
    subprocess.run([str(REPO / ".venv" / "bin" / "cloud-agent"), "--config", str(config_path), "--json", "init",
                    "--sandbox", str(state / "sandbox")], check=True, capture_output=True, timeout=300)
    with open(config_path, "a") as f:
        f.write("\n[leases]\ndefault = 7d\nwarn = 24h, 1h\nkeep = 7d\n")
    config = load_config(str(config_path))
    real, fakes = build_adapters(config), fake_adapters()
    fakes.directory, fakes.groups = real.directory, real.groups
    return build_context(config, store=Store(config.database_path), adapters=fakes)


def timed_sweeps(ctx, n: int) -> dict:
    """n sweeps: their times (ms), the statements each ran, the host calls all made."""
    statements: list[str] = []
    ctx.store.conn.set_trace_callback(statements.append)
    calls = ctx.adapters.hypervisor.host_calls
    times, per_sweep = [], []
    try:
        for _ in range(n):
            before = len(statements)
            began = time.perf_counter()
            leases.sweep(ctx)
            times.append((time.perf_counter() - began) * 1000)
            per_sweep.append(len(statements) - before)
    finally:
        ctx.store.conn.set_trace_callback(None)
    times.sort()
    return {"sweeps": n, "median_ms": round(statistics.median(times), 3),
            "p95_ms": round(times[int(0.95 * (n - 1))], 3), "max_ms": round(times[-1], 3),
            "statements_per_sweep": max(per_sweep), "host_calls": ctx.adapters.hypervisor.host_calls - calls}


def rows_read(ctx) -> int:
    """Rows the sweep's query of due leases visits, as SQLite counts them (a full scan of
    instances would visit every row)."""
    horizon = lease_terms.rfc3339(ctx.clock() + ctx.config.leases.warn[0])
    return ctx.store.conn.execute(
        "SELECT count(*) FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? AND intent IS NULL",
        (horizon,)).fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--sweeps", type=int, default=200)
    parser.add_argument("--due", type=int, default=10)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the state folder")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="cc-bench-lease-"))
    try:
        ctx = context(state)
        began = time.monotonic()
        load(ctx, Shape(users=max(args.instances, 200), owners=100, managed_per_owner=1, instances=args.instances,
                        owner_instances=1, groups=0, members_per_group=0))
        loaded = ctx.store.conn.execute("SELECT count(*), count(expires_at) FROM instances").fetchone()
        print(f"loaded {loaded[0]} instances ({loaded[1]} with a lease) in {time.monotonic() - began:.0f} s",
              flush=True)
        horizon = lease_terms.rfc3339(ctx.clock() + ctx.config.leases.warn[0])
        plan = " ".join(str(tuple(r)) for r in ctx.store.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? "
            "AND intent IS NULL", (horizon,)))
        leases.sweep(ctx)  # warm: statements prepared, pages cached, as in a running service
        none_due = dict(timed_sweeps(ctx, args.sweeps), rows_read=rows_read(ctx))
        soon = lease_terms.rfc3339(ctx.clock() + 3600 * 12)
        ids = [r[0] for r in ctx.store.conn.execute("SELECT id FROM instances LIMIT ?", (args.due,))]
        for iid in ids:
            ctx.store.set_instance_lease(iid, soon)
        first = timed_sweeps(ctx, 1)
        some_due = dict(timed_sweeps(ctx, args.sweeps), rows_read=rows_read(ctx))
        result = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                     text=True).stdout.strip(),
            "cpus": os.cpu_count(), "instances": loaded[0], "index_used": "instances_expires" in plan,
            "none_due": none_due, "due_first_sweep": dict(first, due=args.due), "due_after": some_due,
        }
        ok = none_due["p95_ms"] < 50 and none_due["host_calls"] == 0
        print(f"\n| sweep over {loaded[0]} instances | median ms | p95 ms | max ms | its reads | rows read | "
              f"host calls |\n|---|---|---|---|---|---|---|")
        for title, r in (("none due", none_due), (f"{args.due} due, their first sweep (warnings recorded)", first),
                         (f"{args.due} due, warned already", some_due)):
            print(f"| {title} | {r['median_ms']} | {r['p95_ms']} | {r['max_ms']} | {r['statements_per_sweep']} | "
                  f"{r.get('rows_read', '-')} | {r['host_calls']} |")
        print(f"\nthe due leases read by the index on expires_at: {result['index_used']} ({plan}); "
              f"target (none due: p95 < 50 ms, no host call): {'met' if ok else 'MISSED'}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
        ctx.store.close()
        if not ok:
            sys.exit(1)
    finally:
        if args.keep:
            print(f"state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
