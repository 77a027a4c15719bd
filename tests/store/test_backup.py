"""`cloud-agent backup DEST`: a consistent online copy of the database while the API writes."""

import http.client
import json
import os
import sqlite3
import stat
import threading
import time

import pytest
from waitress import create_server

from controller.auth.tokens import issue_token
from controller.config import load_config, write_config
from controller.context import build_context
from controller.users.users import insert_user
from tests.fixtures.api import config_values_for as cheap_config_values
from tests.fixtures.agent import run_agent

WRITERS = 8
PASSWORD = "Writer-pass-2026"


@pytest.fixture
def config_path(tmp_path) -> str:
    """An initialised config with cheap password hashes, so 8 writers make many users a second."""
    path = str(tmp_path / "controller.ini")
    write_config(cheap_config_values(tmp_path / "state"), path)
    proc = run_agent("--config", path, "--json", "init")
    assert proc.returncode == 0, proc.stderr
    return path


def _fill(db_path: str, rows: int = 20_000) -> None:
    """Some megabytes of history, so the copy takes a while and the writers overlap it."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany(
            "INSERT INTO audit (at_utc, actor, action, target, result, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (("2026-01-01T00:00:00Z", "filler", "POST /v1/user/create", str(i), "200", "x" * 400)
             for i in range(rows)),
        )
    conn.close()


class Api:
    """The API on waitress in this process, on a free loopback port."""

    def __init__(self, config_path: str):
        from api.app import create_app

        self.ctx = build_context(load_config(config_path))
        self.server = create_server(create_app(self.ctx, interfaces=("user",)), host="127.0.0.1", port=0,
                                    threads=WRITERS)
        self.port = self.server.effective_port
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        from waitress import wasyncore

        # Workers first: a request finishing after the loop closed would write to its closed
        # trigger pipe. Then the loop, closed from inside (closing sockets under select fails).
        self.server.task_dispatcher.shutdown()
        try:
            self.server.trigger.pull_trigger(lambda: wasyncore.close_all(self.server._map, ignore_all=True))
        except OSError:
            # The trigger's pipe is gone already (seen once in CI, EBADF): nothing wakes the
            # loop, so its sockets are closed from here, errors ignored, and the loop ends at
            # its next select.
            wasyncore.close_all(self.server._map, ignore_all=True)
        self.thread.join(timeout=10)
        self.ctx.store.close()


class Writer(threading.Thread):
    """Creates users through the API until stopped; records each id once its 200 has arrived."""

    def __init__(self, n: int, port: int, headers: dict, stop: threading.Event):
        super().__init__(daemon=True)
        self.n, self.port, self.headers, self.stop = n, port, headers, stop
        self.committed: list[tuple[float, str]] = []  # (time the answer came, user id)
        self.error: BaseException | None = None

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            i = 0
            while not self.stop.is_set():
                body = json.dumps({"email": f"w{self.n}-{i}@example.org", "password": PASSWORD})
                conn.request("POST", "/v1/user/create", body=body,
                             headers={**self.headers, "Content-Type": "application/json"})
                resp = conn.getresponse()
                data = json.loads(resp.read())
                assert resp.status == 200, data
                self.committed.append((time.monotonic(), data["data"]["userid"]))
                i += 1
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            conn.close()


def _committed(writers, until: float | None = None) -> set[str]:
    return {uid for w in writers for at, uid in list(w.committed) if until is None or at <= until}


def test_backup_while_eight_threads_write_through_the_api(config_path, tmp_path):
    db_path = load_config(config_path).database_path
    _fill(db_path)
    dest = tmp_path / "backups" / "controller.db"
    with Api(config_path) as api:
        row, secret = insert_user(api.ctx, email="admin@example.org", password=PASSWORD, roles=("superuser",))
        token = issue_token(api.ctx, api_key=row["api_key"], api_secret=secret)["token"]
        headers = {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": row["id"]}
        stop = threading.Event()
        writers = [Writer(n, api.port, headers, stop) for n in range(WRITERS)]
        for w in writers:
            w.start()
        try:
            deadline = time.monotonic() + 30
            while min(len(w.committed) for w in writers) < 5:
                assert all(w.error is None for w in writers), [w.error for w in writers]
                assert time.monotonic() < deadline, "the writers do not get going"
                time.sleep(0.01)
            began = time.monotonic()
            before = _committed(writers, until=began)
            proc = run_agent("--config", config_path, "--json", "backup", str(dest))
            ended = time.monotonic()
        finally:
            stop.set()
            for w in writers:
                w.join(timeout=30)
        assert all(w.error is None for w in writers), [w.error for w in writers]
        live = {r["id"] for r in api.ctx.store.list_users(include_inactive=True)}

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"backup": str(dest.resolve())}
    # The writers really were writing while the backup ran.
    assert _committed(writers, until=ended) - before, "no write overlapped the backup"

    copy = sqlite3.connect(dest)
    try:
        assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert copy.execute("PRAGMA foreign_key_check").fetchall() == []
        saved = {r[0] for r in copy.execute("SELECT id FROM users")}
        assert copy.execute("SELECT COUNT(*) FROM audit WHERE actor = 'filler'").fetchone()[0] == 20_000
        # Every user committed before the backup began, and only users that exist.
        assert before - saved == set(), f"{len(before - saved)} committed users missing from the backup"
        assert saved <= live
        assert copy.execute("PRAGMA user_version").fetchone()[0] > 0
    finally:
        copy.close()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600


def test_backup_refuses_to_overwrite(config_path, tmp_path):
    dest = tmp_path / "existing.db"
    dest.write_bytes(b"an older backup")
    for args in (["backup", str(dest)], ["--json", "backup", str(dest)]):
        proc = run_agent("--config", config_path, *args)
        assert proc.returncode == 1
        assert proc.stderr == f"error: {dest} exists; refusing to overwrite a backup\n"
    assert json.loads(proc.stdout) == {"error": f"{dest} exists; refusing to overwrite a backup"}
    assert dest.read_bytes() == b"an older backup"


def test_backup_human_output_and_a_restorable_copy(config_path, tmp_path):
    ctx = build_context(load_config(config_path))
    row, _ = insert_user(ctx, email="a@example.org", password=PASSWORD)
    ctx.store.close()
    dest = tmp_path / "copy.db"
    proc = run_agent("--config", config_path, "backup", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"backup written to {dest}\n"
    # Restoring is pointing a config at the copy.
    values = cheap_config_values(tmp_path / "state")
    values["database"]["path"] = dest
    restored = str(tmp_path / "restored.ini")
    write_config(values, restored)
    checks = json.loads(run_agent("--config", restored, "--json", "check").stdout)["checks"]
    assert {"name": "database", "ok": True, "detail": ""} in checks
    assert build_context(load_config(restored)).store.get_user(row["id"])["email"] == "a@example.org"


def test_backup_of_a_missing_database_fails_and_writes_nothing(config_path, tmp_path):
    os.remove(load_config(config_path).database_path)
    dest = tmp_path / "copy.db"
    proc = run_agent("--config", config_path, "backup", str(dest))
    assert proc.returncode == 1
    assert "does not exist: run `cloud-agent init`" in proc.stderr
    assert not dest.exists()
    assert not os.path.exists(load_config(config_path).database_path)


def test_backup_leaves_no_audit_row(config_path, tmp_path):
    proc = run_agent("--config", config_path, "backup", str(tmp_path / "copy.db"))
    assert proc.returncode == 0
    assert build_context(load_config(config_path)).store.list_audit() == []
