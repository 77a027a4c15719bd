-- wrk script: every request carries the auth headers of one user, from the environment
-- (BENCH_TOKEN, BENCH_USERID); BENCH_PATH is the path to GET. Prints the result line of
-- report.lua for scripts/bench/run.py.
wrk.method = "GET"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["X-Auth-Token"] = os.getenv("BENCH_TOKEN") or ""
wrk.headers["X-Auth-Cloudauth-Id"] = os.getenv("BENCH_USERID") or ""

dofile(os.getenv("BENCH_DIR") .. "/report.lua")  -- done(): the result line
