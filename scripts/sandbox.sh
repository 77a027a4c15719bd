#!/usr/bin/env bash
# Sets up and runs the cloud controller on the sandbox profile: SQLite, the
# libvirt test driver, homes and a scratch system root, all under ./state
# (or $STATE_DIR). Prints the admin credentials it made, then serves on
# 127.0.0.1:8080 (or $PORT) until Ctrl-C, the cloud portal at /portal/ too.
#
# Installs only what the sandbox uses (setup-host.sh --sandbox). Guests do not boot
# here: libvirt's test driver records domains and runs nothing. Reset: stop it and
# remove $STATE_DIR. Metrics: `cloud-agent serve --metrics-port N` (not started here).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh --sandbox

STATE=${STATE_DIR:-./state}
PORT=${PORT:-8080}
CONFIG=$STATE/controller.ini
AGENT=.venv/bin/cloud-agent
export CLOUD_CONTROLLER_CONFIG=$CONFIG

if [ ! -f "$CONFIG" ]; then
  "$AGENT" --config "$CONFIG" init --sandbox "$STATE" >/dev/null
fi
"$AGENT" --config "$CONFIG" init >/dev/null   # migrate an older sandbox database

ADMIN=$STATE/admin.json
if [ ! -f "$ADMIN" ]; then
  password=$(.venv/bin/python -c 'import secrets; print("Sbx-" + secrets.token_hex(8) + "-42")')
  umask 077
  # The password travels on stdin and in the environment, never in argv (visible in ps).
  printf '%s\n' "$password" | "$AGENT" --config "$CONFIG" --json user create-superuser \
    --email admin@example.org --password-file - > "$ADMIN.tmp"
  SANDBOX_PASSWORD=$password .venv/bin/python - "$ADMIN.tmp" <<'PY'
import json, os, sys
path, password = sys.argv[1], os.environ["SANDBOX_PASSWORD"]
doc = json.load(open(path))
doc.update(email="admin@example.org", password=password)
json.dump(doc, open(path, "w"), indent=2)
PY
  mv "$ADMIN.tmp" "$ADMIN"
fi

.venv/bin/python - "$ADMIN" "$PORT" "$CONFIG" <<'PY'
import json, os, shlex, sys
a = json.load(open(sys.argv[1]))
print("Sandbox admin (kept in %s):" % sys.argv[1])
print("  email:      %s" % a["email"])
print("  password:   %s" % a["password"])
print("  userid:     %s" % a["userid"])
print("  api_key:    %s" % a["api_key"])
print("  api_secret: %s" % a["api_secret"])
print()
print("Cloud portal (log in with an email and password, such as the admin's above):")
print("  http://127.0.0.1:%s/portal/" % sys.argv[2])
print("  (open it at 127.0.0.1 or localhost, through an ssh tunnel from another machine:")
print("  over plain HTTP at any other name a browser does not keep the session; a site serves it over HTTPS)")
print()
print("For the README walk-through, in another shell:")
# The config's absolute path: the walk-through's cloud-agent commands and paths follow it
# whatever STATE_DIR was, from any folder.
print("  export CC=http://127.0.0.1:%s CC_USERID=%s CC_API_KEY=%s CC_API_SECRET=%s CLOUD_CONTROLLER_CONFIG=%s" % (
    sys.argv[2], a["userid"], a["api_key"], a["api_secret"], shlex.quote(os.path.abspath(sys.argv[3]))))
print(flush=True)
PY

exec "$AGENT" --config "$CONFIG" serve --host 127.0.0.1 --port "$PORT"
