#!/usr/bin/env python3
"""The benchmark behind `bash scripts/bench.sh` (docs/performance.md).

In a temporary state folder: `cloud-agent init --sandbox`, a superuser,
`cloud-agent sandbox load` (10,000 users, accounts, homes, 1,000 groups,
10,000 instances by default), then `cloud-agent serve` (which makes every
instance's domain in libvirt's test driver) and the bare Falcon + waitress
app with the same threads. The test driver runs in a private libvirtd
(private_libvirtd.py), as libvirtd does on a head node, so the server's memory
is the controller's own; --in-process-test-driver keeps the sandbox's
`test:///default` inside the server instead. wrk (loopback, c=8 for reads,
c=32 for the write mix) measures each scenario for --duration seconds; an
in-process loop times token validation against the loaded database. Prints one
table and the server's peak and steady RSS, and writes the same as JSON (bench-results.json in the state
folder, or --json-out). Everything it started is stopped; --keep keeps the
state folder.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from private_libvirtd import PrivateLibvirtd, stop_process

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PY = sys.executable
AGENT = [PY, "-c", "from agent.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent(config: str, *args: str, stdin: str | None = None) -> dict:
    out = subprocess.run([*AGENT, "--config", config, "--json", *args], check=True, capture_output=True,
                         text=True, input=stdin, cwd=REPO, timeout=600)
    return json.loads(out.stdout)


def http(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def wait_ready(port: int, path: str, proc: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            sys.exit(f"bench: the server on port {port} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            return time.monotonic() - start
        except OSError:
            time.sleep(0.2)
    sys.exit(f"bench: nothing answered on port {port} within {timeout:.0f} s")


def wrk(port: int, script: str, *, connections: int, threads: int, duration: int, env: dict) -> dict:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--timeout", "10s", "--latency",
         "-s", str(HERE / script), f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, env={**os.environ, "BENCH_DIR": str(HERE), **env},
        timeout=duration + 60)
    line = next((l for l in out.stdout.splitlines() if l.startswith("BENCH-RESULT ")), None)
    if line is None:
        sys.exit(f"bench: wrk printed no result:\n{out.stdout}\n{out.stderr}")
    r = json.loads(line.split(" ", 1)[1])
    return {"requests_per_s": round(r["requests"] / (r["duration_us"] / 1e6)), "p50_ms": r["p50_us"] / 1000,
            "p99_ms": r["p99_us"] / 1000, "requests": r["requests"], "non_2xx": r["non_2xx"],
            "socket_errors": r["socket_errors"], "connections": connections}


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """VmHWM: the peak resident set so far; VmRSS: the current one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def token_validation_us(config: str, token: str, userid: str, rounds: int) -> dict:
    """Mean time of controller.auth.tokens.authenticate (the check every request makes) in-process,
    against the loaded database, in microseconds: with the owner remembered (nothing written
    since the last check: Store.token_owner) and read from the database (forgotten each time,
    as after any write)."""
    code = (
        "import json, sys, time\n"
        "from controller.config import load_config\n"
        "from controller.context import build_context\n"
        "from controller.auth.tokens import authenticate\n"
        "ctx = build_context(load_config(sys.argv[1]))\n"
        "token, userid, n = sys.argv[2], sys.argv[3], int(sys.argv[4])\n"
        "authenticate(ctx, token=token, user_id=userid)\n"
        "t = time.perf_counter()\n"
        "for _ in range(n):\n"
        "    authenticate(ctx, token=token, user_id=userid)\n"
        "remembered = (time.perf_counter() - t) / n * 1e6\n"
        "forget = ctx.store._token_memo.clear\n"
        "t = time.perf_counter()\n"
        "for _ in range(n):\n"
        "    forget()\n"
        "    authenticate(ctx, token=token, user_id=userid)\n"
        "read = (time.perf_counter() - t) / n * 1e6\n"
        "print(json.dumps({'remembered': round(remembered, 1), 'read_from_database': round(read, 1)}))\n"
    )
    out = subprocess.run([PY, "-c", code, config, token, userid, str(rounds)], check=True, capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    return json.loads(out.stdout)


def stop(proc: subprocess.Popen | None) -> None:
    stop_process(proc, timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per scenario (1-60)")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--threads", type=int, default=4, help="waitress threads of both servers")
    parser.add_argument("--json-out", default=None, help="also write the results here")
    parser.add_argument("--state", default=None, help="state folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the state folder")
    parser.add_argument("--in-process-test-driver", action="store_true",
                        help="libvirt's test driver inside the server (the sandbox's test:///default), "
                             "not in a private libvirtd")
    args = parser.parse_args()
    duration = min(max(args.duration, 1), 60)
    if shutil.which("wrk") is None:
        sys.exit("bench: wrk is missing: run scripts/setup-host.sh (apt-get install wrk)")

    state = Path(args.state or tempfile.mkdtemp(prefix="cc-bench-")).resolve()
    config = str(state / "controller.ini")
    server = bare = daemon = None
    try:
        agent(config, "init", "--sandbox", str(state))
        # Thread count of the run, for the server and the bare app alike.
        ini = Path(config).read_text().replace("threads = 4", f"threads = {args.threads}")
        if not args.in_process_test_driver:
            daemon = PrivateLibvirtd(state / "libvirt").start()
            ini = ini.replace("uri = test:///default", f"uri = {daemon.uri}")
        Path(config).write_text(ini)
        admin = agent(config, "user", "create-superuser", "--email", "bench-admin@example.org",
                      "--password-file", "-", stdin="Bench-admin-pass-2026\n")
        started = time.monotonic()
        loaded = agent(config, "sandbox", "load", "--users", str(args.users), "--owners", str(args.owners),
                       "--instances", str(args.instances), "--groups", str(args.groups))
        load_s = time.monotonic() - started

        port = free_port()
        log = open(state / "serve.log", "w")
        server = subprocess.Popen([*AGENT, "--config", config, "serve", "--port", str(port)], cwd=REPO,
                                  stdout=log, stderr=subprocess.STDOUT)
        start_s = wait_ready(port, "/healthz", server, 600)
        started_rss = rss_mb(server.pid, "VmRSS")
        bare_port = free_port()
        bare = subprocess.Popen([PY, str(HERE / "bare_app.py"), str(bare_port), str(args.threads)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(bare_port, "/", bare, 30)

        def token_of(who: dict) -> tuple[str, dict]:
            data = http(port, "POST", "/v1/auth/token", {"api_key": who["api_key"], "api_secret": who["api_secret"]})
            token = data["data"]["token"]
            return token, {"BENCH_TOKEN": token, "BENCH_USERID": data["data"]["userid"]}

        sample = loaded["sample"]
        admin_token, admin_env = token_of(admin)
        owner_token, owner_env = token_of(sample["owner"])
        _, plain_env = token_of(sample["plain"])
        owner_rows = http(port, "GET", "/v1/server-instance", headers={
            "X-Auth-Token": owner_token, "X-Auth-Cloudauth-Id": sample["owner"]["userid"]})["data"]
        own = [i["id"] for i in owner_rows if i["cloudauth-id"] == sample["owner"]["userid"]]
        owner_uuid = owner_rows[0]["users"][0] if owner_rows else ""
        one = own[0]
        reads = dict(connections=8, threads=2, duration=duration)
        results = []

        def scenario(name: str, target_port: int, script: str, env: dict, rows: int | None = None, **kw) -> None:
            r = wrk(target_port, script, **{**reads, **kw}, env=env)
            # Where the server's peak comes from: its peak so far after each scenario.
            results.append({"scenario": name, "rows": rows, **r, "server_peak_rss_mb_after": rss_mb(server.pid)})
            print(f"bench: {name}: {r['requests_per_s']} requests/s, p99 {r['p99_ms']} ms", file=sys.stderr)

        scenario("bare app (ceiling)", bare_port, "auth.lua", {"BENCH_PATH": "/"})
        scenario("GET one instance", port, "auth.lua", {**owner_env, "BENCH_PATH": f"/v1/server-instance/{one}"}, 1)
        scenario("instance list, plain user", port, "auth.lua", {**plain_env, "BENCH_PATH": "/v1/server-instance"},
                 1)
        scenario("instance list, owner", port, "auth.lua", {**owner_env, "BENCH_PATH": "/v1/server-instance"},
                 len(owner_rows))
        scenario("instance list, superuser", port, "auth.lua", {**admin_env, "BENCH_PATH": "/v1/server-instance"},
                 loaded["instances"])
        owner_users = http(port, "GET", "/v1/user/list", headers={
            "X-Auth-Token": owner_token, "X-Auth-Cloudauth-Id": sample["owner"]["userid"]})["data"]["total"]
        scenario("user list, owner", port, "auth.lua", {**owner_env, "BENCH_PATH": "/v1/user/list"}, owner_users)
        scenario("token issue (API key)", port, "token.lua", {"BENCH_API_KEY": sample["plain"]["api_key"],
                                                              "BENCH_API_SECRET": sample["plain"]["api_secret"]})
        scenario("write mix (c=32)", port, "writes.lua",
                 {**owner_env, "BENCH_INSTANCES": ",".join(own), "BENCH_OWNER_UUID": owner_uuid,
                  "BENCH_GROUP_PREFIX": "bw" + os.urandom(2).hex()}, connections=32, threads=32)
        rss, steady_rss = rss_mb(server.pid), rss_mb(server.pid, "VmRSS")
        libvirtd_rss = rss_mb(daemon.proc.pid) if daemon is not None else None
        validation = token_validation_us(config, owner_token, sample["owner"]["userid"], 5000)
    finally:
        stop(bare)
        stop(server)
        if daemon is not None:
            daemon.stop()
    locked = (state / "serve.log").read_text().count("database is locked")
    bare_rps = results[0]["requests_per_s"]
    for r in results:
        r["ratio_to_bare"] = round(r["requests_per_s"] / bare_rps, 3)
    doc = {
        "machine": {"cpus": os.cpu_count(), "threads": args.threads, "duration_s": duration},
        "load": {k: loaded[k] for k in ("users", "owners", "managed_users", "accounts", "volumes", "groups",
                                        "instances")},
        "load_seconds": round(load_s, 1), "server_start_seconds": round(start_s, 1),
        "test_driver": "in the server process" if daemon is None else "in a private libvirtd",
        "scenarios": results, "server_peak_rss_mb": rss,
        "server_rss_after_start_mb": started_rss, "server_rss_at_end_mb": steady_rss,
        "libvirtd_peak_rss_mb": libvirtd_rss,
        "token_validation_us": validation,
        "database_is_locked_in_log": locked,
    }
    out = Path(args.json_out).resolve() if args.json_out else state / "bench-results.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'scenario':28} {'rows':>6} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'x bare':>7} {'non-2xx':>8}")
    for r in results:
        print(f"{r['scenario']:28} {r['rows'] if r['rows'] is not None else '':>6} {r['requests_per_s']:>11} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['ratio_to_bare']:>7.0%} {r['non_2xx']:>8}")
    where = (f"test driver in a private libvirtd, whose peak RSS is {libvirtd_rss} MB" if daemon is not None
             else "test driver in the server process")
    print(f"server peak RSS (VmHWM): {rss} MB, current (VmRSS) {started_rss} MB after start and {steady_rss} MB "
          f"at the end ({where}); token validation: {validation['remembered']} us per request remembered, "
          f"{validation['read_from_database']} us read from the database; "
          f"load {doc['load_seconds']} s + server start {doc['server_start_seconds']} s; "
          f"'database is locked' in the server log: {locked}")
    if not args.keep and not args.state:
        # Everything but the results: 10,000 homes and a database are not worth keeping.
        for child in state.iterdir():
            if child != out:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    print(f"results: {out}")


if __name__ == "__main__":
    main()
