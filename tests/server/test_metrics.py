"""The Prometheus endpoint: read with prometheus_client's own text parser, its names, types
and labels, and values that move with what the test does; one served `cloud-agent serve`
scraped over HTTP on its metrics address; the example scrape config and alert rules name
only what the service exports."""

import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from falcon import testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from api.metrics_server import PATH, MetricsServer, start_metrics
from controller.hosts import host_records
from controller.config import DEFAULTS
from controller.errors import InvalidInput
from controller.monitoring.metrics import HostRefresher, metrics_of
from controller.maintenance.reconcile import reconcile
from tests.fixtures.agent import AGENT, agent_ok
from tests.fixtures.api import enable, give_volume, make_caller
from tests.fixtures.server import free_port, sandbox_with_admin, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
P = "cloud_controller_"


def parse(text: str) -> dict:
    """name -> family, as a Prometheus server reads the exposition."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def scrape(ctx) -> dict:
    return parse(generate_latest(metrics_of(ctx).registry).decode())


def value(families: dict, family: str, sample: str | None = None, **labels) -> float | None:
    """The value of the one sample of `family` (named `sample`, default the family's) with these
    labels; None when there is none."""
    found = [s.value for s in families[P + family].samples
             if s.name == P + (sample or family) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.fixture
def service(cctx, catalog):
    """The controller on fake hosts, its config's host recorded, and alice with an account and home."""
    from controller.hosts.host_routing import record_config_host

    cctx.config = cctx.config.with_values({"metrics": {"top_users": "3"}, "limits": {
        "instances": "10", "vcpus": "20", "memory_mb": "51200", "groups": "20", "managed_users": "50"}})
    record_config_host(cctx)
    client = testing.TestClient(create_app(cctx))
    alice = make_caller(cctx, "alice@example.org")
    enable(cctx, alice, username="alice")
    give_volume(client, alice)
    return {"ctx": cctx, "client": client, "alice": alice, "catalog": catalog}


def create(service) -> dict:
    r = service["client"].simulate_post("/v1/server-instance", headers=service["alice"].headers, json={
        "server-image": service["catalog"]["public"]["id"], "server-flavor": service["catalog"]["small"]["id"]})
    assert r.status_code == 201, r.json
    return r.json["data"][0]


def test_names_types_and_labels(service):
    families = scrape(service["ctx"])
    types = {
        "http_requests": "counter", "http_request_duration_seconds": "histogram", "token_checks": "counter",
        "logins": "counter", "instances": "gauge", "host_enabled": "gauge", "host_reachable": "gauge",
        "host_vcpus": "gauge", "host_memory_bytes": "gauge", "host_vcpu_limit": "gauge",
        "host_memory_limit_bytes": "gauge", "host_allocated_vcpus": "gauge", "host_allocated_memory_bytes": "gauge",
        "usage": "gauge", "users_at_limit": "gauge", "usage_ratio_max": "gauge", "user_usage_ratio": "gauge",
        "reconcile_drift": "gauge", "reconcile_fixed": "gauge", "reconcile_last_run_timestamp_seconds": "gauge",
        "database_bytes": "gauge", "health_check_ok": "gauge", "scrape_error": "gauge",
        "instances_expiring": "gauge", "instances_expired": "gauge",
    }
    assert {name: families[P + name].type for name in types} == types
    assert set(families) == {P + name for name in types}  # nothing unlisted (docs/scaling.md lists these)
    # The series known from the start, at 0.
    assert {tuple(sorted(s.labels.items())) for s in families[P + "logins"].samples} == {
        (("method", m), ("result", r)) for m in ("password", "api_key") for r in ("ok", "failed", "refused", "invalid")}
    assert value(families, "host_enabled", host="default") == 1
    assert value(families, "host_reachable", host="default") == 1
    assert {s.labels["part"]: s.value for s in families[P + "scrape_error"].samples} == dict.fromkeys(
        ("database_files", "instances", "leases", "hosts", "usage", "reconcile", "health"), 0)


@pytest.mark.filterwarnings("ignore:Unknown REQUEST_METHOD")
def test_a_request_moves_its_route_template_not_its_path(service):
    ctx, client, alice = service["ctx"], service["client"], service["alice"]
    route = "/v1/server-instance/{id}"
    before = scrape(ctx)
    assert value(before, "http_requests", "http_requests_total", route=route, status="404") is None
    for raw in ("0c1e5b4e-0000-4000-8000-000000000001", "0c1e5b4e-0000-4000-8000-000000000002", "not-a-uuid"):
        assert client.simulate_get(f"/v1/server-instance/{raw}", headers=alice.headers).status_code == 404
    assert client.simulate_get("/v1/no/such/path/at-all").status_code == 404
    after = scrape(ctx)
    assert value(after, "http_requests", "http_requests_total", route=route, method="GET", status="404") == 3
    assert value(after, "http_request_duration_seconds", "http_request_duration_seconds_count", route=route,
                 method="GET", status_class="4xx") == 3
    assert value(after, "http_request_duration_seconds", "http_request_duration_seconds_bucket", route=route,
                 method="GET", status_class="4xx", le="+Inf") == 3
    assert value(after, "http_request_duration_seconds", "http_request_duration_seconds_sum", route=route,
                 method="GET", status_class="4xx") > 0
    assert value(after, "http_requests", "http_requests_total", route="none", status="404") == 1
    routes = {s.labels["route"] for s in after[P + "http_requests"].samples}
    assert not any("0c1e5b4e" in r or "not-a-uuid" in r or "at-all" in r for r in routes), routes
    # A method outside the known ones is one label value, not one per token a client makes up.
    client.simulate_request("BREW", "/healthz")
    client.simulate_request("SPILL", "/healthz")
    assert value(scrape(ctx), "http_requests", "http_requests_total", route="/healthz", method="other") == 2


def test_the_kept_series_count_each_status_apart_and_keep_no_made_up_method(service):
    """Series are looked up once per (route, method, status) and kept: the next request of the
    same kind moves the same series, another status its own, and a made-up method is counted
    under "other" without becoming a kept key (the keys stay bounded)."""
    ctx, client, alice = service["ctx"], service["client"], service["alice"]
    route = "/v1/server-instance/{id}"
    made = create(service)
    for _ in range(2):
        assert client.simulate_get(f"/v1/server-instance/{made['id']}", headers=alice.headers).status_code == 200
    unknown = "0c1e5b4e-0000-4000-8000-0000000000ff"
    assert client.simulate_get(f"/v1/server-instance/{unknown}", headers=alice.headers).status_code == 404
    after = scrape(ctx)
    assert value(after, "http_requests", "http_requests_total", route=route, method="GET", status="200") == 2
    assert value(after, "http_requests", "http_requests_total", route=route, method="GET", status="404") == 1
    assert value(after, "http_request_duration_seconds", "http_request_duration_seconds_count", route=route,
                 method="GET", status_class="2xx") == 2
    for token in ("BREW", "SPILL", "STEEP"):
        client.simulate_request(token, "/healthz")
    assert value(scrape(ctx), "http_requests", "http_requests_total", route="/healthz", method="other") == 3
    assert not [key for key in metrics_of(ctx)._series if key[1] in ("BREW", "SPILL", "STEEP")]


def test_a_create_moves_instances_allocation_and_usage(service):
    ctx = service["ctx"]
    before = scrape(ctx)
    assert value(before, "instances", host="default", status="running") is None
    assert value(before, "host_allocated_vcpus", host="default") == 0
    assert value(before, "usage", kind="instances") == 0
    instance = create(service)
    after = scrape(ctx)
    assert value(after, "instances", host="default", status="running") == 1
    assert value(after, "host_allocated_vcpus", host="default") == 1  # flavor small: 1 vCPU, 1024 MB
    assert value(after, "host_allocated_memory_bytes", host="default") == 1024 * 1024 * 1024
    assert value(after, "usage", kind="instances") == 1
    assert value(after, "usage", kind="memory_mb") == 1024
    alice = service["alice"].id  # limits 10 instances, 51200 MB: a tenth and a fiftieth
    assert value(after, "user_usage_ratio", kind="instances", user=alice) == pytest.approx(0.1)
    assert value(after, "usage_ratio_max", kind="memory_mb") == pytest.approx(1024 / 51200)
    assert value(after, "users_at_limit", kind="instances") == 0
    # At her limit of one instance she counts among the users at their limit.
    ctx.store.set_limit_overrides(alice, {"instances": 1})
    assert value(scrape(ctx), "users_at_limit", kind="instances") == 1
    r = service["client"].simulate_delete(f"/v1/server-instance/{instance['id']}", headers=service["alice"].headers)
    assert r.status_code in (200, 204), r.text
    gone = scrape(ctx)
    assert value(gone, "instances", host="default", status="running") is None
    assert value(gone, "usage", kind="instances") == 0


def test_top_users_are_bounded_and_off_by_default(service):
    ctx = service["ctx"]
    for i in range(5):
        caller = make_caller(ctx, f"user{i}@example.org")
        ctx.store.set_limit_overrides(caller.id, {"groups": 10 - i})
        owned = make_caller(ctx, f"managed{i}@example.org", owner=caller)
        assert owned.id
    top = {s.labels["user"]: s.value for s in scrape(ctx)[P + "user_usage_ratio"].samples
           if s.labels["kind"] == "managed_users"}
    assert len(top) == 3 and all(v == pytest.approx(1 / 50) for v in top.values())  # [metrics] top_users = 3
    ctx.config = ctx.config.with_values({"metrics": {"top_users": "0"}})
    ctx.metrics = None
    families = scrape(ctx)
    assert families[P + "user_usage_ratio"].samples == []
    assert value(families, "usage", kind="managed_users") == 5


def test_logins_and_token_checks_are_counted(service):
    ctx, client, alice = service["ctx"], service["client"], service["alice"]
    before = scrape(ctx)
    r = client.simulate_post("/v1/auth/token", json={"email": alice.email, "password": "wrong-password-1"})
    assert r.status_code == 401
    r = client.simulate_post("/v1/auth/token", json={"api_key": alice.api_key, "api_secret": alice.api_secret})
    assert r.status_code == 200
    r = client.simulate_post("/v1/auth/token", json={"email": alice.email})
    assert r.status_code == 400
    assert client.simulate_get("/v1/server-instance", headers={**alice.headers, "X-Auth-Token": "x" * 40}
                               ).status_code == 401
    assert client.simulate_get("/v1/server-instance").status_code == 401
    after = scrape(ctx)

    def moved(family, sample, **labels):
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    assert moved("logins", "logins_total", method="password", result="failed") == 1
    assert moved("logins", "logins_total", method="api_key", result="ok") == 1
    assert moved("logins", "logins_total", method="password", result="invalid") == 1
    assert moved("token_checks", "token_checks_total", result="invalid") == 1
    assert moved("token_checks", "token_checks_total", result="missing") == 1
    assert moved("token_checks", "token_checks_total", result="ok") == 0


def test_a_disabled_or_unreachable_host_shows_without_a_call_at_scrape(service, adapters):
    ctx = service["ctx"]
    adapters.fake_hosts.add("node-a", vcpus=8, memory_mb=16384)
    adapters.fake_hosts.add("node-b", vcpus=4, memory_mb=8192)
    host_records.add_host(ctx, name="node-a", uri="fake://node-a")
    host_records.add_host(ctx, name="node-b", uri="fake://node-b")
    host_records.set_enabled(ctx, "node-b", False)
    adapters.fake_hosts.kill("node-a")
    calls = sum(f.host_calls for f in adapters.fake_hosts.fakes.values())
    families = scrape(ctx)
    assert sum(f.host_calls for f in adapters.fake_hosts.fakes.values()) == calls  # a scrape asks no host
    assert value(families, "host_reachable", host="node-a") == 1  # nothing found it dead yet
    assert value(families, "host_enabled", host="node-b") == 0
    assert value(families, "host_vcpus", host="node-a") == 8
    assert value(families, "host_memory_bytes", host="node-a") == 16384 * 1024 * 1024
    # [capacity] of the sandbox: cpu ratio 1280, ram ratio 7000, nothing reserved.
    assert value(families, "host_vcpu_limit", host="node-b") == 4 * 1280
    assert value(families, "host_memory_limit_bytes", host="node-b") == 8192 * 7000 * 1024 * 1024
    # The refresher's round (its own thread in the service) finds it, and the scrape shows it.
    assert HostRefresher(ctx, 15).refresh() == {"node-a"}
    families = scrape(ctx)
    assert value(families, "host_reachable", host="node-a") == 0
    assert value(families, "host_reachable", host="node-b") == 1


def test_drift_of_the_last_reconcile_by_kind(service, adapters):
    ctx = service["ctx"]
    families = scrape(ctx)
    assert families[P + "reconcile_drift"].samples == []
    assert families[P + "reconcile_last_run_timestamp_seconds"].samples == []
    instance = create(service)
    adapters.hypervisor.destroy(instance["id"])  # behind the service's back
    started = int(time.time())
    drift = reconcile(ctx)
    assert [d["kind"] for d in drift] == ["domain-missing"]
    families = scrape(ctx)
    assert value(families, "reconcile_drift", kind="domain-missing") == 1
    assert value(families, "reconcile_fixed", kind="domain-missing") == 0
    assert value(families, "reconcile_last_run_timestamp_seconds") >= started
    reconcile(ctx, fix=True)
    families = scrape(ctx)
    assert value(families, "reconcile_drift", kind="domain-missing") == 0
    assert value(families, "reconcile_fixed", kind="domain-missing") == 1
    reconcile(ctx)
    assert scrape(ctx)[P + "reconcile_drift"].samples == []


def test_database_size_and_health(service):
    ctx = service["ctx"]
    families = scrape(ctx)
    assert value(families, "database_bytes", file="db") > 0
    assert families[P + "health_check_ok"].samples == []  # no monitor in this process: nothing claimed
    from controller.monitoring.health import monitor_of

    monitor_of(ctx).refresh_now()
    checks = {s.labels["check"]: s.value for s in scrape(ctx)[P + "health_check_ok"].samples}
    assert checks["database"] == 1 and checks["secret_key"] == 1
    Path(ctx.config.auth.secret_key_file).unlink()
    monitor_of(ctx).refresh_now()
    assert value(scrape(ctx), "health_check_ok", check="secret_key") == 0
    monitor_of(ctx).stop()


def test_each_context_has_its_own_registry(service, tmp_path):
    from tests.fixtures.api import config_values_for, new_context

    other = new_context(config_values_for(tmp_path / "other"))
    testing.TestClient(create_app(other)).simulate_get("/healthz")
    assert value(scrape(other), "http_requests", "http_requests_total", route="/healthz") == 1
    assert value(scrape(service["ctx"]), "http_requests", "http_requests_total", route="/healthz") is None
    other.store.close()


# -- the endpoint, in process --------------------------------------------------------------
def _get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_endpoint_serves_the_exposition_at_metrics_only(service):
    ctx = service["ctx"]
    server = MetricsServer(ctx, host="127.0.0.1", port=0).start()
    try:
        host, port = server.address
        status, text = _get(f"http://{host}:{port}{PATH}")
        assert status == 200
        assert value(parse(text), "database_bytes", file="db") > 0
        assert _get(f"http://{host}:{port}/v1/server-instance")[0] == 404
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()


def test_off_unless_enabled_and_never_on_the_api_port(service):
    ctx = service["ctx"]
    assert DEFAULTS["metrics"] == {"enabled": "true", "listen_host": "127.0.0.1", "listen_port": "9180",
                                   "refresh_seconds": "15", "top_users": "0"}
    assert ctx.config.metrics.enabled is False  # the sandbox profile writes it off
    with pytest.raises(InvalidInput, match=r"^config \[metrics\] listen_port must be a TCP port, 1-65535$"):
        ctx.config.with_values({"metrics": {"listen_port": "70000"}})
    assert start_metrics(ctx) is None
    with pytest.raises(InvalidInput, match=r"\[metrics\] listen_port 8123 is the API's port"):
        start_metrics(ctx, port=8123, api_address=("127.0.0.1", 8123))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(InvalidInput, match=r"metrics endpoint not started: cannot listen on 127\.0\.0\.1:"):
            start_metrics(ctx, port=taken.getsockname()[1])


# -- the served service -------------------------------------------------------------------------
def _names(families: dict) -> set[str]:
    """Every sample name a family may carry, as PromQL sees them."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {f.name + s for f in families.values() for s in suffixes.get(f.type, ("",))}


_PROMQL_WORDS = {"by", "on", "and", "or", "unless", "without", "ignoring", "group_left", "group_right", "bool",
                 "offset", "inf", "nan"}


def expression_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions,
    aggregation clauses, label matchers, strings, durations or keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr))
    return {n for n in names if n.lower() not in _PROMQL_WORDS and not re.fullmatch(r"\d.*", n)}


def test_expression_metrics_reads_names_only():
    assert expression_metrics('sum by (kind) (rate(a_total{x=~"5.."}[5m])) / on (host) b > 0.9 or up == 0') == {
        "a_total", "b", "up"}


@pytest.mark.integration
def test_served_metrics_on_their_own_address(tmp_path):
    state, config, admin = sandbox_with_admin("cc-metrics-", "Admin-pass-2026")
    try:
        metrics_port = free_port()
        log = tmp_path / "serve.log"
        proc, http = start_server(config, log, args=("--metrics-port", str(metrics_port)))
        try:
            url = f"http://127.0.0.1:{metrics_port}{PATH}"
            status, text = _get(url)
            assert status == 200, text
            before = parse(text)
            # A bad login through the API moves the failures the endpoint shows.
            status, _, _ = http.call("POST", "/v1/auth/token", {"email": "admin@example.org", "password": "nope-1"})
            assert status == 401
            after = parse(_get(url)[1])
            assert (value(after, "logins", "logins_total", method="password", result="failed")
                    - value(before, "logins", "logins_total", method="password", result="failed")) == 1
            assert value(after, "http_requests", "http_requests_total", route="/v1/auth/token", status="401") == 1
            assert value(after, "database_bytes", file="db") > 0
            assert value(after, "host_reachable", host="default") == 1
            assert value(after, "health_check_ok", check="database") == 1
            # The API does not serve them, and the metrics answer only on their configured address.
            assert http.call("GET", PATH)[0] == 404
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.2", metrics_port), timeout=2).close()

            # Drift found by `cloud-agent reconcile` in its own process reaches the service's metrics.
            _drift_from_another_process(config, http, admin, state)
            families = parse(_get(url)[1])
            assert value(families, "reconcile_drift", kind="home-missing") == 1

            # The alert rules and the scrape config name what this service exports.
            exported = _names(families) | {"up"}  # `up` is Prometheus's own, per target
            groups = yaml.safe_load((ROOT / "etc/prometheus/alerts.yml").read_text())["groups"]
            rules = [rule for group in groups for rule in group["rules"]]
            wanted = {"CloudControllerDown", "CloudControllerServerErrors", "CloudControllerHostUnreachable",
                      "CloudControllerDrift", "CloudControllerCapacityNearlyFull", "CloudControllerLoginFailureBurst",
                      "CloudControllerInstancesExpired", "CloudControllerLeaseSweepBehind"}
            assert wanted <= {r["alert"] for r in rules}
            for rule in rules:
                used = expression_metrics(rule["expr"])
                assert used and used <= exported, (rule["alert"], used - exported)
            job = yaml.safe_load((ROOT / "etc/prometheus/scrape.yml").read_text())["scrape_configs"][0]
            assert job["metrics_path"] == PATH
            assert job["static_configs"][0]["targets"] == [
                f"{DEFAULTS['metrics']['listen_host']}:{DEFAULTS['metrics']['listen_port']}"]
        finally:
            assert stop_server(proc) == 0, log.read_text()
        with pytest.raises(OSError):  # stopped with the service
            socket.create_connection(("127.0.0.1", metrics_port), timeout=2).close()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _drift_from_another_process(config: Path, http, admin: dict, state: Path) -> None:
    status, _, body = http.call("POST", "/v1/auth/token", {"api_key": admin["api_key"],
                                                           "api_secret": admin["api_secret"]})
    assert status == 200, body
    headers = {"X-Auth-Token": body["data"]["token"], "X-Auth-Cloudauth-Id": admin["userid"]}
    agent_ok(config, "account", "enable", "admin@example.org", "--username", "metricsadm")
    status, _, body = http.call("POST", "/v1/storage-volume", {"volume-size": 1, "volume-type": {
        "visibility": "cluster"}}, headers=headers)
    assert status == 201, body
    shutil.rmtree(state / "sandbox" / "home" / "metricsadm")
    done = subprocess.run([str(AGENT), "--config", str(config), "--json", "reconcile"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and '"home-missing"' in done.stdout, done.stdout + done.stderr


def test_a_scrape_answers_while_local_users_hold_idle_and_half_sent_connections(service):
    """Any local user can connect to the metrics address: sockets held open idle, or with a
    request trickling in, never keep a scrape out (the oldest such are closed for it)."""
    ctx = service["ctx"]
    server = MetricsServer(ctx, host="127.0.0.1", port=0).start()
    held = []
    try:
        host, port = server.address
        for n in range(200):
            s = socket.create_connection((host, port), timeout=5)
            if n % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(s)
        time.sleep(0.5)  # all of them accepted or waiting in the backlog
        # And one who keeps opening more while the scrapes run.
        stop = threading.Event()

        def keep_opening():
            while not stop.is_set():
                try:
                    held.append(socket.create_connection((host, port), timeout=5))
                except OSError:
                    time.sleep(0.01)

        opener = threading.Thread(target=keep_opening)
        opener.start()
        try:
            for _ in range(5):
                started = time.monotonic()
                status, text = _get(f"http://{host}:{port}{PATH}")
                assert status == 200 and value(parse(text), "database_bytes", file="db") > 0
                assert time.monotonic() - started < 3, time.monotonic() - started
        finally:
            stop.set()
            opener.join(10)
    finally:
        for s in held:
            s.close()
        server.stop()
