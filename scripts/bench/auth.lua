-- wrk script: every request carries the auth headers of one user, from the environment
-- (BENCH_TOKEN, BENCH_USERID); BENCH_PATH is the path to GET. Prints one JSON line of
-- results (latency in microseconds, non-2xx count) for scripts/bench/run.py.
wrk.method = "GET"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["X-Auth-Token"] = os.getenv("BENCH_TOKEN") or ""
wrk.headers["X-Auth-Cloudauth-Id"] = os.getenv("BENCH_USERID") or ""

done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH-RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "non_2xx": %d, "socket_errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
