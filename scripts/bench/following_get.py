"""A GET by a token a controller has cached, against the same GET on a single node (issue 40:
"a cached-token GET on a controller >= 95 % of the same GET with local auth, same run").

Why this, beside cloud_auth.py's in-process check: that check times authenticate() alone; a
request on a following controller also shares its process (and interpreter lock) with the feed
reader polling cloud auth every poll_seconds. So here both are real `cloud-agent serve`
processes on the loopback, measured with wrk and auth.lua as scripts/bench.sh measures its GETs:

- (a) a single node, local auth: a sandbox serving controller,user (the config's default);
- (b) a controller following a cloud auth: a third process, the cloud auth (a sandbox), with
  the controller registered by `cloud-agent controller add` (as in
  tests/cloud_auth/test_three_processes.py), [server] interfaces = controller.

Both get the same [server] threads. The same user (same email, password, role) logs in at (a)
and at cloud auth; one GET makes the token cached at (b) (introspected once). Then
`GET /v1/server-instance` (the user has none: the cheapest authenticated GET, where the token
check weighs most) with wrk c=8, --rounds rounds each, the order alternating per round, so
machine noise hits both alike (many short rounds rather than a few long ones: on a shared
2-core machine a round's requests/s moves by 20 % either way). Printed: each side's median
requests/s (and that round's p50 and p99), the CPU time its server spent per request (from
/proc: whether a difference in requests/s is work the server did), b/a of the median
requests/s, and the median of each round's own b/a. Every process started is stopped by its
handle, however the run ends (SIGTERM included).

Usage: .venv/bin/python scripts/bench/following_get.py [--rounds 9] [--duration 3] [--threads 4]
(also run by scripts/bench/cloud_auth.py at its end).
"""

import argparse
import configparser
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import AGENT, REPO, agent, free_port, stop, wait_ready, wrk  # noqa: E402

PASSWORD = "Bench-following-1"
ADMIN_PASSWORD = "Bench-admin-pass-2026"


def call(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300].decode(errors="replace")


def login(port: int, email: str, password: str) -> dict:
    status, body = call(port, "POST", "/v1/auth/token", {"email": email, "password": password})
    if status != 200:
        sys.exit(f"bench: login of {email} on port {port}: {status} {body}")
    return {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": body["data"]["userid"]}


def sandbox(state: Path, keys: dict[str, dict]) -> Path:
    """`init --sandbox`, `keys` set in its ini, a superuser admin@bench.example.org."""
    config = state / "controller.ini"
    agent(str(config), "init", "--sandbox", str(state))
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(config)
    for section, values in keys.items():
        if not ini.has_section(section):
            ini.add_section(section)
        ini[section].update({k: str(v) for k, v in values.items()})
    with open(config, "w") as f:
        ini.write(f)
    return config


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (all its threads: the feed reader's too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(config: Path, port: int, log: Path, procs: list) -> subprocess.Popen:
    with open(log, "w") as out:
        proc = subprocess.Popen([*AGENT, "--config", str(config), "serve", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    procs.append(proc)
    wait_ready(port, "/healthz", proc, 300)
    return proc


def add_user(config: Path, port: int) -> None:
    """The measured user, made alike on the single node and at cloud auth: by the admin, over the API."""
    agent(str(config), "user", "create-superuser", "--email", "admin@bench.example.org",
          "--password-file", "-", stdin=ADMIN_PASSWORD + "\n")
    admin = login(port, "admin@bench.example.org", ADMIN_PASSWORD)
    status, body = call(port, "POST", "/v1/user/create", {"email": "alice@bench.example.org", "password": PASSWORD},
                        headers=admin)
    if status != 200:
        sys.exit(f"bench: user create on port {port}: {status} {body}")


def measure(rounds: int = 9, duration: int = 3, threads: int = 4, keep: bool = False) -> dict:
    if shutil.which("wrk") is None:
        sys.exit("bench: wrk is missing: run scripts/setup-host.sh (apt-get install wrk)")
    # A SIGTERM (timeout, kill PID) ends the run through the finally below, which stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench: terminated"))
    state = Path(tempfile.mkdtemp(prefix="cc-bench-following-"))
    procs: list[subprocess.Popen] = []
    load_before = os.getloadavg()[0]
    try:
        server = {"threads": threads}
        # (a) the single node.
        single_port = free_port()
        single = sandbox(state / "single", {"server": {**server, "interfaces": "controller,user"}})
        single_proc = serve(single, single_port, state / "single.log", procs)
        add_user(single, single_port)
        # (b) cloud auth, the controller registered there, then the controller.
        auth_port, hpc_port = free_port(), free_port()
        auth = sandbox(state / "auth", {"server": server})
        made = agent(str(auth), "controller", "add", "hpc2", "--id", "2", "--url", f"http://127.0.0.1:{hpc_port}")
        serve(auth, auth_port, state / "auth.log", procs)
        add_user(auth, auth_port)
        secret = state / "cloud-auth.secret"
        secret.write_text(made["secret"] + "\n")
        secret.chmod(0o600)
        hpc = sandbox(state / "hpc2", {
            "controller": {"id": 2, "name": "hpc2"}, "server": {**server, "interfaces": "controller"},
            "cloud_auth": {"url": f"http://127.0.0.1:{auth_port}", "secret_file": secret, "poll_seconds": 1,
                           "timeout_seconds": 2, "offline_grace_seconds": 300}})
        hpc_proc = serve(hpc, hpc_port, state / "hpc2.log", procs)

        sides = {"single": (single_port, single_proc, login(single_port, "alice@bench.example.org", PASSWORD)),
                 "following": (hpc_port, hpc_proc, login(auth_port, "alice@bench.example.org", PASSWORD))}
        for name, (port, _, headers) in sides.items():
            # One GET each: on (b) the token's one introspection, then it is cached (the
            # controller's copy of the users may be a feed read behind: try again meanwhile).
            deadline = time.monotonic() + 15
            while (got := call(port, "GET", "/v1/server-instance", headers=headers))[0] != 200:
                if time.monotonic() > deadline:
                    sys.exit(f"bench: {name}: GET /v1/server-instance: {got}")
                time.sleep(0.2)
        kw = dict(connections=8, threads=2, duration=duration)
        got: dict[str, list[dict]] = {"single": [], "following": []}
        for r in range(rounds):
            for name in (("single", "following") if r % 2 == 0 else ("following", "single")):
                port, proc, headers = sides[name]
                # CPU the server spent per request: whether a difference in requests/s is work
                # the server did or other work on the machine.
                cpu = cpu_seconds(proc.pid)
                res = wrk(port, "auth.lua", **kw, env={"BENCH_PATH": "/v1/server-instance",
                                                       "BENCH_TOKEN": headers["X-Auth-Token"],
                                                       "BENCH_USERID": headers["X-Auth-Cloudauth-Id"]})
                res["server_cpu_ms_per_request"] = round((cpu_seconds(proc.pid) - cpu) * 1000 / res["requests"], 3)
                if res["non_2xx"] or res["socket_errors"]:
                    sys.exit(f"bench: {name}: {res['non_2xx']} non-2xx, {res['socket_errors']} socket errors")
                got[name].append(res)
            print(f"bench: GET round {r + 1}: single node {got['single'][-1]['requests_per_s']}, "
                  f"following {got['following'][-1]['requests_per_s']} requests/s", file=sys.stderr)
    finally:
        for proc in procs:
            stop(proc)
        if keep:
            print(f"bench: state folder kept: {state}", file=sys.stderr)
        else:
            shutil.rmtree(state, ignore_errors=True)
    out: dict = {"rounds": rounds, "duration_s": duration, "threads": threads, "connections": 8,
                 "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2)}
    for name, results in got.items():
        mid = sorted(results, key=lambda x: x["requests_per_s"])[len(results) // 2]
        out[name] = {"requests_per_s": [x["requests_per_s"] for x in results],
                     "median_requests_per_s": mid["requests_per_s"], "p50_ms": mid["p50_ms"], "p99_ms": mid["p99_ms"],
                     "p99_ms_worst": max(x["p99_ms"] for x in results),
                     "server_cpu_ms_per_request": [x["server_cpu_ms_per_request"] for x in results],
                     "median_server_cpu_ms_per_request": statistics.median(
                         x["server_cpu_ms_per_request"] for x in results)}
    out["ratio"] = round(out["following"]["median_requests_per_s"] / out["single"]["median_requests_per_s"], 3)
    out["ratio_per_round"] = [round(b["requests_per_s"] / a["requests_per_s"], 3)
                              for a, b in zip(got["single"], got["following"])]
    out["ratio_per_round_median"] = statistics.median(out["ratio_per_round"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="wrk runs per side, alternating (odd: a median round)")
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run")
    parser.add_argument("--threads", type=int, default=4, help="[server] threads of both servers")
    parser.add_argument("--keep", action="store_true", help="keep the state folder (its servers' logs)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    out = measure(args.rounds, args.duration, args.threads, args.keep)
    print(json.dumps(out, indent=2))
    a, b = out["single"], out["following"]
    print(f"cached-token GET on a controller: {out['ratio']:.1%} of the same GET on a single node (goal >= 95 %); "
          f"controller / single node: median requests/s {b['median_requests_per_s']} / {a['median_requests_per_s']}; "
          f"median of the rounds' own ratios {out['ratio_per_round_median']:.1%}; "
          f"p50 {b['p50_ms']} / {a['p50_ms']} ms, p99 {b['p99_ms']} / {a['p99_ms']} ms; server CPU per request "
          f"{b['median_server_cpu_ms_per_request']} / {a['median_server_cpu_ms_per_request']} ms")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
