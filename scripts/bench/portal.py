#!/usr/bin/env python3
"""The cloud portal's benchmark: `bash scripts/bench.sh --portal` (docs/performance.md, "Portal").

Targets (issue 26): a portal page for a user with 50 instances answers with p95 < 150 ms
in the sandbox; logging in to the overview takes p95 < 400 ms.

In a temporary state folder: `cloud-agent init --sandbox` (libvirt's test driver in the
server process, as the sandbox runs it), `cloud-agent sandbox load` (by default 1,000
users, 10 owners with 50 instances of their own and 5 managed users each, 1,000 instances,
100 groups), then `cloud-agent serve` on a free loopback port. Or --url takes a running
sandbox and --email/--password (from `sandbox load`) name the user to log in as.

Measured over loopback, as a head node's portal is used: one person at a time logs in
while others read pages. The timing client makes one request at a time (a person's
browser, not a crowd): after --warmup requests per page, --requests GETs of each page of
the portal for the owner (the overview, the servers list, one server's page, the volume,
the groups, the managed users). Then --readers background readers start (separate
processes, each logged in as a user of the load before any timing: a person reading one
page, then pausing --reader-pause seconds, and again), and the timing client times
--logins journeys one after another: GET /portal/login, POST /portal/login (email,
password; the answer is a 303 with the session cookie), GET of the overview it points to,
each step a row of its own. No two timed logins overlap, and the readers log in before
the timing starts: a login never waits behind another user's password check, only
shares the machine with the readers' pages. Each login checks the password with argon2
once, which dominates the journey; the check alone is timed last, in this process.
Every count and wait is bounded; --max-seconds ends the measuring early (the rows say how
many were made). Prints one table and writes it as JSON (portal-results.json in the state
folder, or --json-out), with the machine's load average before and after.
"""

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from run import AGENT, REPO, agent, free_port, http, stop, wait_ready

COOKIE = "__Host-cc_portal"
LOGIN_COOKIE = "__Host-cc_login"
PAGE_TARGET_MS = 150.0
LOGIN_TARGET_MS = 400.0
_CSRF = re.compile(r'name="csrf" value="([^"]*)"')


def percentile(sorted_ms: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not sorted_ms:
        return None
    rank = max(1, -(-len(sorted_ms) * p // 100))
    return round(sorted_ms[int(rank) - 1], 2)


def summary(name: str, times_s: list[float], target_ms: float | None, **extra) -> dict:
    ms = sorted(t * 1000 for t in times_s)
    row = {"name": name, "count": len(ms), "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
           "p99_ms": percentile(ms, 99), "max_ms": percentile(ms, 100), "target_p95_ms": target_ms, **extra}
    row["met"] = None if target_ms is None else bool(ms) and row["p95_ms"] < target_ms
    return row


class Browser:
    """One browser over loopback: a kept connection and the session cookie. The cookie is
    Secure (a __Host- cookie), which a cookie jar keeps off plain http, so it is sent by hand."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.http = requests.Session()
        self.cookie: str | None = None
        self.login_cookie: str | None = None  # the login form's double-submit value

    def request(self, method: str, path: str, **kw) -> requests.Response:
        jar = [f"{name}={value}" for name, value in ((COOKIE, self.cookie), (LOGIN_COOKIE, self.login_cookie))
               if value]
        headers = {"Cookie": "; ".join(jar)} if jar else {}
        r = self.http.request(method, self.base + path, headers=headers, allow_redirects=False, timeout=30, **kw)
        if LOGIN_COOKIE in r.cookies:
            self.login_cookie = r.cookies[LOGIN_COOKIE]
        self.http.cookies.clear()
        return r

    def get(self, path: str, want: int = 200) -> requests.Response:
        r = self.request("GET", path)
        if r.status_code != want:
            sys.exit(f"bench: GET {path} answered {r.status_code}, not {want}:\n{r.text[:500]}")
        return r

    def login(self, email: str, password: str) -> tuple[float, float, float]:
        """The journey: the login page, its form posted, the page the 303 names. Returns the
        seconds of each of the three steps (the password check is in the POST's)."""
        self.cookie = None
        t0 = time.perf_counter()
        form = self.get("/portal/login")
        t1 = time.perf_counter()
        fields = {"email": email, "password": password, "next": ""}
        found = _CSRF.search(form.text)
        if found:
            fields["csrf"] = found[1]
        t1b = time.perf_counter()
        r = self.request("POST", "/portal/login", data=fields)
        t2 = time.perf_counter()
        if r.status_code != 303 or COOKIE not in r.cookies:
            sys.exit(f"bench: the login answered {r.status_code} without a session:\n{r.text[:500]}")
        self.cookie = r.cookies[COOKIE]
        self.get(r.headers["Location"])
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1b, t3 - t2

    def logout(self) -> None:
        page = self.get("/portal/")
        found = _CSRF.search(page.text)
        r = self.request("POST", "/portal/logout", data={"csrf": found[1] if found else ""})
        if r.status_code != 303:
            sys.exit(f"bench: the logout answered {r.status_code}")
        self.cookie = None


def reader(base: str, email: str, password: str, paths: list[str], pause: float, ready, stop, out) -> None:
    """A background reader (its own process, so the timing client shares no GIL with it):
    logs in, says so, then reads one page, pauses, reads the next, until told to stop."""
    browser = Browser(base)
    browser.login(email, password)
    ready.put(True)
    times, failed, i = [], 0, 0
    while not stop.wait(pause):
        t = time.perf_counter()
        r = browser.request("GET", paths[i % len(paths)])
        times.append(time.perf_counter() - t)
        failed += r.status_code != 200
        i += 1
    out.put({"times": times, "failed": failed})


class Readers:
    """--readers background readers, each a user of the load, reading pages while logins are timed."""

    def __init__(self, base: str, users: list[str], password: str, paths: list[str], *, count: int, pause: float):
        self.mp = multiprocessing.get_context("fork")
        self.ready, self.out, self.stop = self.mp.Queue(), self.mp.Queue(), self.mp.Event()
        self.count, self.pause = count, pause
        self.procs = [self.mp.Process(target=reader, daemon=True,
                                      args=(base, users[i % len(users)], password, paths, pause, self.ready,
                                            self.stop, self.out)) for i in range(count)]

    def __enter__(self) -> "Readers":
        # One after another (the per-source cap of password logins holds for the readers too),
        # and every reader has logged in before any login is timed.
        for p in self.procs:
            p.start()
            self.ready.get(timeout=120)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.results = []
        for _ in self.procs if exc[0] is None else ():
            self.results.append(self.out.get(timeout=60))
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()  # our own child, by its handle

    def row(self) -> dict:
        times = [t for r in getattr(self, "results", []) for t in r["times"]]
        failed = sum(r["failed"] for r in getattr(self, "results", []))
        return summary("  readers' pages", times, None, path=f"{self.count} readers, {self.pause} s apart",
                       failed=failed)


def measure(browser: Browser, *, pages: dict[str, str], email: str, password: str, requests_per_page: int,
            warmup: int, logins: int, max_seconds: float, readers: dict) -> list[dict]:
    deadline = time.monotonic() + max_seconds
    browser.login(email, password)
    rows = []
    for name, path in pages.items():
        for _ in range(warmup):
            browser.get(path)
        times = []
        for _ in range(requests_per_page):
            if time.monotonic() > deadline:
                break
            t = time.perf_counter()
            r = browser.get(path)
            times.append(time.perf_counter() - t)
        rows.append(summary(name, times, PAGE_TARGET_MS, path=path, bytes=len(r.content)))
        print(f"bench: {name}: p95 {rows[-1]['p95_ms']} ms", file=sys.stderr)
    browser.logout()
    times, steps = [], []
    with Readers(browser.base, **readers) as background:
        for _ in range(logins):
            if time.monotonic() > deadline:
                break
            t = time.perf_counter()
            steps.append(browser.login(email, password))
            times.append(time.perf_counter() - t)
            browser.logout()  # not timed: keeps one live session, as a person logging in again would
    journey = summary("login to overview", times, LOGIN_TARGET_MS, path="/portal/login",
                      readers=readers["count"], reader_pause_s=readers["pause"])
    rows.append(journey)
    for i, (name, path) in enumerate((("  its login page GET", "/portal/login"), ("  its login POST", "/portal/login"),
                                      ("  its overview GET", "/portal/"))):
        rows.append(summary(name, [s[i] for s in steps], None, path=path))
    if readers["count"]:
        rows.append(background.row())
    print(f"bench: login to overview: p95 {journey['p95_ms']} ms", file=sys.stderr)
    return rows


def argon2_alone(config: str | None, count: int) -> dict:
    """The one password check a login makes, alone in this process with the server's argon2
    cost (its config's, or the defaults with --url): how much of the journey is the hash, and
    how fast this machine hashes at the moment (it moves with the machine's load)."""
    sys.path.insert(0, str(REPO))
    from controller.config import load_config
    from controller.security.crypto import Passwords

    auth = load_config(config).auth if config else None
    cost = {"time_cost": auth.argon2_time_cost if auth else 3, "memory_kib": auth.argon2_memory_kib if auth else 65536,
            "parallelism": auth.argon2_parallelism if auth else 4}
    passwords = Passwords(**cost)
    stored = passwords.hash("Bench-portal-pass-2026")
    times = []
    for _ in range(count):
        t = time.perf_counter()
        passwords.verify(stored, "Bench-portal-pass-2026")
        times.append(time.perf_counter() - t)
    return summary("argon2 check alone", times, None, path="(in-process)", **cost)


def target(row: dict) -> str:
    return "" if row["target_p95_ms"] is None else f"< {row['target_p95_ms']:.0f}"


def met(row: dict) -> str:
    return "" if row["met"] is None else ("yes" if row["met"] else "NO")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running sandbox's base URL (loopback); default: start one")
    parser.add_argument("--email", default=None, help="with --url: the user to log in as")
    parser.add_argument("--password", default=None, help="with --url: that user's password")
    parser.add_argument("--server-id", default=None, help="with --url: the instance whose page is measured")
    parser.add_argument("--requests", type=int, default=200, help="GETs per page (1-2000)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed GETs per page first (0-200)")
    parser.add_argument("--logins", type=int, default=50, help="login journeys (1-500)")
    parser.add_argument("--readers", type=int, default=4,
                        help="background readers while logins are timed (0-16; 0: the machine is the client's alone)")
    parser.add_argument("--reader-pause", type=float, default=0.5, help="each reader's pause between pages (0.05-10 s)")
    parser.add_argument("--max-seconds", type=float, default=300, help="ends the measuring early (10-1800)")
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--owners", type=int, default=10)
    parser.add_argument("--owner-instances", type=int, default=50)
    parser.add_argument("--managed-per-owner", type=int, default=5)
    parser.add_argument("--instances", type=int, default=1_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--json-out", default=None, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the state folder")
    args = parser.parse_args()
    count = min(max(args.requests, 1), 2000)
    warmup = min(max(args.warmup, 0), 200)
    logins = min(max(args.logins, 1), 500)
    max_seconds = min(max(args.max_seconds, 10), 1800)
    reader_count = min(max(args.readers, 0), 16)
    reader_pause = min(max(args.reader_pause, 0.05), 10.0)

    state = server = config = None
    load = None
    load_before = os.getloadavg()
    uptime_before = uptime()
    try:
        if args.url:
            if not (args.email and args.password):
                sys.exit("bench: --url needs --email and --password")
            if not re.match(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/?$", args.url):
                sys.exit("bench: --url must be a loopback http:// origin")
            base, email, password, server_id = args.url, args.email, args.password, args.server_id
            reader_users = [email]
        else:
            state = Path(tempfile.mkdtemp(prefix="cc-bench-portal-")).resolve()
            config = str(state / "controller.ini")
            agent(config, "init", "--sandbox", str(state))
            started = time.monotonic()
            load = agent(config, "sandbox", "load", "--users", str(args.users), "--owners", str(args.owners),
                         "--managed-per-owner", str(args.managed_per_owner), "--instances", str(args.instances),
                         "--owner-instances", str(args.owner_instances), "--groups", str(args.groups))
            load["seconds"] = round(time.monotonic() - started, 1)
            port = free_port()
            log = open(state / "serve.log", "w")
            server = subprocess.Popen([*AGENT, "--config", config, "serve", "--port", str(port)], cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT)
            wait_ready(port, "/healthz", server, 600)
            base = f"http://127.0.0.1:{port}"
            owner = load["sample"]["owner"]
            email, password = owner["email"], load["password"]
            token = http(port, "POST", "/v1/auth/token",
                         {"api_key": owner["api_key"], "api_secret": owner["api_secret"]})["data"]["token"]
            rows = http(port, "GET", "/v1/server-instance",
                        headers={"X-Auth-Token": token, "X-Auth-Cloudauth-Id": owner["userid"]})["data"]
            own = [i for i in rows if i["cloudauth-id"] == owner["userid"]]
            load["owner_sees_instances"], load["owner_owns_instances"] = len(rows), len(own)
            server_id = own[0]["id"]
            # The readers: the load's other sample users first (a managed user, plain users), then
            # more sessions of the owner.
            reader_users = [u["email"] for k, u in load["sample"].items() if k != "owner"] + [email]
        browser = Browser(base)
        if not server_id:  # --url without --server-id: the first one the servers page links to
            browser.login(email, password)
            linked = re.findall(r'href="/portal/servers/([0-9a-zA-Z-]+)"', browser.get("/portal/servers").text)
            server_id = next((i for i in linked if i != "new"), None)
            browser.logout()
        pages = {"overview": "/portal/", "servers list": "/portal/servers", "volume": "/portal/volume",
                 "groups": "/portal/groups", "managed users": "/portal/users"}
        if server_id:
            pages = {**dict(list(pages.items())[:2]), "one server": f"/portal/servers/{server_id}",
                     **dict(list(pages.items())[2:])}
        # Readers read the pages every user has (one server's page is the owner's, the managed
        # users' page an owner's).
        reader_paths = [p for n, p in pages.items() if n not in ("one server", "managed users")]
        results = measure(browser, pages=pages, email=email, password=password, requests_per_page=count,
                          warmup=warmup, logins=logins, max_seconds=max_seconds,
                          readers={"users": reader_users, "password": password, "paths": reader_paths,
                                   "count": reader_count, "pause": reader_pause})
        results.append(argon2_alone(config, min(logins, 20)))
    finally:
        stop(server)
    load_after = os.getloadavg()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                            timeout=10).stdout.strip()
    doc = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
                    "uptime_before": uptime_before, "uptime_after": uptime()},
        "client": "one, sequential, loopback",
        "background": {"readers": reader_count, "reader_pause_s": reader_pause,
                       "what": "each reader its own process and session: a page, a pause, the next"}, "requests_per_page": count, "warmup_per_page": warmup,
        "url": args.url, "sandbox_load": ({k: load[k] for k in ("users", "owners", "managed_users", "groups",
                                                                  "instances", "owner_sees_instances",
                                                                  "owner_owns_instances", "seconds")}
                                          if load else None),
        "results": results,
    }
    out = Path(args.json_out).resolve() if args.json_out else (state or Path.cwd()) / "portal-results.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'portal':20} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'target':>8} {'met':>4}")
    for r in results:
        cells = " ".join(f"{r[k]:>8.1f}" if r[k] is not None else f"{'-':>8}"
                         for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms"))
        print(f"{r['name']:20} {r['count']:>5} {cells} {target(r):>8} {met(r):>4}")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} ({os.cpu_count()} CPUs)")
    if state is not None and not args.keep:
        for child in state.iterdir():
            if child != out:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    print(f"results: {out}")


if __name__ == "__main__":
    main()
