"""cloud-agent account / image / flavor / volume on a sandbox made by `cloud-agent init --sandbox DIR`.

Every command runs as the real `cloud-agent` in a subprocess. Each test checks
the effect (the passwd and group files of DIR/sysroot, the database rows), that
`--json` prints exactly one JSON document equal to what the API gives a
superuser for the same object, and that errors are one clean line, never a
traceback, and change nothing.
"""

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from falcon import testing

from controller.config import load_config
from controller.context import build_context
from tests.fixtures.agent import run_agent

ADMIN_EMAIL = "admin@example.org"
ADMIN_PASSWORD = "Admin-pass-2026"
USER_PASSWORD = "User-pass-2026!"
BOB_EMAIL = "bob@example.org"
UNKNOWN_UUID = "00000000-0000-4000-8000-000000000000"


def one_json_document(text: str):
    """json.loads refuses trailing data: this is exactly one document."""
    return json.loads(text)


@dataclass
class Sandbox:
    root: Path  # DIR of `init --sandbox DIR`
    config: str
    admin: dict  # userid, api_key, api_secret

    def run(self, *args: str, **kw):
        return run_agent(*args, config=self.config, **kw)

    def ok(self, *args: str) -> dict:
        """Run with --json; it must succeed and print exactly one JSON document and nothing else."""
        proc = self.run("--json", *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr == "", proc.stderr
        return one_json_document(proc.stdout)

    def error(self, *args: str, code: int = 1) -> str:
        """Run with --json; it must fail with one clean line on stderr and {"error": ...} on stdout."""
        proc = self.run("--json", *args)
        assert proc.returncode == code, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        assert one_json_document(proc.stdout) == {"error": lines[0][len("error: "):]}
        return lines[0]

    # -- what the commands change --------------------------------------------------
    @property
    def db_path(self) -> Path:
        return self.root / "controller.db"

    def rows(self, sql: str, params=()) -> list[dict]:
        conn = sqlite3.connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def etc(self, name: str) -> str:
        return (self.root / "sysroot" / "etc" / name).read_text()

    def entries(self, name: str) -> dict[str, list[str]]:
        return {line.split(":")[0]: line.split(":") for line in self.etc(name).splitlines() if line}

    def snapshot(self) -> tuple:
        tables = ("users", "system_accounts", "images", "image_access", "flavors", "volumes")
        counts = tuple(self.rows(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in tables)
        return self.etc("passwd"), self.etc("group"), counts, sorted(os.listdir(self.root / "home"))

    # -- the API, as a superuser ------------------------------------------------------
    def api(self) -> "Api":
        from api.app import create_app
        from host_adapters.factory import build_adapters

        config = load_config(self.config)
        ctx = build_context(config, adapters=build_adapters(config))
        client = testing.TestClient(create_app(ctx))
        return Api(client, login(client, self.admin))


def login(client, who: dict) -> dict:
    body = ({"api_key": who["api_key"], "api_secret": who["api_secret"]} if "api_key" in who
            else {"email": who["email"], "password": who["password"]})
    r = client.simulate_post("/v1/auth/token", json=body)
    assert r.status_code == 200, r.text
    data = r.json["data"]
    return {"X-Auth-Token": data["token"], "X-Auth-Cloudauth-Id": data["userid"]}


@dataclass
class Api:
    client: testing.TestClient
    headers: dict

    def get(self, path: str, headers: dict | None = None) -> dict:
        """One object from the controller interface (data: [obj])."""
        r = self.client.simulate_get(path, headers=headers or self.headers)
        assert r.status_code == 200, r.text
        [obj] = r.json["data"]
        return obj

    def user(self, userid: str) -> dict:
        r = self.client.simulate_get(f"/v1/user/view/{userid}", headers=self.headers)
        assert r.status_code == 200, r.text
        return r.json["data"]["user"]

    def create_user(self, email: str) -> str:
        r = self.client.simulate_post("/v1/user/create", headers=self.headers,
                                      json={"email": email, "password": USER_PASSWORD})
        assert r.status_code == 200, r.text
        return r.json["data"]["userid"]

    def create_volume(self, headers: dict, size: int = 2) -> dict:
        r = self.client.simulate_post("/v1/storage-volume", headers=headers,
                                      json={"volume-size": size, "volume-type": {"visibility": "cluster"}})
        assert r.status_code == 201, r.text
        return r.json["data"][0]


def make_sandbox(tmp_path: Path) -> Sandbox:
    """`init --sandbox`, a superuser from `user create-superuser`, and bob@example.org (no account)."""
    root = tmp_path / "sandbox"
    config = str(tmp_path / "controller.ini")
    proc = run_agent("--config", config, "--json", "init", "--sandbox", str(root))
    assert proc.returncode == 0, proc.stderr
    proc = run_agent("--config", config, "--json", "user", "create-superuser", "--email", ADMIN_EMAIL,
                     "--password", ADMIN_PASSWORD)
    assert proc.returncode == 0, proc.stderr
    from controller.users.users import insert_user

    ctx = build_context(load_config(config))
    insert_user(ctx, email=BOB_EMAIL, password=USER_PASSWORD)
    ctx.store.close()
    return Sandbox(root=root, config=config, admin=one_json_document(proc.stdout))


@pytest.fixture(scope="session")
def sandbox_template(tmp_path_factory) -> Sandbox:
    return make_sandbox(tmp_path_factory.mktemp("sandbox-template"))


def copy_sandbox(template: Sandbox, tmp_path: Path) -> Sandbox:
    """A private copy of the template (making one costs seconds of argon2 and process starts)."""
    root = tmp_path / "sandbox"
    shutil.copytree(template.root, root, symlinks=True)
    config = tmp_path / "controller.ini"
    config.write_text(Path(template.config).read_text().replace(str(template.root), str(root)))
    return Sandbox(root=root, config=str(config), admin=template.admin)


@pytest.fixture
def sandbox(sandbox_template, tmp_path) -> Sandbox:
    return copy_sandbox(sandbox_template, tmp_path)


@pytest.fixture
def api(sandbox) -> Api:
    return sandbox.api()


@pytest.fixture
def bob(sandbox) -> str:
    """The id of bob@example.org, a user without a system account."""
    return sandbox.rows("SELECT id FROM users WHERE email = ?", (BOB_EMAIL,))[0]["id"]


def add_image(sandbox: Sandbox, *extra: str, name: str = "Debian 12") -> dict:
    return sandbox.ok("image", "add", "--name", name, "--os-name", "debian", "--os-major", "12",
                      "--os-minor", "7", "--min-disk", "2", "--min-ram", "512", *extra)


# -- account enable ------------------------------------------------------------------
def test_account_enable_writes_passwd_and_group_and_records_the_account(sandbox, api, bob):
    out = sandbox.ok("account", "enable", "bob@example.org", "--username", "bob")

    name, _, uid, gid, _gecos, home, shell = sandbox.entries("passwd")["bob"]
    assert int(uid) >= 10000 and home == str(sandbox.root / "home" / "bob") and shell == "/bin/bash"
    assert sandbox.entries("group")["bob"][:3] == ["bob", "x", gid]
    # Homes come from `storage-volume`, not from useradd.
    assert not (sandbox.root / "home" / "bob").exists()

    [row] = sandbox.rows("SELECT * FROM system_accounts")
    assert row["user_id"] == bob and row["username"] == "bob"
    assert (row["uid"], row["gid"]) == (int(uid), int(gid))
    assert row["home"] == home and row["cloud_controller_id"] == 1 and row["created_at_utc"].endswith("Z")

    assert out == {"id": row["id"], "username": "bob", "uuid": row["uuid"], "cloud_controller_id": 1}
    assert api.user(bob)["system_accounts"] == [out]


def test_account_enable_with_a_chosen_uid(sandbox, api, bob):
    out = sandbox.ok("account", "enable", "BOB@example.org", "--username", "bob", "--uid", "23456")
    assert sandbox.entries("passwd")["bob"][2] == "23456"
    assert sandbox.rows("SELECT uid FROM system_accounts")[0]["uid"] == 23456
    assert api.user(bob)["system_accounts"] == [out]


def test_account_enable_human_output(sandbox, bob):
    proc = sandbox.run("account", "enable", "bob@example.org", "--username", "bob")
    assert proc.returncode == 0, proc.stderr
    uuid = sandbox.rows("SELECT uuid FROM system_accounts")[0]["uuid"]
    assert "bob" in proc.stdout and uuid in proc.stdout
    # Without --json an error is one line on stderr and nothing on stdout.
    proc = sandbox.run("account", "enable", "bob@example.org", "--username", "bob")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "error: bob@example.org already has a system account on this controller\n"


@pytest.mark.parametrize("args, message", [
    (["nobody@example.org", "--username", "nobody"], "no user with email"),
    (["bob@example.org", "--username", "Bob"], "invalid username"),
    (["bob@example.org", "--username", "-bob"], "invalid username"),
    (["bob@example.org", "--username", "ccadmin"], "system account ccadmin is already recorded"),
    (["admin@example.org", "--username", "other"], "already has a system account"),
    (["bob@example.org", "--username", "root"], "root is a system account name; choose another"),
    (["bob@example.org", "--username", "bob", "--uid", "0"], "invalid uid"),
])
def test_account_enable_errors_are_clean_and_change_nothing(sandbox, bob, args, message):
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    before = sandbox.snapshot()
    assert message in sandbox.error("account", "enable", *args)
    assert sandbox.snapshot() == before


# Reserved names (the system's own, and group names reserved for their privileges: the
# account's private group takes its name) are refused whether or not the host has them.
@pytest.mark.parametrize("username", ["daemon", "bin", "sys", "adm", "nobody", "www-data", "sshd", "admin", "sudo",
                                      "docker", "systemd-network", "slurm"])
def test_account_enable_refuses_reserved_system_account_names(sandbox, bob, username):
    assert username not in sandbox.entries("passwd")  # the sandbox's system root has root alone
    before = sandbox.snapshot()
    assert sandbox.error("account", "enable", "bob@example.org", "--username", username) == (
        f"error: {username} is a system account name; choose another")
    assert sandbox.snapshot() == before


def test_account_enable_refuses_a_name_the_host_has_below_the_first_uid(sandbox, bob):
    # An account of the host below login.defs' UID_MIN (10000 in the sandbox), in no list.
    passwd = sandbox.root / "sysroot" / "etc" / "passwd"
    passwd.write_text(passwd.read_text() + "ccsvc:x:990:990:a service:/nonexistent:/usr/sbin/nologin\n"
                      "ccuser:x:20000:20000::/home/ccuser:/bin/bash\n")
    before = sandbox.snapshot()
    assert sandbox.error("account", "enable", "bob@example.org", "--username", "ccsvc") == (
        "error: ccsvc is a system account name; choose another")
    # One above the first uid is an account of someone else's: taken, not a system name.
    assert sandbox.error("account", "enable", "bob@example.org", "--username", "ccuser") == (
        "error: username ccuser is already in use")
    assert sandbox.snapshot() == before
    # Without --json too: one line, nothing on stdout.
    proc = sandbox.run("account", "enable", "bob@example.org", "--username", "ccsvc")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == "error: ccsvc is a system account name; choose another\n"


def test_account_enable_refuses_a_uid_in_use(sandbox, bob):
    admin = sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    uid = sandbox.rows("SELECT uid FROM system_accounts WHERE id = ?", (admin["id"],))[0]["uid"]
    before = sandbox.snapshot()
    assert f"uid {uid} is already in use" in sandbox.error("account", "enable", "bob@example.org",
                                                           "--username", "bob", "--uid", str(uid))
    assert sandbox.snapshot() == before


def test_account_enable_missing_option_is_a_usage_error(sandbox, bob):
    proc = sandbox.run("account", "enable", "bob@example.org")
    assert proc.returncode == 2 and "--username" in proc.stderr
    assert sandbox.rows("SELECT * FROM system_accounts") == []


# -- account disable (--yes; the prompt is in test_agent_prompts.py) --------------------
def test_account_disable_removes_the_account_everywhere(sandbox, api, bob):
    enabled = sandbox.ok("account", "enable", "bob@example.org", "--username", "bob")
    out = sandbox.ok("account", "disable", "bob@example.org", "--yes")
    assert out == enabled
    assert "bob" not in sandbox.entries("passwd") and "bob" not in sandbox.entries("group")
    assert sandbox.rows("SELECT * FROM system_accounts") == []
    assert api.user(bob)["system_accounts"] == []
    # The name is free again.
    again = sandbox.ok("account", "enable", "bob@example.org", "--username", "bob")
    assert again["uuid"] != enabled["uuid"]


def test_account_disable_is_refused_while_the_user_has_a_volume(sandbox, api):
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    api.create_volume(api.headers)
    before = sandbox.snapshot()
    assert "still has a storage volume" in sandbox.error("account", "disable", ADMIN_EMAIL, "--yes")
    assert sandbox.snapshot() == before
    assert "ccadmin" in sandbox.entries("passwd")


def test_account_disable_errors(sandbox, bob):
    assert "has no system account" in sandbox.error("account", "disable", "bob@example.org", "--yes")
    assert "no user with email" in sandbox.error("account", "disable", "nobody@example.org", "--yes")


# -- image add / grant / activate / deactivate ---------------------------------------------
def test_image_add_prints_the_api_object_and_records_the_image(sandbox, api):
    out = add_image(sandbox)
    assert out == api.get(f"/v1/server-image/{out['id']}")
    assert out["public"] is True and out["active"] is True
    assert out["operating-system"] == {"name": "debian", "major_version": "12", "minor_version": "7"}
    [row] = sandbox.rows("SELECT * FROM images")
    assert row["id"] == out["id"] and row["name"] == "Debian 12"
    assert (row["min_disk"], row["min_ram"], row["public"], row["active"]) == (2, 512, 1, 1)
    assert row["base_volume"] and row["creation_date"] == out["creation-date"]


def test_image_add_private_and_inactive(sandbox, api, bob):
    out = add_image(sandbox, "--private", "--inactive", name="Rocky")
    assert out["public"] is False and out["active"] is False
    assert out == api.get(f"/v1/server-image/{out['id']}")
    row = sandbox.rows("SELECT public, active FROM images")[0]
    assert (row["public"], row["active"]) == (0, 0)


@pytest.mark.parametrize("change, message", [
    ({"--min-disk": "0"}, "min-disk must be a positive integer"),
    ({"--min-ram": "-1"}, "min-ram must be a positive integer"),
    ({"--name": "  "}, "image name must not be empty"),
])
def test_image_add_errors_are_clean_and_record_nothing(sandbox, change, message):
    values = {"--name": "X", "--os-name": "debian", "--os-major": "12", "--os-minor": "7",
              "--min-disk": "2", "--min-ram": "512", **change}
    args = [a for pair in values.items() for a in pair]
    assert message in sandbox.error("image", "add", *args)
    assert sandbox.rows("SELECT * FROM images") == []


def test_image_add_usage_errors(sandbox, tmp_path):
    proc = sandbox.run("image", "add", "--name", "X", "--os-name", "d", "--os-major", "1", "--os-minor", "0",
                       "--min-disk", "two", "--min-ram", "512")
    assert proc.returncode == 2 and "--min-disk" in proc.stderr
    proc = sandbox.run("image", "add", "--name", "X", "--os-name", "d", "--os-major", "1", "--os-minor", "0",
                       "--min-disk", "2", "--min-ram", "512", "--source", str(tmp_path / "missing.qcow2"))
    assert proc.returncode == 2 and "missing.qcow2" in proc.stderr
    assert sandbox.rows("SELECT * FROM images") == []


@pytest.mark.real_commands
def test_image_add_with_a_source_on_the_sandbox(sandbox, api, tmp_path):
    """The test driver cannot hold uploaded content: the file is checked, a blank disk stands in."""
    import subprocess

    source = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(source), "1G"], check=True)
    out = add_image(sandbox, "--source", str(source))
    assert out == api.get(f"/v1/server-image/{out['id']}")
    raw = tmp_path / "raw.img"
    raw.write_bytes(b"\0" * 4096)
    assert "not a qcow2 file" in sandbox.error("image", "add", "--name", "X", "--os-name", "d", "--os-major", "1",
                                               "--os-minor", "0", "--min-disk", "2", "--min-ram", "512",
                                               "--source", str(raw))
    big = tmp_path / "big.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(big), "5G"], check=True)
    assert "virtual size" in sandbox.error("image", "add", "--name", "X", "--os-name", "d", "--os-major", "1",
                                           "--os-minor", "0", "--min-disk", "2", "--min-ram", "512",
                                           "--source", str(big))
    assert len(sandbox.rows("SELECT * FROM images")) == 1


def test_image_grant_lets_the_user_see_a_private_image(sandbox, api, bob):
    image = add_image(sandbox, "--private")
    bob_headers = login(api.client, {"email": "bob@example.org", "password": USER_PASSWORD})
    r = api.client.simulate_get(f"/v1/server-image/{image['id']}", headers=bob_headers)
    assert r.status_code == 404

    out = sandbox.ok("image", "grant", image["id"], "bob@example.org")
    assert out == api.get(f"/v1/server-image/{image['id']}") == image
    assert sandbox.rows("SELECT * FROM image_access") == [{"image_id": image["id"], "user_id": bob}]
    assert api.get(f"/v1/server-image/{image['id']}", headers=bob_headers)["id"] == image["id"]
    # Granting again changes nothing.
    assert sandbox.ok("image", "grant", image["id"], "bob@example.org") == out
    assert len(sandbox.rows("SELECT * FROM image_access")) == 1


def test_image_grant_errors(sandbox, bob):
    public = add_image(sandbox)
    private = add_image(sandbox, "--private", name="P")
    assert "is public" in sandbox.error("image", "grant", public["id"], "bob@example.org")
    assert "no user with email" in sandbox.error("image", "grant", private["id"], "nobody@example.org")
    assert "not found" in sandbox.error("image", "grant", UNKNOWN_UUID, "bob@example.org")
    assert "not found" in sandbox.error("image", "grant", "not-a-uuid", "bob@example.org")
    assert sandbox.rows("SELECT * FROM image_access") == []


def test_image_deactivate_and_activate(sandbox, api):
    image = add_image(sandbox)
    out = sandbox.ok("image", "deactivate", image["id"])
    assert out["active"] is False and out == api.get(f"/v1/server-image/{image['id']}")
    assert sandbox.rows("SELECT active FROM images")[0]["active"] == 0
    assert sandbox.ok("image", "deactivate", image["id"]) == out

    out = sandbox.ok("image", "activate", image["id"])
    assert out["active"] is True and out == api.get(f"/v1/server-image/{image['id']}")
    assert out == image
    assert sandbox.rows("SELECT active FROM images")[0]["active"] == 1


def test_image_commands_take_an_upper_case_id(sandbox, api):
    """UUIDs are case-insensitive: the upper-case spelling names the same image (it used to end
    in an unmapped error after the row was found, and grant stored the id as typed)."""
    image = add_image(sandbox, "--private", name="P")
    out = sandbox.ok("image", "deactivate", image["id"].upper())
    assert out["id"] == image["id"] and out["active"] is False
    assert sandbox.rows("SELECT id, active FROM images") == [{"id": image["id"], "active": 0}]
    assert sandbox.ok("image", "activate", image["id"].upper())["active"] is True
    sandbox.ok("image", "grant", image["id"].upper(), BOB_EMAIL)
    assert [r["image_id"] for r in sandbox.rows("SELECT image_id FROM image_access")] == [image["id"]]


@pytest.mark.parametrize("command", ["activate", "deactivate"])
def test_image_activation_of_an_unknown_image(sandbox, command):
    assert "not found" in sandbox.error("image", command, UNKNOWN_UUID)
    assert "not found" in sandbox.error("image", command, "../etc")


# -- flavor add ---------------------------------------------------------------------------
def test_flavor_add_prints_the_api_object_and_records_the_flavor(sandbox, api):
    out = sandbox.ok("flavor", "add", "--name", "small", "--memory", "1024", "--disk", "10", "--vcpu", "2")
    assert out == api.get(f"/v1/server-flavor/{out['id']}")
    assert out == {"id": out["id"], "name": "small", "memory": 1024, "disk": 10, "vcpu": 2}
    assert sandbox.rows("SELECT * FROM flavors") == [
        {"id": int(out["id"]), "name": "small", "memory": 1024, "disk": 10, "vcpu": 2, "public": 1,
         "lease_default_seconds": None, "lease_max_seconds": None}]


@pytest.mark.parametrize("args, message", [
    (["--name", "small", "--memory", "512", "--disk", "5", "--vcpu", "1"], "a flavor named 'small' exists"),
    (["--name", "big", "--memory", "0", "--disk", "5", "--vcpu", "1"], "memory must be a positive integer"),
    (["--name", "big", "--memory", "512", "--disk", "-5", "--vcpu", "1"], "disk must be a positive integer"),
    (["--name", "big", "--memory", "512", "--disk", "5", "--vcpu", "0"], "vcpu must be a positive integer"),
    (["--name", "", "--memory", "512", "--disk", "5", "--vcpu", "1"], "flavor name must not be empty"),
])
def test_flavor_add_errors(sandbox, args, message):
    sandbox.ok("flavor", "add", "--name", "small", "--memory", "1024", "--disk", "10", "--vcpu", "2")
    before = sandbox.rows("SELECT * FROM flavors")
    assert message in sandbox.error("flavor", "add", *args)
    assert sandbox.rows("SELECT * FROM flavors") == before


# -- volume resize --------------------------------------------------------------------------
@pytest.fixture
def volume(sandbox, api) -> dict:
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    return api.create_volume(api.headers, size=2)


def test_volume_resize_prints_the_api_object_and_records_the_size(sandbox, api, volume):
    assert (sandbox.root / "home" / "ccadmin").is_dir()
    out = sandbox.ok("volume", "resize", volume["volume-id"], "7")
    assert out == api.get(f"/v1/storage-volume/{volume['volume-id']}")
    assert out == dict(volume, **{"volume-size": 7})
    assert sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 7


def test_volume_resize_by_the_owners_email_grows_and_shrinks(sandbox, api, volume):
    grown = sandbox.ok("volume", "resize", ADMIN_EMAIL, "9")
    assert grown == dict(volume, **{"volume-size": 9}) == api.get(f"/v1/storage-volume/{volume['volume-id']}")
    shrunk = sandbox.ok("volume", "resize", ADMIN_EMAIL.upper(), "1")
    assert shrunk == dict(volume, **{"volume-size": 1})
    assert sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 1
    proc = sandbox.run("volume", "resize", ADMIN_EMAIL, "4")
    assert proc.returncode == 0 and proc.stdout == f"volume {volume['volume-id']} of {ADMIN_EMAIL} is now 4 GB\n"


@pytest.mark.parametrize("args, message", [
    (["{id}", "0"], "volume-size must be a whole number of GB from 1 to 100"),
    (["{id}", "101"], "error: volume-size 101 GB is too large: at most 100 GB ([volumes] max_size_gb)"),
    ([ADMIN_EMAIL, "101"], "error: volume-size 101 GB is too large: at most 100 GB ([volumes] max_size_gb)"),
    ([UNKNOWN_UUID, "5"], "not found"),
    (["not-a-uuid", "5"], "not found"),
    ([BOB_EMAIL, "5"], f"error: {BOB_EMAIL} has no storage volume"),
    (["nobody@example.org", "5"], "no user with email"),
])
def test_volume_resize_errors(sandbox, volume, args, message):
    argv = [a.format(id=volume["volume-id"]) for a in args]
    assert message in sandbox.error("volume", "resize", *argv)
    assert sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 2


def test_volume_resize_of_a_home_gone_from_disk(sandbox, volume):
    os.rmdir(sandbox.root / "home" / "ccadmin")
    assert "no home volume" in sandbox.error("volume", "resize", volume["volume-id"], "5")
    assert sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 2


def test_volume_resize_size_must_be_a_number(sandbox, volume):
    proc = sandbox.run("volume", "resize", volume["volume-id"], "big")
    assert proc.returncode == 2 and "big" in proc.stderr


# -- volume list ------------------------------------------------------------------------------
def test_volume_list_names_owner_account_size_mount_point_and_date(sandbox, api, volume, bob):
    assert sandbox.ok("volume", "list") == {"volumes": [dict(volume, owner=ADMIN_EMAIL, username="ccadmin")]}
    # bob's too, oldest first; quota backend none keeps no usage, so no used-bytes.
    sandbox.ok("account", "enable", BOB_EMAIL, "--username", "bob")
    bob_headers = login(api.client, {"email": BOB_EMAIL, "password": USER_PASSWORD})
    bobs = api.create_volume(bob_headers, size=3)
    listed = sandbox.ok("volume", "list")["volumes"]
    assert [(v["volume-id"], v["owner"], v["username"], v["volume-size"]) for v in listed] == [
        (volume["volume-id"], ADMIN_EMAIL, "ccadmin", 2), (bobs["volume-id"], BOB_EMAIL, "bob", 3)]
    assert all("used-bytes" not in v for v in listed)
    # The table: a header line, one row each, no USED-GB column where usage is not known.
    rows = sandbox.run("volume", "ls").stdout.splitlines()
    assert rows[0].split() == ["ID", "OWNER", "USERNAME", "SIZE-GB", "MOUNT-POINT", "CREATED"]
    assert rows[2].split() == [bobs["volume-id"], BOB_EMAIL, "bob", "3", bobs["volume-type"]["mount-point"],
                               bobs["creation-date"]]
    assert bobs["volume-type"]["mount-point"] == str(sandbox.root / "home" / "bob")
    # A read: no audit row.
    assert not [e for e in sandbox.ok("audit")["entries"] if e["action"] == "cloud-agent volume list"]


def test_volume_list_of_none(sandbox):
    assert sandbox.ok("volume", "list") == {"volumes": []}
    assert sandbox.run("volume", "list").stdout == "(none)\n"


# -- environment errors -----------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["account", "enable", "bob@example.org", "--username", "bob"],
    ["image", "add", "--name", "X", "--os-name", "d", "--os-major", "1", "--os-minor", "0",
     "--min-disk", "1", "--min-ram", "1"],
    ["image", "activate", UNKNOWN_UUID],
    ["flavor", "add", "--name", "s", "--memory", "1", "--disk", "1", "--vcpu", "1"],
    ["volume", "resize", UNKNOWN_UUID, "5"],
])
def test_commands_without_a_config_or_database_fail_cleanly(sandbox, tmp_path, args):
    proc = run_agent("--config", str(tmp_path / "missing.ini"), *args)
    assert proc.returncode == 1 and proc.stderr.startswith("error: config file not found")

    os.remove(sandbox.db_path)
    proc = sandbox.run(*args)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "cloud-agent init" in proc.stderr
    # Nothing was done in a database made up on the spot.
    assert not sandbox.db_path.exists()
