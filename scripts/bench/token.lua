-- wrk script: token issue from an API key (POST /v1/auth/token), credentials from the
-- environment (BENCH_API_KEY, BENCH_API_SECRET).
wrk.method = "POST"
wrk.path = "/v1/auth/token"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format('{"api_key": "%s", "api_secret": "%s"}', os.getenv("BENCH_API_KEY"), os.getenv("BENCH_API_SECRET"))

done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH-RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "non_2xx": %d, "socket_errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
