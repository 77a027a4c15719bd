#!/usr/bin/env python3
"""Measure request throughput and latency of a sandbox server on loopback.

Starts `cloud-agent serve` on a fresh sandbox in a temporary folder, makes a
superuser and some data, then sends a bounded number of requests from N client
threads to a few endpoints and prints requests/s with p50/p99 latency for each.
Loopback only; stops the server it started.

    .venv/bin/python scripts/bench.py --requests 2000 --clients 8
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

AGENT = str(Path(sys.executable).with_name("cloud-agent"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent(config: str, *args: str) -> dict:
    out = subprocess.run([AGENT, "--config", config, "--json", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def call(port: int, method: str, path: str, headers: dict, body: dict | None = None) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    start = time.perf_counter()
    conn.request(method, path, body=data, headers={**headers, "Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    elapsed = time.perf_counter() - start
    conn.close()
    return resp.status, elapsed


def run(port: int, path: str, headers: dict, *, requests: int, clients: int) -> dict:
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    per_client = requests // clients

    def worker():
        nonlocal errors
        mine, bad = [], 0
        for _ in range(per_client):
            status, elapsed = call(port, "GET", path, headers)
            mine.append(elapsed)
            bad += status != 200
        with lock:
            latencies.extend(mine)
            errors += bad

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "path": path,
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": round(len(latencies) / wall),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per endpoint (bounded)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--users", type=int, default=100, help="managed users to create for the list endpoint")
    args = parser.parse_args()
    requests = min(args.requests, 100_000)

    with tempfile.TemporaryDirectory() as state:
        config = os.path.join(state, "controller.ini")
        agent(config, "init", "--sandbox", state)
        admin = agent(config, "user", "create-superuser", "--email", "bench@example.org", "--password", "Bench-pass-2026")
        agent(config, "flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
        port = free_port()
        server = subprocess.Popen([AGENT, "--config", config, "serve", "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if call(port, "GET", "/healthz", {})[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("server did not start")
                time.sleep(0.1)
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.request("POST", "/v1/auth/token", json.dumps(
                {"api_key": admin["api_key"], "api_secret": admin["api_secret"]}), {"Content-Type": "application/json"})
            token = json.loads(conn.getresponse().read())["data"]["token"]
            headers = {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": admin["userid"]}
            for i in range(args.users):
                call(port, "POST", "/v1/user/create", headers,
                     {"email": f"user{i}@example.org", "password": "User-pass-2026!"})
            results = [
                run(port, path, headers, requests=requests, clients=args.clients)
                for path in ("/healthz", "/v1/server-flavor", f"/v1/user/view/{admin['userid']}", "/v1/user/list")
            ]
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(json.dumps({"clients": args.clients, "results": results}, indent=2))


if __name__ == "__main__":
    main()
