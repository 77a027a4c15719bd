#!/bin/sh
# Sample [leases] notify_command: mails an instance's owner about its lease (the
# warnings before its end, the power-off at its end, the delete [leases] keep
# later), with the `cloud` line that renews it. See docs/leases.md.
#
#   install -o root -m 0755 lease-notify-sendmail.sh /usr/local/sbin/cloud-lease-mail
#   (in the copy, set the From: address on the FROM= line below)
#   [leases] notify_command = /usr/local/sbin/cloud-lease-mail
#
# The controller runs it as root with one JSON object on stdin per event:
#   {"event": "warning" | "expired" | "deleted", "instance": {"id", "hostname"},
#    "owner": {"email", "username"}, "expires-at": "RFC 3339",
#    "renew": "cloud server renew NAME"}
# Exit 0 means delivered (handed to sendmail); any other exit is logged and the
# event tried again at the next sweep, for 24 hours. Only python3 reads the
# JSON: no value of it reaches a shell or a command line. The mail goes to
# `sendmail -t -i`, which takes the recipient from the To: header.
#
# Environment (optional). Both `cloud-agent serve` and `cloud-agent reconcile
# --fix` run the hook: a value set in one unit's environment only is missed by
# the other, so a site's lasting choice is best written into the copy.
#   LEASE_MAIL_SENDMAIL  the sendmail program (default /usr/sbin/sendmail)
#   LEASE_MAIL_FROM      the From: and envelope sender (default cloud-controller@HOST)
set -eu

SENDMAIL=${LEASE_MAIL_SENDMAIL:-/usr/sbin/sendmail}
FROM=${LEASE_MAIL_FROM:-}   # e.g. ${LEASE_MAIL_FROM:-hpc-cloud@example.org}

PROGRAM=$(cat <<'EOF'
import json, re, socket, subprocess, sys, textwrap
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

ME = "cloud-lease-mail"
SENDMAIL, FROM = sys.argv[1:3]
ADDRESS = re.compile(r"[^@\s\"(),:;<>\[\]\\]+@[A-Za-z0-9.-]+")


def fail(why):
    print(f"{ME}: {why}", file=sys.stderr)
    sys.exit(2)


def text(value, what):
    """A printable one-line string of the event (nothing of it is trusted further)."""
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
    to, user = owner.get("email"), owner.get("username")
except (ValueError, KeyError, TypeError, AttributeError) as e:
    fail(f"stdin is not a lease event ({type(e).__name__}: {e})")

if to is None:  # the owner is gone: nobody to tell, and trying again will not help
    print(f"{ME}: the owner of {name} has no email; nothing sent", file=sys.stderr)
    sys.exit(0)
if not ADDRESS.fullmatch(text(to, "owner.email")):
    fail("owner.email is not a plain address")
sender = FROM or f"cloud-controller@{socket.gethostname()}"
if not ADDRESS.fullmatch(sender):
    fail(f"LEASE_MAIL_FROM is not a plain address: {sender!r}")
head = socket.gethostname()
hello = f"Hello {text(user, 'owner.username')}," if user else "Hello,"
what = f"your server-instance {name} (id {ident}) on {head}"

if kind == "warning":
    subject = f"Your instance {name} ends at {end}"
    body = [f"The lease of {what} ends at {end} (UTC). Then it is powered off, and "
            "later deleted, unless you renew it:", f"    {renew}",
            "If you no longer need it, there is nothing to do."]
elif kind == "expired":
    subject = f"Your instance {name} was powered off: its lease ended"
    body = [f"The lease of {what} ended at {end} (UTC): it has been powered off. It will be "
            "deleted after a grace period. To keep it, renew it and start it again:",
            f"    {renew}\n    cloud server start {name}"]
elif kind == "deleted":
    subject = f"Your instance {name} was deleted"
    body = [f"The lease of {what} ended at {end} (UTC) and was not renewed: the instance "
            "and its own disk have been deleted.",
            "Your files in $HOME on the cluster are kept: the delete does not touch your "
            "home volume. `cloud server create` makes a new instance."]
else:
    fail(f"unknown event {kind!r}")
# Paragraphs wrapped; the indented command lines kept whole, to be copied.
lines = [hello] + [p if p.startswith(" ") else textwrap.fill(p, 72, break_on_hyphens=False) for p in body]

mail = EmailMessage()  # refuses a header value with a line break
mail["From"] = sender
mail["To"] = to
mail["Subject"] = subject
mail["Date"] = formatdate(localtime=True)
mail["Message-ID"] = make_msgid(domain=sender.split("@", 1)[1])
mail["Auto-Submitted"] = "auto-generated"
mail.set_content("\n\n".join(lines) + "\n", cte="8bit")
try:
    done = subprocess.run([SENDMAIL, "-t", "-i", "-f", sender], input=bytes(mail),
                          stdout=subprocess.DEVNULL, check=False)
except OSError as e:
    fail(f"cannot run {SENDMAIL}: {e}")
if done.returncode != 0:
    fail(f"{SENDMAIL} exited with {done.returncode}")
EOF
)

exec python3 -c "$PROGRAM" "$SENDMAIL" "$FROM"
