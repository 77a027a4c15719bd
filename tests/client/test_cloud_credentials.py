"""`cloud whoami`, `cloud credentials show|rotate`, `cloud password`, `cloud login --keep` and the
client distribution installed alone, against a real `cloud-agent serve` (the sandbox profile).

Each test has its own users (made through the API by the superuser) and its own config folder.
"""

import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.fixtures.agent import agent_ok as agent
from tests.fixtures.cloud import CLOUD, Cloud
from tests.fixtures.server import free_port, sandbox_with_admin, served

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

PASSWORD = "Alice-pass-2026"
NEW_PASSWORD = "Second-pass-2027"
ROOT = Path(__file__).resolve().parents[2]
_numbers = itertools.count()


class Service:
    def __init__(self, base: str, config: Path, admin: dict):
        self.base, self.config, self.admin = base, config, admin

    def token(self, **creds) -> requests.Response:
        return requests.post(self.base + "/v1/auth/token", json=creds, timeout=30)

    def admin_headers(self) -> dict:
        r = self.token(api_key=self.admin["api_key"], api_secret=self.admin["api_secret"])
        assert r.status_code == 200, r.text
        return {"X-Auth-Token": r.json()["data"]["token"], "X-Auth-Cloudauth-Id": self.admin["userid"]}

    def new_user(self, *, account: bool = True) -> dict:
        n = next(_numbers)
        email = f"user{n}@example.org"
        h = self.admin_headers()
        r = requests.post(self.base + "/v1/user/create", headers=h, json={"email": email, "password": PASSWORD},
                          timeout=30)
        assert r.status_code == 200, r.text
        userid = r.json()["data"]["userid"]
        user = requests.get(self.base + f"/v1/user/view/{userid}", headers=h, timeout=30).json()["data"]["user"]
        secret = requests.get(self.base + f"/v1/user/view_api_secret/{userid}", headers=h,
                              timeout=30).json()["data"]["api_secret"]
        if account:
            agent(self.config, "account", "enable", email, "--username", f"user{n}")
        return {"email": email, "id": userid, "api_key": user["api_key"], "api_secret": secret,
                "username": f"user{n}" if account else None}


@pytest.fixture(scope="module")
def svc():
    state, config, admin = sandbox_with_admin("cloud-creds-", PASSWORD)
    try:
        with served(config, state / "serve.log") as http:
            yield Service(http.base, config, admin)
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=False)


@pytest.fixture
def cloud(tmp_path):
    return Cloud(tmp_path / "person")


def kept(cloud: Cloud) -> dict:
    return json.loads(cloud.file.read_text())


def test_whoami_says_who_where_how_and_until_when(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--email", u["email"], stdin=PASSWORD + "\n")
    doc = cloud.ok("whoami", "--json")
    assert doc == {"url": svc.base, "userid": u["id"], "email": u["email"], "username": u["username"],
                   "source": "kept:password", "expires_at": kept(cloud)["expires_at"]}
    text = cloud.ok("whoami")
    assert u["email"] in text and "kept:password" in text
    # Credentials from the environment win, and the kept login they override is named once.
    other = svc.new_user(account=False)
    proc = cloud.run("whoami", "--json", env={"CC_API_KEY": other["api_key"], "CC_API_SECRET": other["api_secret"]})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["userid"], doc["email"], doc["username"], doc["source"]) == (other["id"], other["email"], None,
                                                                           "env:api_key")
    assert proc.stderr.count("note:") == 1 and "CC_API_KEY and CC_API_SECRET" in proc.stderr
    assert u["email"] in proc.stderr


def test_credentials_show_names_the_key_and_never_the_secret(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--api-key", u["api_key"], "--keep", stdin=u["api_secret"] + "\n")
    doc = cloud.ok("credentials", "show", "--json")
    assert doc == {"userid": u["id"], "api_key": u["api_key"], "api_secret_set": True}
    text = cloud.ok("credentials", "show")
    assert f"cloud login --url {svc.base} --api-key {u['api_key']} --keep" in text
    assert u["api_secret"] not in text


def test_rotate_prints_the_new_secret_once_and_updates_the_kept_login(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--api-key", u["api_key"], "--keep", stdin=u["api_secret"] + "\n")
    doc = cloud.ok("credentials", "rotate", "--json", stdin=PASSWORD + "\n")
    assert doc["api_key"] == u["api_key"] and doc["api_secret"] != u["api_secret"]
    assert svc.token(api_key=u["api_key"], api_secret=u["api_secret"]).status_code == 401
    assert svc.token(api_key=u["api_key"], api_secret=doc["api_secret"]).status_code == 200
    assert kept(cloud)["api_secret"] == doc["api_secret"]
    # The kept login goes on working without a new `cloud login`: its token was renewed.
    assert cloud.ok("image", "list", "--json") == []
    # Proven with the kept secret this time; the text form says it is shown once.
    text = cloud.ok("credentials", "rotate", "--with-secret")
    assert "shown this once" in text and kept(cloud)["api_secret"] in text
    assert doc["api_secret"] not in text
    assert cloud.ok("whoami", "--json")["userid"] == u["id"]


def test_a_wrong_password_rotates_nothing(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--api-key", u["api_key"], "--keep", stdin=u["api_secret"] + "\n")
    before = cloud.file.read_bytes()
    assert cloud.error("credentials", "rotate", stdin="Not-the-pass-1\n") == "wrong password or API secret"
    assert cloud.file.read_bytes() == before
    assert svc.token(api_key=u["api_key"], api_secret=u["api_secret"]).status_code == 200


def test_password_changes_it_and_keeps_the_password_login_working(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--email", u["email"], stdin=PASSWORD + "\n")
    proc = cloud.run("password", stdin=f"{PASSWORD}\n{NEW_PASSWORD}\n")
    assert proc.returncode == 0, proc.stderr
    assert "14 to 24 characters" in proc.stderr  # the rule, told before asking
    assert svc.token(email=u["email"], password=PASSWORD).status_code == 401
    assert svc.token(email=u["email"], password=NEW_PASSWORD).status_code == 200
    assert NEW_PASSWORD not in cloud.file.read_text() and PASSWORD not in cloud.file.read_text()
    # The old password-issued token died; the command took a new one and kept it.
    assert kept(cloud)["source"] == "password"
    assert cloud.ok("whoami", "--json")["userid"] == u["id"]
    # A new password against the rule is refused with the rule; nothing changes.
    message = cloud.error("password", stdin=f"{NEW_PASSWORD}\nshort\n", progress="A password has")
    assert "14 to 24" in message
    assert svc.token(email=u["email"], password=NEW_PASSWORD).status_code == 200


def test_login_with_email_and_keep_refuses_and_leaves_the_secret_alone(svc, cloud):
    u = svc.new_user()
    proc = cloud.run("login", "--url", svc.base, "--email", u["email"], "--keep", stdin=PASSWORD + "\n")
    assert proc.returncode == 2 and proc.stdout == ""
    message = proc.stderr.strip()
    assert message.startswith("error: --keep keeps an API key and secret, never a password.")
    assert "cloud login --api-key KEY --keep" in message and "--new-secret" in message
    assert not cloud.file.exists()
    # The user's secret is the one it was: it still logs in, and the service still shows it.
    r = svc.token(api_key=u["api_key"], api_secret=u["api_secret"])
    assert r.status_code == 200 and r.json()["data"]["userid"] == u["id"]
    shown = requests.get(svc.base + f"/v1/user/view_api_secret/{u['id']}", headers=svc.admin_headers(), timeout=30)
    assert shown.json()["data"]["api_secret"] == u["api_secret"]
    # Refused before anything is sent: with nothing listening at the URL it says the same.
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert cloud.error("login", "--url", nowhere, "--email", u["email"], "--keep", code=2,
                       stdin=PASSWORD + "\n") == message[len("error: "):]
    # --new-secret alone, or with an API key, is a usage error too; nothing is kept.
    assert "--new-secret" in cloud.error("login", "--url", svc.base, "--email", u["email"], "--new-secret",
                                         code=2, stdin=PASSWORD + "\n")
    assert "--new-secret" in cloud.error("login", "--url", svc.base, "--api-key", u["api_key"], "--keep",
                                         "--new-secret", code=2, stdin=u["api_secret"] + "\n")
    assert not cloud.file.exists()
    assert svc.token(api_key=u["api_key"], api_secret=u["api_secret"]).status_code == 200


def test_login_with_email_keep_and_new_secret_keeps_a_new_secret_never_the_password(svc, cloud):
    u = svc.new_user()
    proc = cloud.run("login", "--url", svc.base, "--email", u["email"], "--keep", "--new-secret",
                     stdin=PASSWORD + "\n")
    assert proc.returncode == 0, proc.stderr
    assert "new API secret" in proc.stderr and "previous one no longer works" in proc.stderr
    k = kept(cloud)
    assert k["api_key"] == u["api_key"] and k["api_secret"] != u["api_secret"]
    assert PASSWORD not in cloud.file.read_text()
    assert (cloud.file.stat().st_mode & 0o777) == 0o600
    assert svc.token(api_key=u["api_key"], api_secret=u["api_secret"]).status_code == 401
    assert svc.token(api_key=u["api_key"], api_secret=k["api_secret"]).status_code == 200
    # An expired token is renewed from the kept key, with no password.
    cloud.file.write_text(json.dumps({**k, "expires_at": "2020-01-01T00:00:00Z"}))
    assert cloud.ok("whoami", "--json")["userid"] == u["id"]
    assert kept(cloud)["expires_at"] != "2020-01-01T00:00:00Z" and kept(cloud)["source"] == "api_key"


def test_a_login_revoked_elsewhere_says_which_login_renews_it(svc, cloud):
    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--api-key", u["api_key"], stdin=u["api_secret"] + "\n")
    # The user rotates the secret from another place: this login's key-issued token dies.
    other = Cloud(cloud.home.parent / "elsewhere")
    other.ok("login", "--url", svc.base, "--email", u["email"], stdin=PASSWORD + "\n")
    other.ok("credentials", "rotate", stdin=PASSWORD + "\n")
    message = cloud.error("image", "list")
    assert message.startswith(f"your login to {svc.base} was refused before its end at {kept(cloud)['expires_at']}")
    assert message.endswith(f"run `cloud login --url {svc.base} --api-key {u['api_key']}`")
    assert kept(cloud)["token"]  # not thrown away


def test_two_users_password_logins_from_127_0_0_1_at_the_same_moment_both_succeed(svc, tmp_path):
    users = [svc.new_user(account=False) for _ in range(2)]
    start = threading.Barrier(2)
    statuses = [None, None]

    def raw(i):
        start.wait()
        statuses[i] = svc.token(email=users[i]["email"], password=PASSWORD).status_code

    threads = [threading.Thread(target=raw, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200, 200]
    # The same through `cloud login`, two people at once.
    people = [Cloud(tmp_path / f"p{i}") for i in range(2)]
    procs = [subprocess.Popen([str(CLOUD), "login", "--json", "--url", svc.base, "--email", u["email"]],
                              env=p.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p, u in zip(people, users)]
    outs = [proc.communicate(PASSWORD + "\n", timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert [json.loads(out)["userid"] for out, _ in outs] == [u["id"] for u in users]


def test_the_client_distribution_installs_alone_and_works(svc, tmp_path):
    venv = tmp_path / "client-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(ROOT / "client")],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    python = venv / "bin" / "python"
    # Only the client's own dependencies: no libvirt, no LDAP, none of the service.
    for module in ("libvirt", "ldap", "falcon", "waitress", "argon2", "controller", "api", "host_adapters",
                   "agent.cli"):
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=60,
                               cwd=tmp_path)  # not the checkout, whose packages `python -c` would see
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (module, probe.stderr)
    probe = subprocess.run([str(python), "-c", "import common.client, agent.cloud.cli; print(common.client.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert probe.stdout.strip().startswith(str(venv)), probe.stderr
    cloud_bin = venv / "bin" / "cloud"
    home = tmp_path / "laptop"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config")}
    helped = subprocess.run([str(cloud_bin), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert helped.returncode == 0 and "whoami" in helped.stdout and "credentials" in helped.stdout
    u = svc.new_user()
    login = subprocess.run([str(cloud_bin), "login", "--url", svc.base, "--api-key", u["api_key"], "--keep"],
                           input=u["api_secret"] + "\n", capture_output=True, text=True, env=env, timeout=60)
    assert login.returncode == 0, login.stderr
    who = subprocess.run([str(cloud_bin), "whoami", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["userid"] == u["id"]


def test_password_on_a_terminal_tells_the_rule_then_asks_old_once_and_new_twice(svc, cloud):
    import pexpect

    u = svc.new_user()
    cloud.ok("login", "--url", svc.base, "--email", u["email"], stdin=PASSWORD + "\n")

    def spawn():
        return pexpect.spawn(str(CLOUD), ["password"], env=cloud.env, timeout=60, encoding="utf-8",
                             dimensions=(24, 200))

    child = spawn()
    child.expect("14 to 24 characters")
    child.expect("Current password: ")
    child.sendline(PASSWORD)
    child.expect("New password: ")
    child.sendline(NEW_PASSWORD)
    child.expect(r"New password \(again\): ")
    child.sendline(NEW_PASSWORD + "x")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1 and "the two new passwords differ" in child.before
    assert PASSWORD not in child.before and NEW_PASSWORD not in child.before  # never echoed
    assert svc.token(email=u["email"], password=PASSWORD).status_code == 200
    child = spawn()
    for prompt, answer in (("Current password: ", PASSWORD), ("New password: ", NEW_PASSWORD),
                           (r"New password \(again\): ", NEW_PASSWORD)):
        child.expect(prompt)
        child.sendline(answer)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "password changed" in child.before, child.before
    assert svc.token(email=u["email"], password=NEW_PASSWORD).status_code == 200
    # rotate on a terminal asks for the password without echo
    child = pexpect.spawn(str(CLOUD), ["credentials", "rotate"], env=cloud.env, timeout=60, encoding="utf-8",
                          dimensions=(24, 200))
    child.expect("Password: ")
    child.sendline(NEW_PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "shown this once" in child.before and NEW_PASSWORD not in child.before
