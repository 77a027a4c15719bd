#!/bin/sh
# Sample [leases] notify_command: posts each lease event (a warning before an
# instance's end, its power-off at the end, its delete [leases] keep later) to a
# web hook: a ticketing system, or a chat channel's incoming webhook. See
# docs/leases.md.
#
#   install -o root -m 0755 lease-notify-webhook.sh /usr/local/sbin/cloud-lease-webhook
#   install -o root -m 0600 /dev/null /etc/cloud-controller/lease-webhook.url
#   echo 'https://chat.example.org/hooks/XXXX' > /etc/cloud-controller/lease-webhook.url
#   # only if the hook wants a token: header lines, one per line
#   install -o root -m 0600 /dev/null /etc/cloud-controller/lease-webhook.headers
#   echo 'Authorization: Bearer TOKEN' > /etc/cloud-controller/lease-webhook.headers
#   [leases] notify_command = /usr/local/sbin/cloud-lease-webhook
#
# The controller runs it as root with one JSON object on stdin per event:
#   {"event": "warning" | "expired" | "deleted", "instance": {"id", "hostname"},
#    "owner": {"email", "username"}, "expires-at": "RFC 3339",
#    "renew": "cloud server renew NAME"}
# Exit 0 means delivered (the hook answered 2xx); any other exit is logged and
# the event tried again at the next sweep, for 24 hours. Only python3 reads the
# JSON. Neither the URL, the headers nor the body is put on curl's command
# line (which every local user can read with ps): curl reads the URL from its
# --config on stdin, the headers with -H @FILE and the body from a file.
# Needs curl 7.55 or newer.
#
# Environment (optional; defaults are best changed in the copy, as both
# `cloud-agent serve` and `cloud-agent reconcile --fix` run the hook):
#   LEASE_WEBHOOK_URL          the URL (default: the first line of the URL file)
#   LEASE_WEBHOOK_URL_FILE     default /etc/cloud-controller/lease-webhook.url
#   LEASE_WEBHOOK_HEADER_FILE  default /etc/cloud-controller/lease-webhook.headers;
#                              sent when it exists
#   LEASE_WEBHOOK_FORMAT       json: the event as received (default); text:
#                              {"text": "..."}, for a chat's incoming webhook
#   LEASE_WEBHOOK_MAX_TIME     seconds the post may take (default 20; keep it
#                              below [leases] notify_timeout_seconds)
# The two files must be owned by the user running the hook (root) and readable
# by nobody else (mode 0600 or 0400): they hold secrets.
set -eu

URL=${LEASE_WEBHOOK_URL:-}
URL_FILE=${LEASE_WEBHOOK_URL_FILE:-/etc/cloud-controller/lease-webhook.url}
HEADER_FILE=${LEASE_WEBHOOK_HEADER_FILE:-/etc/cloud-controller/lease-webhook.headers}
FORMAT=${LEASE_WEBHOOK_FORMAT:-json}
MAX_TIME=${LEASE_WEBHOOK_MAX_TIME:-20}

me=cloud-lease-webhook
die() { printf '%s: %s\n' "$me" "$*" >&2; exit 2; }

# private FILE: a regular file of ours that nobody else may read or change.
private() {
    [ -f "$1" ] || die "$1 is missing"
    [ -O "$1" ] || die "$1 must be owned by the user running $me"
    case $(stat -c %a "$1") in
        [46]00) ;;
        *) die "$1 must be readable by its owner only (chmod 600 $1)" ;;
    esac
}

case $FORMAT in json | text) ;; *) die "LEASE_WEBHOOK_FORMAT must be json or text" ;; esac
case $MAX_TIME in '' | 0* | *[!0-9]*) die "LEASE_WEBHOOK_MAX_TIME must be a number of seconds above 0" ;; esac
if [ -z "$URL" ]; then
    private "$URL_FILE"
    IFS= read -r URL <"$URL_FILE" || [ -n "$URL" ] || die "$URL_FILE is empty"
fi
case $URL in
    https://?* | http://?*) ;;
    *) die "the URL must start with https:// (or http://)" ;;
esac
# Quoted in curl's config below: no quote, backslash, blank or control character.
case $URL in
    *[\"\\[:space:][:cntrl:]]*) die "the URL has a character it may not have unencoded" ;;
esac
set --
if [ -e "$HEADER_FILE" ]; then
    private "$HEADER_FILE"
    set -- -H "@$HEADER_FILE"
fi

body=$(mktemp)
trap 'rm -f "$body"' EXIT
trap 'exit 2' HUP INT TERM

PROGRAM=$(cat <<'EOF'
import json, sys


def fail(why):
    print(f"cloud-lease-webhook: {why}", file=sys.stderr)
    sys.exit(2)


def text(value, what):
    if not isinstance(value, str) or not value or len(value) > 255 or any(
            ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        fail(f"{what} is not a printable string")
    return value


try:
    event = json.loads(sys.stdin.buffer.read(65536))
    kind, instance, owner = event["event"], event["instance"], event["owner"]
    ident = text(instance["id"], "instance.id")
    name = text(instance.get("hostname") or ident, "instance.hostname")
    end = text(event["expires-at"], "expires-at")
    renew = text(event["renew"], "renew")
    user, email = owner.get("username"), owner.get("email")
    who = " ".join([text(user, "owner.username")] * (user is not None)
                   + [f"<{text(email, 'owner.email')}>"] * (email is not None))
except (ValueError, KeyError, TypeError, AttributeError) as e:
    fail(f"stdin is not a lease event ({type(e).__name__}: {e})")
said = {"warning": f"ends at {end}: `{renew}` keeps it",
        "expired": f"was powered off: its lease ended at {end}; `{renew}` lets it start again",
        "deleted": f"was deleted: its lease ended at {end} (the owner's home is kept)"}
if kind not in said:
    fail(f"unknown event {kind!r}")
if sys.argv[1] == "text":
    event = {"text": f"Lease {kind}: instance {name} ({ident}) of {who or 'a deleted user'} {said[kind]}"}
json.dump(event, sys.stdout, sort_keys=True)
EOF
)

python3 -c "$PROGRAM" "$FORMAT" >"$body"
printf 'url = "%s"\n' "$URL" |
    curl --config - "$@" --silent --show-error --fail --max-time "$MAX_TIME" \
        --proto =https,http --max-redirs 0 -H 'Content-Type: application/json' \
        --data-binary "@$body" --output /dev/null
