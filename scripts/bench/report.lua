-- The result line every wrk script of the benchmark prints (loaded with dofile): one JSON
-- line for scripts/bench/run.py, latency in microseconds, non-2xx and socket error counts.
done = function(summary, latency, requests)
  io.write(string.format(
    'BENCH-RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "non_2xx": %d, "socket_errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
