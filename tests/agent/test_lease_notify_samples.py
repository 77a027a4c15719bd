"""The sample [leases] notify_command hooks (etc/lease-notify-sendmail.sh and
etc/lease-notify-webhook.sh, docs/leases.md) run as the controller runs them: one lease
event as JSON on stdin, exit 0 for delivered. The mail goes to a fake sendmail that keeps
what it was given; the post to a small HTTP server on the loopback address."""

import configparser
import json
import os
import socket
import stat
import subprocess
import threading
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAIL = ROOT / "etc" / "lease-notify-sendmail.sh"
WEBHOOK = ROOT / "etc" / "lease-notify-webhook.sh"
END = "2026-12-03T10:00:00Z"
ID = "3f0c2a9e-1b7d-4c55-9a0e-6d2f1e8b7c40"


def event(kind: str = "warning", **changed) -> dict:
    """A lease event as the controller hands it over (controller/instances/leases.py)."""
    document = {"event": kind, "instance": {"id": ID, "hostname": "vm-1a2b3c4d"},
                "owner": {"email": "alice@example.org", "username": "alice"},
                "expires-at": END, "renew": "cloud server renew vm-1a2b3c4d"}
    document.update(changed)
    return document


def run(script: Path, stdin: bytes | dict, **env: str) -> subprocess.CompletedProcess:
    data = json.dumps(stdin).encode() if isinstance(stdin, dict) else stdin
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEASE_")}
    return subprocess.run([str(script)], input=data, env={**clean, **env}, capture_output=True, timeout=60)


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_samples_are_executable():
    for script in (MAIL, WEBHOOK):
        assert script.stat().st_mode & 0o777 == 0o755, script.name


def test_the_sample_config_and_the_docs_show_every_leases_key():
    from controller.config import DEFAULTS

    sample = configparser.ConfigParser(interpolation=None)
    sample.read(ROOT / "etc" / "controller.ini.sample")
    assert dict(sample["leases"]) == DEFAULTS["leases"]
    readme, page = (ROOT / "README.md").read_text(), (ROOT / "docs" / "leases.md").read_text()
    for key in DEFAULTS["leases"]:
        assert f"`{key}`" in readme and f"`{key}`" in page, key
    sample_text = (ROOT / "etc" / "controller.ini.sample").read_text()
    for script in (MAIL, WEBHOOK):
        assert f"etc/{script.name}" in page and f"etc/{script.name}" in sample_text, script.name


# -- lease-notify-sendmail.sh ------------------------------------------------------------------
@pytest.fixture
def sendmail(tmp_path):
    """A fake sendmail: its arguments to `args`, its stdin to `mail`, its exit code from `code`."""
    fake = tmp_path / "sendmail"
    fake.write_text('#!/bin/sh\nd=$(dirname "$0")\nprintf \'%s\\n\' "$@" > "$d/args"\ncat > "$d/mail"\n'
                    'exit "$(cat "$d/code" 2>/dev/null || echo 0)"\n')
    fake.chmod(0o755)
    return fake


def mail_of(sendmail: Path):
    return BytesParser(policy=policy.default).parsebytes((sendmail.parent / "mail").read_bytes())


def body_lines(message) -> list[str]:
    return message.get_content().splitlines()


@pytest.mark.parametrize("kind, subject", [
    ("warning", f"Your instance vm-1a2b3c4d ends at {END}"),
    ("expired", "Your instance vm-1a2b3c4d was powered off: its lease ended"),
    ("deleted", "Your instance vm-1a2b3c4d was deleted"),
])
def test_the_mail_tells_the_owner(sendmail, kind, subject):
    done = run(MAIL, event(kind), LEASE_MAIL_SENDMAIL=str(sendmail), LEASE_MAIL_FROM="hpc-cloud@example.org")
    assert done.returncode == 0, done.stderr
    assert (sendmail.parent / "args").read_text().split("\n")[:-1] == ["-t", "-i", "-f", "hpc-cloud@example.org"]
    message = mail_of(sendmail)
    assert message["To"] == "alice@example.org"
    assert message["From"] == "hpc-cloud@example.org"
    assert message["Subject"] == subject
    assert message["Auto-Submitted"] == "auto-generated"
    lines = body_lines(message)
    assert lines[0] == "Hello alice,"
    text = " ".join(lines)
    assert f"vm-1a2b3c4d (id {ID})" in text and END in text
    if kind == "deleted":
        assert "Your files in $HOME on the cluster are kept" in text
        assert "    cloud server renew vm-1a2b3c4d" not in lines
    else:
        assert "    cloud server renew vm-1a2b3c4d" in lines  # whole, to be copied
    if kind == "expired":
        assert "    cloud server start vm-1a2b3c4d" in lines
    assert all(len(line) <= 76 for line in lines)


def test_the_mail_comes_from_this_host_by_default(sendmail):
    done = run(MAIL, event(), LEASE_MAIL_SENDMAIL=str(sendmail))
    assert done.returncode == 0, done.stderr
    assert mail_of(sendmail)["From"] == f"cloud-controller@{socket.gethostname()}"


def test_an_instance_without_a_hostname_is_named_by_its_id(sendmail):
    done = run(MAIL, event(instance={"id": ID, "hostname": None}, renew=f"cloud server renew {ID}"),
               LEASE_MAIL_SENDMAIL=str(sendmail))
    assert done.returncode == 0, done.stderr
    assert mail_of(sendmail)["Subject"] == f"Your instance {ID} ends at {END}"


@pytest.mark.parametrize("stdin", [
    b"{not json",
    b"",
    {"event": "warning"},
    event(owner={"email": "alice@example.org\nBcc: all@example.org", "username": "alice"}),
    event(owner={"email": "alice@example.org, bob@example.org", "username": "alice"}),
    event(instance={"id": ID, "hostname": "vm-1\nBcc: all@example.org"}),
    event(**{"expires-at": 5}),
    event("renewed"),
], ids=["malformed", "empty", "incomplete", "header-injection", "two-addresses", "newline-in-name",
        "not-a-string", "unknown-event"])
def test_the_mail_refuses_what_is_not_a_lease_event(sendmail, stdin):
    done = run(MAIL, stdin, LEASE_MAIL_SENDMAIL=str(sendmail))
    assert done.returncode != 0
    assert b"cloud-lease-mail:" in done.stderr
    assert not (sendmail.parent / "mail").exists()


def test_a_failed_sendmail_is_a_failure_to_retry(sendmail):
    (sendmail.parent / "code").write_text("75\n")
    done = run(MAIL, event(), LEASE_MAIL_SENDMAIL=str(sendmail))
    assert done.returncode != 0 and b"exited with 75" in done.stderr
    done = run(MAIL, event(), LEASE_MAIL_SENDMAIL=str(sendmail.parent / "missing"))
    assert done.returncode != 0 and b"cannot run" in done.stderr


def test_an_owner_without_an_email_is_not_retried(sendmail):
    done = run(MAIL, event(owner={"email": None, "username": None}), LEASE_MAIL_SENDMAIL=str(sendmail))
    assert done.returncode == 0
    assert not (sendmail.parent / "mail").exists()


@pytest.mark.real_commands
def test_the_mail_runs_as_the_controller_runs_its_hook(sendmail, monkeypatch):
    from common.errors import CommandError
    from host_adapters import subp

    monkeypatch.setenv("LEASE_MAIL_SENDMAIL", str(sendmail))
    subp.run_hook([str(MAIL)], input=json.dumps(event("expired")).encode(), timeout=30)
    assert mail_of(sendmail)["To"] == "alice@example.org"
    with pytest.raises(CommandError) as failed:
        subp.run_hook([str(MAIL)], input=b"[]", timeout=30)
    assert "not a lease event" in failed.value.stderr


# -- lease-notify-webhook.sh -------------------------------------------------------------------
class Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length", 0))
        self.server.received.append({"path": self.path, "headers": self.headers,
                                     "body": self.rfile.read(length)})
        self.send_response(self.server.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.received, server.status = [], 200
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def files(tmp_path, hook):
    """The URL and header files as the sample's comment installs them (mode 0600)."""
    url = private_file(tmp_path / "lease-webhook.url", f"http://127.0.0.1:{hook.server_port}/hooks/abc\n")
    headers = private_file(tmp_path / "lease-webhook.headers", "Authorization: Bearer s3cret-token\nX-Site: hpc1\n")
    return {"LEASE_WEBHOOK_URL_FILE": str(url), "LEASE_WEBHOOK_HEADER_FILE": str(headers)}


def test_the_webhook_posts_the_event_with_the_token_from_the_file(hook, files):
    done = run(WEBHOOK, event("expired"), **files)
    assert done.returncode == 0, done.stderr
    [got] = hook.received
    assert got["path"] == "/hooks/abc"
    assert json.loads(got["body"]) == event("expired")
    assert got["headers"]["Content-Type"] == "application/json"
    assert got["headers"]["Authorization"] == "Bearer s3cret-token"
    assert got["headers"]["X-Site"] == "hpc1"


def test_the_webhook_can_post_a_chat_message(hook, files):
    done = run(WEBHOOK, event("warning"), LEASE_WEBHOOK_FORMAT="text", **files)
    assert done.returncode == 0, done.stderr
    [got] = hook.received
    assert json.loads(got["body"]) == {"text": (
        f"Lease warning: instance vm-1a2b3c4d ({ID}) of alice <alice@example.org> ends at {END}: "
        "`cloud server renew vm-1a2b3c4d` keeps it")}
    done = run(WEBHOOK, event("deleted"), LEASE_WEBHOOK_FORMAT="text", **files)
    assert done.returncode == 0, done.stderr
    assert "the owner's home is kept" in json.loads(hook.received[1]["body"])["text"]


def test_the_webhook_url_may_come_from_the_environment_and_the_token_file_is_optional(hook, tmp_path):
    done = run(WEBHOOK, event(), LEASE_WEBHOOK_URL=f"http://127.0.0.1:{hook.server_port}/x",
               LEASE_WEBHOOK_URL_FILE=str(tmp_path / "none"), LEASE_WEBHOOK_HEADER_FILE=str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    [got] = hook.received
    assert got["path"] == "/x" and "Authorization" not in got["headers"]


def test_a_refused_post_is_a_failure_to_retry(hook, files):
    hook.status = 500
    done = run(WEBHOOK, event(), **files)
    assert done.returncode != 0
    assert len(hook.received) == 1


def test_a_webhook_that_does_not_answer_is_a_failure_to_retry(files, tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    private_file(Path(files["LEASE_WEBHOOK_URL_FILE"]), f"http://127.0.0.1:{port}/hooks/abc\n")
    done = run(WEBHOOK, event(), **files)
    assert done.returncode != 0 and done.stderr


@pytest.mark.parametrize("stdin", [b"{not json", b"", {"event": "warning"}, event("renewed"),
                                   event(instance={"id": ID, "hostname": "vm\u001b[2J"})],
                         ids=["malformed", "empty", "incomplete", "unknown-event", "control-character"])
def test_the_webhook_refuses_what_is_not_a_lease_event(hook, files, stdin):
    done = run(WEBHOOK, stdin, **files)
    assert done.returncode != 0 and b"cloud-lease-webhook:" in done.stderr
    assert hook.received == []


@pytest.mark.parametrize("which", ["LEASE_WEBHOOK_URL_FILE", "LEASE_WEBHOOK_HEADER_FILE"])
def test_the_webhook_refuses_a_secret_file_others_can_read(hook, files, which):
    Path(files[which]).chmod(0o644)
    done = run(WEBHOOK, event(), **files)
    assert done.returncode != 0 and b"chmod 600" in done.stderr
    assert hook.received == []


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", 'http://127.0.0.1/a"b', "http://127.0.0.1/a b", ""])
def test_the_webhook_refuses_a_url_it_cannot_pass_safely(hook, files, url):
    private_file(Path(files["LEASE_WEBHOOK_URL_FILE"]), url + "\n")
    done = run(WEBHOOK, event(), **files)
    assert done.returncode != 0 and b"cloud-lease-webhook:" in done.stderr
    assert hook.received == []


def test_the_webhook_puts_no_secret_on_a_command_line(hook, files, tmp_path):
    """curl's arguments (what `ps` shows every local user) hold neither the URL nor the token:
    a curl in front of the real one on PATH records them."""
    real = subprocess.run(["sh", "-c", "command -v curl"], capture_output=True, text=True, check=True).stdout.strip()
    spy = tmp_path / "bin" / "curl"
    spy.parent.mkdir()
    spy.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$@" > "{tmp_path}/curl-args"\nexec {real} "$@"\n')
    spy.chmod(stat.S_IRWXU)
    done = run(WEBHOOK, event(), PATH=f"{spy.parent}:{os.environ['PATH']}", **files)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "curl-args").read_text()
    assert "--config" in args and "hooks/abc" not in args and "s3cret-token" not in args
    assert len(hook.received) == 1
