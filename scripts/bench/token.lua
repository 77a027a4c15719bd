-- wrk script: token issue from an API key (POST /v1/auth/token), credentials from the
-- environment (BENCH_API_KEY, BENCH_API_SECRET).
wrk.method = "POST"
wrk.path = "/v1/auth/token"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format('{"api_key": "%s", "api_secret": "%s"}', os.getenv("BENCH_API_KEY"), os.getenv("BENCH_API_SECRET"))

dofile(os.getenv("BENCH_DIR") .. "/report.lua")  -- done(): the result line
