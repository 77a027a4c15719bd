"""What a new admin reaches for (issue 29): one rule for image names, image and flavor
list|update|delete, user list|password|secret, `user apply` on the sandbox, audit rows
of host commands, names without control characters, and output that cannot drive the
terminal. Every command runs as the real `cloud-agent` on a sandbox; each test checks the
rows it changed."""

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pexpect

from controller.config import load_config
from controller.context import build_context
from tests.agent.test_agent_controller import (  # noqa: F401 - fixtures
    ADMIN_EMAIL, BOB_EMAIL, Sandbox, api, copy_sandbox, sandbox, sandbox_template)
from tests.fixtures.agent import AGENT

IMAGE = ("--os-name", "debian", "--os-major", "12", "--min-disk", "1", "--min-ram", "256")
OSC52 = "\x1b]52;c;aGk=\x07"
ROOT = Path(__file__).resolve().parents[2]


def add_image(sb: Sandbox, name: str, minor: str, *more: str) -> dict:
    return sb.ok("image", "add", "--name", name, *IMAGE, "--os-minor", minor, *more)


# -- image names: unique among active images ---------------------------------------------------
def test_a_second_active_image_of_a_name_is_refused_and_a_name_picks_the_active_one(sandbox):
    old = add_image(sandbox, "Debian 12", "7")
    msg = sandbox.error("image", "add", "--name", "Debian 12", *IMAGE, "--os-minor", "8")
    assert msg == (f"error: an active image is already named 'Debian 12' ({old['id']}): names of active images "
                   "are unique; deactivate that one or choose another name")
    assert [r["id"] for r in sandbox.rows("SELECT id FROM images WHERE name = 'Debian 12'")] == [old["id"]]
    # Deactivated, the old one leaves the name to a new image, and the name picks the new one.
    assert sandbox.ok("image", "deactivate", "Debian 12")["active"] is False
    new = add_image(sandbox, "Debian 12", "8")
    assert sandbox.ok("image", "update", "Debian 12", "--min-ram", "512")["id"] == new["id"]
    assert sandbox.rows("SELECT min_ram FROM images WHERE id = ?", (new["id"],)) == [{"min_ram": 512}]
    # Activating the old one again would make the name pick two: refused, nothing changes.
    assert sandbox.error("image", "activate", old["id"]).startswith(
        "error: an active image is already named 'Debian 12' (")
    assert sandbox.rows("SELECT active FROM images WHERE id = ?", (old["id"],)) == [{"active": 0}]
    # Renaming an image onto an active name is refused the same way.
    other = add_image(sandbox, "Rocky 9", "1")
    assert "names of active images are unique" in sandbox.error("image", "update", other["id"], "--name", "Debian 12")
    assert sandbox.rows("SELECT name FROM images WHERE id = ?", (other["id"],)) == [{"name": "Rocky 9"}]


def test_inactive_namesakes_are_ambiguous_and_told_apart_by_os_version(sandbox):
    a = add_image(sandbox, "Old", "1", "--inactive")
    b = add_image(sandbox, "Old", "2", "--inactive")
    msg = sandbox.error("image", "update", "Old", "--os-minor", "9")
    # Candidates come in creation order, ties by id: two images made in one second in either order.
    prefix = "error: image name 'Old' is ambiguous, use an id: "
    assert msg.startswith(prefix) and set(msg.removeprefix(prefix).split("; ")) == {
        f"{a['id']} (debian 12.1, inactive)", f"{b['id']} (debian 12.2, inactive)"}
    assert sandbox.ok("image", "update", b["id"], "--os-minor", "9")["operating-system"]["minor_version"] == "9"


# -- image and flavor list | update | delete ---------------------------------------------------
def test_image_list_update_and_delete(sandbox):
    made = add_image(sandbox, "Debian 12", "7", "--private")
    listed = sandbox.ok("image", "list")["images"]
    assert [i["id"] for i in listed] == [made["id"]] and listed[0] == made
    table = sandbox.run("image", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "OS", "MIN-DISK", "MIN-RAM", "PUBLIC", "ACTIVE"]
    assert table[1].split() == [made["id"], "Debian", "12", "debian", "12.7", "1", "256", "no", "yes"]
    changed = sandbox.ok("image", "update", "Debian 12", "--name", "Debian 12.8", "--os-minor", "8", "--public")
    assert (changed["name"], changed["operating-system"]["minor_version"], changed["public"]) == (
        "Debian 12.8", "8", True)
    assert sandbox.rows("SELECT name, os_minor, public FROM images") == [
        {"name": "Debian 12.8", "os_minor": "8", "public": 1}]
    assert sandbox.error("image", "update", "Debian 12.8") == (
        "error: nothing to change: give --name, --os-name, --os-major, --os-minor, --min-ram or --public/--private")
    assert sandbox.error("image", "delete", "Debian 12.8", code=2) == "error: not on a terminal: add --yes to confirm"
    gone = sandbox.ok("image", "delete", "Debian 12.8", "--yes")
    assert gone["id"] == made["id"] and gone["deleted"] is True and gone["kept_on"] == []
    assert sandbox.rows("SELECT id FROM images") == []
    assert sandbox.error("image", "delete", made["id"], "--yes") == (
        f"error: server-image {made['id']} not found (no image has that id or name)")


def test_an_image_or_flavor_in_use_is_not_deleted(sandbox, api):
    image = add_image(sandbox, "Debian 12", "7")
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "256", "--disk", "1", "--vcpu", "1")
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    api.create_volume(api.headers, size=1)
    r = api.client.simulate_post("/v1/server-instance", headers=api.headers,
                                 json={"server-image": image["id"], "server-flavor": flavor["id"]})
    assert r.status_code == 201, r.text
    assert sandbox.error("image", "delete", image["id"], "--yes").startswith(
        f"error: server-image {image['id']} is used by server-instances")
    assert sandbox.error("flavor", "delete", "small", "--yes").startswith(
        f"error: server-flavor {flavor['id']} is used by server-instances")
    assert len(sandbox.rows("SELECT id FROM images")) == 1 and len(sandbox.rows("SELECT id FROM flavors")) == 1


def test_flavor_list_update_and_delete(sandbox):
    small = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
    sandbox.ok("flavor", "add", "--name", "big", "--memory", "1024", "--disk", "4", "--vcpu", "2", "--private")
    listed = sandbox.ok("flavor", "list")["flavors"]
    assert [(f["name"], f["public"]) for f in listed] == [("small", True), ("big", False)]
    table = sandbox.run("flavor", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "VCPU", "MEMORY", "DISK", "PUBLIC", "LEASE-DEFAULT", "LEASE-MAX"]
    assert table[2].split() == [listed[1]["id"], "big", "2", "1024", "4", "no", "-", "-"]
    assert sandbox.ok("flavor", "update", "small", "--name", "tiny", "--private")["public"] is False
    assert sandbox.rows("SELECT name, public FROM flavors WHERE id = ?", (int(small["id"]),)) == [
        {"name": "tiny", "public": 0}]
    assert sandbox.error("flavor", "update", "tiny", "--name", "big") == "error: a flavor named 'big' exists"
    assert sandbox.ok("flavor", "delete", "tiny", "--yes")["id"] == small["id"]
    assert [r["name"] for r in sandbox.rows("SELECT name FROM flavors")] == ["big"]


# -- users --------------------------------------------------------------------------------------
def test_user_list_shows_every_user(sandbox):
    sandbox.ok("account", "enable", BOB_EMAIL, "--username", "bob")
    listed = sandbox.ok("user", "list")["users"]
    assert sorted(u["email"] for u in listed) == [ADMIN_EMAIL, BOB_EMAIL]
    table = sandbox.run("user", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "EMAIL", "NAME", "USERNAME", "ROLES", "OWNER", "ACTIVE"]
    bob = next(line for line in table if BOB_EMAIL in line).split()
    assert bob[3] == "bob" and bob[-1] == "yes"


def _verify(sb: Sandbox, email: str, password: str) -> bool:
    ctx = build_context(load_config(sb.config))
    try:
        row = ctx.store.get_user_by_email(email)
        return ctx.passwords.verify(row["password_hash"], password)
    finally:
        ctx.store.close()


def test_user_password_sets_a_new_password(sandbox):
    proc = sandbox.run("--json", "user", "password", BOB_EMAIL, "--password-file", "-", input="Brand-new-pass-26\n")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["password_set"] is True
    assert _verify(sandbox, BOB_EMAIL, "Brand-new-pass-26")
    assert sandbox.run("user", "password", BOB_EMAIL, "--password-file", "-", input="short\n").returncode == 1
    assert _verify(sandbox, BOB_EMAIL, "Brand-new-pass-26")
    audit = sandbox.rows("SELECT target, detail FROM audit WHERE action = 'cloud-agent user password'")
    assert audit and all("Brand" not in r["detail"] for r in audit)


def test_user_password_on_a_terminal_tells_the_rule_first_and_asks_twice(sandbox):
    env = {k: v for k, v in os.environ.items() if k != "CLOUD_CONTROLLER_CONFIG"}
    child = pexpect.spawn(str(AGENT), ["--config", sandbox.config, "user", "password", BOB_EMAIL], env=env,
                          encoding="utf-8", timeout=30)
    child.expect("14 to 24 characters long and mixes at least two of: letters, digits, punctuation")
    child.expect("New password: ")
    child.sendline("Terminal-pass-2026")
    child.expect("Repeat the password: ")
    child.sendline("Terminal-pass-2026")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert _verify(sandbox, BOB_EMAIL, "Terminal-pass-2026")


def test_user_secret_shows_it_and_reset_makes_a_new_one_shown_once(sandbox):
    shown = sandbox.ok("user", "secret", ADMIN_EMAIL)
    assert shown["api_secret"] == sandbox.admin["api_secret"] and shown["api_key"] == sandbox.admin["api_key"]
    proc = sandbox.run("user", "secret", ADMIN_EMAIL, "--reset")
    assert proc.returncode == 0, proc.stderr
    new = next(line.split()[-1] for line in proc.stdout.splitlines() if "api_secret:" in line)
    assert new != sandbox.admin["api_secret"] and "shown once" in proc.stdout
    assert sandbox.ok("user", "secret", ADMIN_EMAIL)["api_secret"] == new
    audit = sandbox.rows("SELECT detail FROM audit WHERE action = 'cloud-agent user secret'")
    assert len(audit) == 3 and all(new not in r["detail"] for r in audit)


def test_user_apply_on_the_sandbox_refuses_with_a_note(sandbox):
    proc = sandbox.run("user", "apply", BOB_EMAIL, "--yes")
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: sandbox profile: the guests live in the server process, which this "
                                   "command cannot reach; a guest takes a user's changes at its next start "
                                   "(`cloud server stop` and `start`)")


# -- audit rows of host commands ---------------------------------------------------------------------
def test_host_commands_audit_rows_name_the_host(sandbox):
    sandbox.ok("host", "disable", "default")
    sandbox.ok("host", "enable", "default")
    rows = sandbox.rows("SELECT action, target FROM audit WHERE action LIKE 'cloud-agent host %' ORDER BY rowid")
    assert rows == [{"action": "cloud-agent host disable", "target": "default"},
                    {"action": "cloud-agent host enable", "target": "default"}]


# -- control characters ---------------------------------------------------------------------------------
def test_names_with_control_characters_are_refused(sandbox, api):
    assert sandbox.error("image", "add", "--name", "evil" + OSC52, *IMAGE, "--os-minor", "1") == (
        "error: image name must not contain control characters")
    assert sandbox.error("flavor", "add", "--name", "x\u202ey", "--memory", "1", "--disk", "1", "--vcpu", "1") == (
        "error: flavor name must not contain control characters")
    assert sandbox.rows("SELECT id FROM images") == [] and sandbox.rows("SELECT id FROM flavors") == []
    bob = sandbox.rows("SELECT id, name FROM users WHERE email = ?", (BOB_EMAIL,))[0]
    r = api.client.simulate_post(f"/v1/user/update/{bob['id']}", headers=api.headers, json={"name": "B" + OSC52})
    assert r.status_code == 400 and "name must not contain control characters" in r.text
    assert sandbox.rows("SELECT name FROM users WHERE id = ?", (bob["id"],)) == [{"name": bob["name"]}]


def test_tables_and_lines_show_control_characters_escaped_and_json_keeps_them(sandbox):
    made = add_image(sandbox, "plain", "1")
    # A name stored before the rule (or by hand): shown, never obeyed.
    with sqlite3.connect(sandbox.db_path) as db:
        db.execute("UPDATE images SET name = ? WHERE id = ?", ("evil" + OSC52, made["id"]))
    out = sandbox.run("image", "list").stdout
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]52;c;aGk=\\x07" in out
    assert sandbox.ok("image", "list")["images"][0]["name"] == "evil" + OSC52


# -- tables of the admin command -------------------------------------------------------------------
def test_server_list_shows_owner_image_flavor_and_host_and_host_list_has_a_header(sandbox, api):
    image = add_image(sandbox, "Debian 12", "7")
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "256", "--disk", "1", "--vcpu", "1")
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    api.create_volume(api.headers, size=1)
    r = api.client.simulate_post("/v1/server-instance", headers=api.headers,
                                 json={"server-image": image["id"], "server-flavor": flavor["id"]})
    assert r.status_code == 201, r.text
    made = r.json["data"][0]
    listed = sandbox.ok("server", "list")["servers"]
    assert [(s["id"], s["owner"], s["image"], s["flavor"], s["host"]) for s in listed] == [
        (made["id"], ADMIN_EMAIL, "Debian 12", "small", "default")]
    assert sandbox.ok("server", "list", "--host", "elsewhere")["servers"] == []
    assert sandbox.ok("server", "list", "--owner", BOB_EMAIL)["servers"] == []
    rows = sandbox.run("server", "ls").stdout.splitlines()
    assert rows[0].split() == ["ID", "HOSTNAME", "STATUS", "OWNER", "IMAGE", "FLAVOR", "HOST", "PRIVATE-IP",
                               "EXPIRES"]
    assert rows[1].split()[3:8] == [ADMIN_EMAIL, "Debian", "12", "small", "default"]
    # The admin's lease: past any max, by id or hostname, and taken away; one of the two asked.
    ends = sandbox.ok("server", "lease", made["id"], "--hours", "1000")["expires-at"]
    assert sandbox.rows("SELECT expires_at FROM instances WHERE id = ?", (made["id"],)) == [{"expires_at": ends}]
    assert sandbox.run("server", "ls").stdout.splitlines()[1].split()[-1] == ends
    assert sandbox.ok("server", "lease", made["hostname"], "--never")["expires-at"] is None
    assert sandbox.rows("SELECT expires_at FROM instances WHERE id = ?", (made["id"],)) == [{"expires_at": None}]
    assert sandbox.error("server", "lease", made["id"]) == "error: give --hours H or --never (one of them)"
    assert sandbox.error("server", "lease", made["id"], "--hours", "0") == (
        "error: hours must be a number above 0 and at most 87600")
    assert sandbox.error("server", "lease", "nosuch", "--never") == (
        "error: server-instance nosuch does not exist (give its id or hostname)")
    assert [r["action"] for r in sandbox.rows(
        "SELECT action FROM instance_actions WHERE instance_id = ? ORDER BY id", (made["id"],))][-2:] == [
        "renew", "renew"]
    hosts = sandbox.run("host", "list").stdout.splitlines()
    assert hosts[0].split() == ["NAME", "URI", "STATE", "VCPUS", "MEMORY-MB", "ALLOC-VCPUS", "ALLOC-MB", "INSTANCES"]
    assert hosts[1].split()[:3] == ["default", "test:///default", "enabled"] and hosts[1].split()[-1] == "1"


# -- the sandbox's set-up --------------------------------------------------------------------------------
def test_the_sandbox_config_leaves_cpu_mode_empty(sandbox):
    assert load_config(sandbox.config).libvirt.cpu_mode == ""
    assert "cpu_mode = host-passthrough" not in open(sandbox.config).read()


def _setup_host(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/setup-host.sh with every package missing and apt-get a stand-in that records
    its arguments (nothing is installed; the venv is the one in place)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    log = tmp_path / "apt.log"
    (fake / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (fake / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake / "debconf-set-selections").write_text("#!/bin/sh\ncat >/dev/null\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup-host.sh"), *args], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_setup_host_for_the_sandbox_installs_only_what_it_uses_and_waits_for_apts_lock(tmp_path):
    proc, calls = _setup_host(tmp_path, "--sandbox")
    assert proc.returncode == 0, proc.stderr
    update, install = calls
    assert update.startswith("-o DPkg::Lock::Timeout=600 update")
    wanted = install.split()[install.split().index("--no-install-recommends") + 1:]
    assert set(wanted) == {"python3", "python3-venv", "python3-dev", "gcc", "pkg-config", "libvirt-dev",
                           "libldap2-dev", "libsasl2-dev"}
    assert install.startswith("-o DPkg::Lock::Timeout=600 install")
    full_run = tmp_path / "full"
    full_run.mkdir()
    proc, calls = _setup_host(full_run)
    assert proc.returncode == 0, proc.stderr
    full = calls[1].split()
    assert {"qemu-system-x86", "slapd", "nslcd", "mmdebstrap", "wrk", "libvirt-daemon-system"} <= set(full)
    assert not (full_run / "policy-rc.d").exists()


def test_setup_host_for_a_hypervisor_installs_libvirt_and_the_guests_rules_not_the_apis_backends(tmp_path):
    from host_adapters.network.guest_firewall import HOOK_PATH

    proc, calls = _setup_host(tmp_path, "--hypervisor")
    assert proc.returncode == 0, proc.stderr
    wanted = set(calls[1].split()[calls[1].split().index("--no-install-recommends") + 1:])
    assert {"libvirt-daemon-system", "qemu-system-x86", "nftables", "iproute2", "python3-venv"} <= wanted
    assert not wanted & {"slapd", "nslcd", "chromium", "mmdebstrap", "wrk", "btrfs-progs"}
    # The hook that keeps guests filtered on every start path is there, runnable.
    assert os.access(HOOK_PATH, os.X_OK)
    assert "cloud-guest-rules" in open(HOOK_PATH).read()


# -- names, not ids, in the admin command's lines ----------------------------------------------------
def test_lines_name_images_flavors_owners_and_actors_where_they_are_known(sandbox, api):
    private = add_image(sandbox, "Secret OS", "1", "--private")
    flavor = sandbox.ok("flavor", "add", "--name", "gpu", "--memory", "256", "--disk", "1", "--vcpu", "1", "--private")

    def line(*args: str) -> str:
        proc = sandbox.run(*args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert line("image", "grant", private["id"], BOB_EMAIL) == f"{BOB_EMAIL} may use image {private['id']} (Secret OS)"
    assert line("image", "deactivate", private["id"]) == f"image {private['id']} (Secret OS) inactive"
    assert line("flavor", "grant", flavor["id"], BOB_EMAIL) == f"{BOB_EMAIL} may use flavor {flavor['id']} (gpu)"
    # A volume's owner by email.
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    volume = api.create_volume(api.headers, size=1)
    assert line("volume", "resize", volume["volume-id"], "3") == (
        f"volume {volume['volume-id']} of {ADMIN_EMAIL} is now 3 GB")
    assert sandbox.rows("SELECT size_gb FROM volumes") == [{"size_gb": 3}]
    # The API's audit rows name their actor by id; the human lines by email (--json keeps the id).
    entries = sandbox.ok("audit")["entries"]
    created = next(e for e in entries if e["action"] == "POST /v1/storage-volume")
    assert created["actor"] == sandbox.admin["userid"]
    shown = next(x for x in line("audit").splitlines() if "POST /v1/storage-volume" in x)
    assert f" {ADMIN_EMAIL} POST /v1/storage-volume " in shown and sandbox.admin["userid"] not in shown


def test_user_list_names_an_inactive_owner_by_email_with_active_only(sandbox, api):
    owner = api.create_user("olga@example.org")
    r = api.client.simulate_post("/v1/user/create", headers=api.headers,
                                 json={"email": "mia@example.org", "password": "User-pass-2026!",
                                       "owner_userid": owner})
    assert r.status_code == 200, r.text
    r = api.client.simulate_post(f"/v1/user/update/{owner}", headers=api.headers, json={"active": 0})
    assert r.status_code == 200, r.text
    table = sandbox.run("user", "list", "--active-only").stdout.splitlines()
    assert all(row.split()[1] != "olga@example.org" for row in table[1:])  # olga is inactive
    mia = next(row for row in table if row.split()[1] == "mia@example.org").split()
    assert mia[-2:] == ["olga@example.org", "yes"]
    assert owner not in "\n".join(table)
