"""One cloud auth, one controller following it (docs/clusters.md): what following costs.

Cloud auth is served over HTTP on the loopback (waitress, in this process); the controller
follows it with its real client. Printed, and written as JSON with --json-out:

- resync: a controller's first read (a snapshot) of N users with an account each;
- check: the token check of a request on the controller, by a token it has cached,
  against the same check by a token of its own database (a single node), p50/p99;
- first use: the check of a token the controller has not seen (an introspection over
  HTTP, then cached), p50/p99;
- revocations: for each kind (deactivation, deletion, secret reset, password set, role
  revoked), the time from the change at cloud auth until the controller refuses what it
  had accepted (the token, or the role's power), over TRIALS trials, with the feed read
  every poll_seconds (1);
- get: at the end, a cached-token GET on a controller against the same GET on a single node,
  real servers measured with wrk (following_get.py; --get-rounds 0 leaves it out).

Usage: .venv/bin/python scripts/bench/cloud_auth.py [--users 10000] [--trials 20] [--get-rounds 9]
       [--get-duration 3] [--json-out PATH]
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from controller.auth.tokens import authenticate, issue_token  # noqa: E402
from controller.cloud_auth import registry  # noqa: E402
from controller.cloud_auth.client import CloudAuthClient  # noqa: E402
from controller.cloud_auth.follower import Follower  # noqa: E402
from controller.config import config_from_dict, sandbox_values  # noqa: E402
from controller.context import build_context  # noqa: E402
from controller.errors import Unauthenticated  # noqa: E402
from controller.security.crypto import generate_key_file  # noqa: E402
from controller.portal import sessions as portal_sessions  # noqa: E402
from controller.store import Store, utc_now  # noqa: E402
from controller.users import users  # noqa: E402

PASSWORD = "Bench-password-1"


def context(folder: Path, **sections):
    values = sandbox_values(str(folder))
    values["auth"].update({"argon2_time_cost": 1, "argon2_memory_kib": 1024})
    for name, keys in sections.items():
        values.setdefault(name, {}).update(keys)
    config = config_from_dict(values)
    generate_key_file(config.auth.secret_key_file)
    store = Store(config.database_path, create=True)
    store.migrate()
    return build_context(config, store=store)


def bulk_users(ctx, n: int) -> None:
    """N users with an account each on cluster 2, in one transaction (the triggers write the feed)."""
    now = utc_now()
    with ctx.store.write() as conn:
        for i in range(n):
            user_id = str(uuid.uuid4())
            conn.execute("INSERT INTO users (id, email, password_hash, api_key, api_secret_enc, created_at_utc) "
                         "VALUES (?, ?, '!', ?, 'x', ?)", (user_id, f"u{i}@bench.example.org", f"ak_{uuid.uuid4().hex}",
                                                          now))
            conn.execute("INSERT INTO registered_accounts (controller_id, username, user_id, uuid, uid, created_at_utc) "
                         "VALUES (2, ?, ?, ?, ?, ?)", (f"u{i}", user_id, str(uuid.uuid4()), 20000 + i, now))


def serve(app):
    from waitress.server import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=8)
    threading.Thread(target=server.run, daemon=True).start()
    return server, f"http://127.0.0.1:{server.effective_port}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=10000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--checks", type=int, default=5000)
    parser.add_argument("--get-rounds", type=int, default=9, help="wrk rounds per side of the GET (0: none)")
    parser.add_argument("--get-duration", type=int, default=3, help="seconds per wrk run of the GET")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    from api.app import create_app

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="cc-bench-cloud-auth-") as tmp:
        tmp = Path(tmp)
        auth = context(tmp / "auth", server={"interfaces": "controller,user"})
        made = registry.add_controller(auth, controller_id=2, name="hpc2", url="http://127.0.0.1:1")
        server, base = serve(create_app(auth, interfaces=("controller", "user")))
        secret = tmp / "secret"
        secret.write_text(made["secret"])
        secret.chmod(0o600)
        hpc = context(tmp / "hpc2", server={"interfaces": "controller"}, controller={"id": "2"},
                      cloud_auth={"url": base, "secret_file": str(secret), "poll_seconds": "1",
                                  "timeout_seconds": "2", "offline_grace_seconds": "300"})
        follower = Follower(hpc, CloudAuthClient(hpc.config, made["secret"]))
        hpc.cloud_auth = follower

        # resync
        bulk_users(auth, args.users)
        started = time.perf_counter()
        follower.poll()
        out["resync_seconds"] = time.perf_counter() - started
        out["resync_users"] = hpc.store._one("SELECT COUNT(*) AS n FROM users")["n"]

        # check: cached vs local; first use (the feed read by its thread every second, as in `serve`)
        follower.start()
        row, secret_ = users.insert_user(auth, email="alice@example.org", password=PASSWORD)
        follower.poll()
        remote_token = issue_token(auth, api_key=row["api_key"], api_secret=secret_)["token"]
        authenticate(hpc, token=remote_token, user_id=row["id"])
        local_row, local_secret = users.insert_user(auth, email="local@example.org", password=PASSWORD)
        local_token = issue_token(auth, api_key=local_row["api_key"], api_secret=local_secret)["token"]

        def timed(fn, n):
            took = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                took.append((time.perf_counter() - t) * 1000)
            return took

        # The same check a single node makes (auth's own database, no follower) and the follower's.
        local = timed(lambda: authenticate(auth, token=local_token, user_id=local_row["id"]), args.checks)
        cached = timed(lambda: authenticate(hpc, token=remote_token, user_id=row["id"]), args.checks)
        out["check_ms"] = {"local_p50": pct(local, .5), "local_p99": pct(local, .99),
                           "cached_p50": pct(cached, .5), "cached_p99": pct(cached, .99)}
        tokens = [issue_token(auth, api_key=row["api_key"], api_secret=secret_)["token"] for _ in range(200)]
        first = []
        for token in tokens:
            t = time.perf_counter()
            authenticate(hpc, token=token, user_id=row["id"])
            first.append((time.perf_counter() - t) * 1000)
        out["first_use_ms"] = {"p50": pct(first, .5), "p99": pct(first, .99),
                               "over_cached_p99": pct(first, .99) - pct(cached, .99)}

        # revocations
        kinds = {}

        def trial(kind: str) -> float:
            email = f"r{uuid.uuid4().hex[:8]}@example.org"
            roles = ("view_user",) if kind == "role revoked" else ()
            user, sec = users.insert_user(auth, email=email, password=PASSWORD, roles=roles)
            via = "password" if kind == "password set" else "api_key"
            session_id = None
            if kind == "portal logout":
                # A portal session's own token, as cloud auth's portal sends it to a cluster.
                session_id = portal_sessions.start(auth, user["id"], now=int(time.time()))
                token = portal_sessions.token_of(session_id)
            else:
                token = (issue_token(auth, email=email, password=PASSWORD) if via == "password"
                         else issue_token(auth, api_key=user["api_key"], api_secret=sec))["token"]
            deadline = time.monotonic() + 10
            while True:  # the controller has the user and the token
                try:
                    if authenticate(hpc, token=token, user_id=user["id"]):
                        break
                except Exception:  # noqa: BLE001 - the copy is still behind: try again
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            changes = {
                "deactivation": lambda: auth.store.update_user(user["id"], {"active": 0}),
                "deletion": lambda: auth.store.delete_user(user["id"]),
                "secret reset": lambda: users.admin_api_secret(auth, auth.store.get_user(user["id"]), reset=True),
                "password set": lambda: users.admin_set_password(auth, auth.store.get_user(user["id"]),
                                                                 PASSWORD + "x"),
                "role revoked": lambda: users.change_role(auth, email, "view_user", grant=False),
                "portal logout": lambda: portal_sessions.end(
                    auth, portal_sessions.find(auth, session_id, now=int(time.time()))),
            }
            started = time.perf_counter()
            changes[kind]()
            while True:
                try:
                    requester = authenticate(hpc, token=token, user_id=user["id"])
                    if kind == "role revoked" and "view_user" not in requester.roles:
                        break
                except Unauthenticated:
                    break
                if time.perf_counter() - started > 10:
                    return float("inf")
                time.sleep(0.01)
            return time.perf_counter() - started

        for kind in ("deactivation", "deletion", "secret reset", "password set", "portal logout", "role revoked"):
            took = [trial(kind) for _ in range(args.trials)]
            kinds[kind] = {"p50": statistics.median(took), "p99": pct(took, .99), "max": max(took)}
        follower.stop()
        out["revocation_seconds"] = kinds
        server.close()
    if args.get_rounds > 0:
        # After the in-process part, whose servers and threads are stopped: they would take CPU.
        from following_get import measure

        out["get"] = measure(rounds=args.get_rounds, duration=args.get_duration)
    print(json.dumps(out, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
