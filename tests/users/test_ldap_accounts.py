"""System accounts in LDAP through the agent and the user interface, against a real slapd."""

import json
import subprocess

import pytest
from falcon import testing

from controller.config import load_config, write_config
from controller.context import build_context
from host_adapters.factory import build_adapters
from tests.fixtures.agent import AGENT, run_agent
from tests.fixtures.api import config_values_for

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

@pytest.fixture
def ldap_config(tmp_path, ldap_tree, sysroot):
    server = ldap_tree.server
    values = config_values_for(tmp_path)
    values["unix"]["root"] = sysroot
    values["directory"] = {
        "backend": "ldap", "uri": server.uri, "base_dn": ldap_tree.base_dn, "bind_dn": server.bind_dn,
        "bind_password_file": server.password_file, "uid_min": 40000, "uid_max": 40100,
    }
    if server.ca_file:
        values["directory"]["tls_ca_file"] = server.ca_file
    path = str(tmp_path / "controller.ini")
    write_config(values, path)
    (tmp_path / "home").mkdir(exist_ok=True)
    subprocess.run([AGENT, "--config", path, "init"], check=True, capture_output=True)
    return path, ldap_tree


def agent(path, *args, check=True):
    proc = run_agent("--config", path, "--json", *args)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def ldapsearch(tree, flt):
    server = tree.server
    out = subprocess.run(
        ["ldapsearch", "-x", "-LLL", "-o", "ldif-wrap=no", "-H", server.uri, "-D", server.bind_dn, "-y", server.password_file,
         "-b", tree.base_dn, flt, "uidNumber", "gidNumber", "homeDirectory"],
        capture_output=True, text=True, check=True,
    ).stdout
    return out


def test_enable_two_accounts_search_by_username_and_disable(ldap_config):
    path, tree = ldap_config
    admin = json.loads(agent(path, "user", "create-superuser", "--email", "root@example.org",
                             "--password", "Root-pass-2026").stdout)
    config = load_config(path)
    ctx = build_context(config, adapters=build_adapters(config))
    from controller.users.users import insert_user

    for email in ("ann@example.org", "ben@example.org"):
        insert_user(ctx, email=email, password="User-pass-2026!")
    ann = json.loads(agent(path, "account", "enable", "ann@example.org", "--username", "ann").stdout)
    ben = json.loads(agent(path, "account", "enable", "ben@example.org", "--username", "ben").stdout)
    assert set(ann) == {"id", "username", "uuid", "cloud_controller_id"} and ann["username"] == "ann"

    ann_entry, ben_entry = ldapsearch(tree, "(uid=ann)"), ldapsearch(tree, "(uid=ben)")
    uid_ann = int(ann_entry.split("uidNumber: ")[1].split()[0])
    uid_ben = int(ben_entry.split("uidNumber: ")[1].split()[0])
    assert uid_ann != uid_ben and 40000 <= min(uid_ann, uid_ben) <= max(uid_ann, uid_ben) <= 40100
    assert f"homeDirectory: {config.volumes.home_root}/ann" in ann_entry
    assert f"gidNumber: {uid_ann}" in ldapsearch(tree, "(&(objectClass=posixGroup)(cn=ann))")

    # The user interface finds users by their directory-backed username.
    from api.app import create_app

    client = testing.TestClient(create_app(ctx))
    token = client.simulate_post("/v1/auth/token", json={"api_key": admin["api_key"],
                                                         "api_secret": admin["api_secret"]}).json["data"]["token"]
    headers = {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": admin["userid"]}
    r = client.simulate_get("/v1/user/search", params={"username": "ben"}, headers=headers)
    assert r.status_code == 200 and r.json["data"]["total"] == 1
    [user] = r.json["data"]["users"]
    assert user["email"] == "ben@example.org"
    assert user["system_accounts"] == [ben]

    # A second account for a user, or a taken username, is refused without touching LDAP.
    assert agent(path, "account", "enable", "ann@example.org", "--username", "ann2", check=False).returncode == 1
    assert ldapsearch(tree, "(uid=ann2)") == ""

    gone = agent(path, "account", "disable", "ben@example.org", "--yes")
    assert json.loads(gone.stdout)["username"] == "ben"
    assert ldapsearch(tree, "(uid=ben)") == "" and ldapsearch(tree, "(cn=ben)") == ""
    assert ldapsearch(tree, "(uid=ann)") != ""
    r = client.simulate_get("/v1/user/search", params={"username": "ben"}, headers=headers)
    assert r.json["data"] == {"total": 0, "users": []}


def test_directory_down_is_a_clean_error(tmp_path, sysroot):
    values = config_values_for(tmp_path)
    values["unix"]["root"] = sysroot
    pw = tmp_path / "pw"
    pw.write_text("x")
    values["directory"] = {"backend": "ldap", "uri": "ldap://127.0.0.1:9/", "base_dn": "dc=x,dc=test",
                           "bind_dn": "cn=admin,dc=x,dc=test", "bind_password_file": str(pw), "timeout": 2}
    (tmp_path / "home").mkdir()
    path = str(tmp_path / "controller.ini")
    write_config(values, path)
    subprocess.run([AGENT, "--config", path, "init"], check=True, capture_output=True)
    check = agent(path, "check", check=False)
    assert check.returncode == 1
    doc = json.loads(check.stdout)
    # The API's groups live in the directory too ([groups] backend follows it).
    assert doc["ok"] is False and [c["name"] for c in doc["checks"] if not c["ok"]] == ["directory", "system_root"]
    proc = agent(path, "account", "enable", "nobody@example.org", "--username", "nobody", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def add_account_by_hand(tree, name: str, number: int) -> None:
    """A posixAccount another tool wrote below the tree (a service account of the site's)."""
    import ldap

    server = tree.server
    conn = ldap.initialize(server.uri)
    conn.timeout = 10
    try:
        conn.simple_bind_s(server.bind_dn, server.password)
        conn.add_s(f"uid={name},ou=people,{tree.base_dn}", [
            ("objectClass", [b"account", b"posixAccount"]), ("uid", [name.encode()]), ("cn", [name.encode()]),
            ("uidNumber", [str(number).encode()]), ("gidNumber", [str(number).encode()]),
            ("homeDirectory", [f"/var/lib/{name}".encode()])])
    finally:
        conn.unbind_s()


def test_enable_refuses_system_account_names(ldap_config):
    """Reserved names, a directory account below uid_min and an account of the head node's own
    files below uid_min are system account names; a directory account above uid_min is taken."""
    path, tree = ldap_config
    config = load_config(path)
    ctx = build_context(config, adapters=build_adapters(config))
    from controller.users.users import insert_user

    insert_user(ctx, email="ann@example.org", password="User-pass-2026!")
    add_account_by_hand(tree, "ldapsvc", 500)
    add_account_by_hand(tree, "olduser", 40050)
    passwd = config.unix.root + "/etc/passwd"
    with open(passwd, "a") as f:
        f.write("localsvc:x:999:999:a local service:/nonexistent:/usr/sbin/nologin\n")
    before = ldapsearch(tree, "(objectClass=*)")

    def refusal(username):
        proc = agent(path, "account", "enable", "ann@example.org", "--username", username, check=False)
        assert proc.returncode == 1, proc.stdout
        return json.loads(proc.stdout)["error"]

    for username in ("root", "daemon", "bin", "sys", "adm", "nobody", "sshd", "admin", "openldap", "nslcd",
                     "ldapsvc", "localsvc"):
        assert refusal(username) == f"{username} is a system account name; choose another"
    assert refusal("olduser").startswith("olduser is already taken in the directory")
    assert ldapsearch(tree, "(objectClass=*)") == before
    assert ctx.store.list_accounts() == []
    # A name nobody has is fine.
    made = json.loads(agent(path, "account", "enable", "ann@example.org", "--username", "ann").stdout)
    assert made["username"] == "ann"
