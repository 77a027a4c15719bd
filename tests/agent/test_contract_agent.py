"""Black-box tests of the published contract (the API spec, the README and docs/): the agent
(`cloud-agent`, as the README describes it).

The product is driven only from outside, through tests/fixtures/blackbox.py."""

import configparser
import json
import sqlite3
import subprocess
from pathlib import Path

from tests.fixtures.blackbox import (
    AGENT, FLAVOR_FIELDS, SUPERUSER_FIELDS, User, cc_ok, max_size_gb, ui_ok, unique, user_obj,
)


# ===========================================================================
# The agent (the admin command, README)
# ===========================================================================

def test_agent_init_check_and_env_config(env):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    doc = env.agent("init")  # an existing config: creates or migrates its database
    assert doc == {"database": cp.get("database", "path")} and Path(doc["database"]).exists()
    for use_env in (False, True):
        chk = env.agent("check", use_env=use_env)
        assert chk["ok"] is True and isinstance(chk["checks"], list) and chk["checks"]


def test_agent_user_grant_revoke_match_api(env):
    u = env.user()
    out = env.agent("user", "grant", u.email, "view_user_secret")
    assert "view_user_secret" in out["roles"]
    assert out == user_obj(env, env.admin, u)
    out = env.agent("user", "grant", u.email, "superuser")
    assert {"superuser", "view_user_secret"} <= set(out["roles"])
    assert SUPERUSER_FIELDS <= set(user_obj(env, u, u))  # now a superuser requester
    out = env.agent("user", "revoke", u.email, "superuser")
    assert "superuser" not in out["roles"] and out == user_obj(env, env.admin, u)
    assert not (SUPERUSER_FIELDS & set(user_obj(env, u, u)))


def test_agent_account_image_flavor_match_api(env):
    u = env.user(login=False)
    acct = env.enable(u)
    assert user_obj(env, env.admin, u)["system_accounts"] == [acct]
    fl = env.agent("flavor", "add", "--name", unique("fl-"), "--memory", "1024", "--disk", "4", "--vcpu", "2")
    assert set(fl) == FLAVOR_FIELDS
    assert cc_ok(env.call("GET", f"/v1/server-flavor/{fl['id']}", who=env.admin)) == [fl]
    img = env.agent("image", "add", "--name", unique("img-"), "--os-name", "alma", "--os-major", "9",
                    "--os-minor", "4", "--min-disk", "1", "--min-ram", "512", "--inactive")
    assert img["active"] is False and img["public"] is True
    assert cc_ok(env.call("GET", f"/v1/server-image/{img['id']}", who=env.admin)) == [img]


def test_agent_create_superuser(env):
    email = f"{unique('su-')}@example.org"
    out = env.agent("user", "create-superuser", "--email", email, "--password", "Second-admin-1")
    assert set(out) == {"userid", "api_key", "api_secret"}
    d = ui_ok(env.token(api_key=out["api_key"], api_secret=out["api_secret"]))
    assert d["userid"] == out["userid"]
    who = User(id=out["userid"], email=email, password="", token=d["token"])
    assert "superuser" in user_obj(env, who, who)["roles"]


def test_agent_backup(env, tmp_path):
    dest = tmp_path / "copy.db"
    assert env.agent("backup", str(dest)) == {"backup": str(dest)}
    con = sqlite3.connect(dest)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
    finally:
        con.close()


def test_agent_options_after_the_command_and_json_errors(env):
    cp = subprocess.run([str(AGENT), "check", "--config", str(env.config), "--json"], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["ok"] is True
    rc, doc = env.agent("account", "enable", f"{unique('nobody-')}@example.org", "--username", unique("n"), ok=False)
    assert rc != 0 and isinstance(doc, dict)


def test_agent_usage_error_under_json_is_one_document(env):
    u = env.user(login=False)
    cp = env.agent_raw("user", "grant", u.email, "wizard")
    assert cp.returncode != 0
    json.loads(cp.stdout)


def test_agent_refusals_are_one_json_document_and_change_nothing(env):
    u = env.user(account=True)
    vol = env.volume(u, size=2)
    top = max_size_gb(env)
    for size in ("0", str(top + 1)):
        rc, doc = env.agent("volume", "resize", vol["volume-id"], size, ok=False)
        assert rc != 0 and isinstance(doc, dict), doc
    assert cc_ok(env.call("GET", f"/v1/storage-volume/{vol['volume-id']}", who=u))[0]["volume-size"] == 2
    email = f"{unique('su-')}@example.org"
    rc, doc = env.agent("user", "create-superuser", "--email", email, ok=False)  # no terminal, no password
    assert rc != 0 and isinstance(doc, dict), doc
    rc, doc = env.agent("user", "create-superuser", "--email", email, "--password", "short-1", ok=False)
    assert rc != 0 and isinstance(doc, dict), doc
    assert ui_ok(env.call("GET", "/v1/user/search", who=env.admin, query={"email": email}))["users"] == []


def test_agent_backup_matches_the_live_database(env, tmp_path):
    cp = configparser.ConfigParser()
    cp.read(env.config)
    dest = tmp_path / "copy2.db"
    assert env.agent("backup", str(dest)) == {"backup": str(dest)}

    def shape(path):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        finally:
            con.close()

    live, copy = shape(cp.get("database", "path")), shape(dest)
    assert set(live) == set(copy)
    audit_like = {t for t in live if "audit" in t or "token" in t or "fail" in t}
    assert {t: n for t, n in live.items() if t not in audit_like} == \
        {t: n for t, n in copy.items() if t not in audit_like}
