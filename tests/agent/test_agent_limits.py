"""cloud-agent user limits, flavor add --private, flavor grant, and bounded names, as real subprocesses
on a sandbox (see test_agent_controller.py for the harness)."""

import pytest

from tests.agent.test_agent_controller import (  # noqa: F401 - fixtures
    ADMIN_EMAIL,
    BOB_EMAIL,
    UNKNOWN_UUID,
    add_image,
    api,
    bob,
    sandbox,
    sandbox_template,
)

SANDBOX_LIMITS = {"instances": 10000, "vcpus": 20000, "memory_mb": 20480000, "groups": 1000, "managed_users": 1000}


def test_user_limits_prints_the_limits_in_force(sandbox, bob):
    out = sandbox.ok("user", "limits", BOB_EMAIL)
    assert out == {"userid": bob, "email": BOB_EMAIL, **SANDBOX_LIMITS}
    assert sandbox.rows("SELECT * FROM user_limits") == []
    # Without --json: one line per limit, saying where it comes from and what the user holds.
    proc = sandbox.run("user", "limits", BOB_EMAIL)
    assert proc.returncode == 0 and "instances" in proc.stdout and "(default; holds 0)" in proc.stdout


def test_user_limits_sets_overrides_by_email_or_userid(sandbox, bob):
    out = sandbox.ok("user", "limits", BOB_EMAIL, "--instances", "3", "--memory-mb", "4096")
    assert out == {"userid": bob, "email": BOB_EMAIL, **dict(SANDBOX_LIMITS, instances=3, memory_mb=4096)}
    assert sandbox.rows("SELECT * FROM user_limits") == [
        {"user_id": bob, "instances": 3, "vcpus": None, "memory_mb": 4096, "groups": None, "managed_users": None}]
    # The same user by id; later options keep earlier overrides.
    out = sandbox.ok("user", "limits", "--userid", bob.upper(), "--vcpus", "8", "--groups", "0",
                     "--managed-users", "-1")
    assert out == {"userid": bob, "email": BOB_EMAIL, "instances": 3, "vcpus": 8, "memory_mb": 4096, "groups": 0,
                   "managed_users": -1}
    assert sandbox.ok("user", "limits", BOB_EMAIL) == out
    # --reset goes back to the config's defaults.
    assert sandbox.ok("user", "limits", BOB_EMAIL, "--reset") == {"userid": bob, "email": BOB_EMAIL,
                                                                    **SANDBOX_LIMITS}
    assert sandbox.rows("SELECT * FROM user_limits") == []
    audit = sandbox.rows("SELECT action, target FROM audit WHERE action = 'cloud-agent user limits'")
    assert {"action": "cloud-agent user limits", "target": BOB_EMAIL} in audit


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "give the user's EMAIL or --userid UUID"),
    ([BOB_EMAIL, "--userid", UNKNOWN_UUID], 2, "give the user's EMAIL or --userid UUID"),
    (["nobody@example.org", "--instances", "1"], 1, "no user with email nobody@example.org"),
    (["--userid", UNKNOWN_UUID], 1, f"user {UNKNOWN_UUID} not found"),
    ([BOB_EMAIL, "--instances", "-2"], 2, "-2 is not in the range x>=-1"),
    ([BOB_EMAIL, "--vcpus", "many"], 2, "'many' is not a valid integer"),
])
def test_user_limits_errors_change_nothing(sandbox, args, code, message):
    proc = sandbox.run("--json", "user", "limits", *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert sandbox.rows("SELECT * FROM user_limits") == []


def test_an_override_set_by_the_agent_binds_the_api(sandbox, api):
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    api.create_volume(api.headers)
    image = add_image(sandbox)
    flavor = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
    sandbox.ok("user", "limits", ADMIN_EMAIL, "--instances", "1")
    body = {"server-image": image["id"], "server-flavor": flavor["id"]}
    r = api.client.simulate_post("/v1/server-instance", headers=api.headers, json=body)
    assert r.status_code == 201, r.text
    r = api.client.simulate_post("/v1/server-instance", headers=api.headers, json=body)
    assert r.status_code == 409 and r.json == {"data": [], "msg": "limit reached: instances (1 per user)",
                                               "success": False}
    assert len(sandbox.rows("SELECT id FROM instances")) == 1


def test_private_flavor_add_and_grant(sandbox, api, bob):
    out = sandbox.ok("flavor", "add", "--name", "gpu", "--memory", "1024", "--disk", "10", "--vcpu", "2",
                     "--private")
    # The same object as the API gives a superuser: no field says "private".
    assert out == api.get(f"/v1/server-flavor/{out['id']}")
    assert sandbox.rows("SELECT public FROM flavors") == [{"public": 0}]
    assert sandbox.ok("flavor", "grant", out["id"], BOB_EMAIL) == out
    assert sandbox.rows("SELECT * FROM flavor_access") == [{"flavor_id": int(out["id"]), "user_id": bob}]
    public = sandbox.ok("flavor", "add", "--name", "small", "--memory", "512", "--disk", "2", "--vcpu", "1")
    assert "is public" in sandbox.error("flavor", "grant", public["id"], BOB_EMAIL)
    assert "no server-flavor with id or name '77'" in sandbox.error("flavor", "grant", "77", BOB_EMAIL)
    assert len(sandbox.rows("SELECT * FROM flavor_access")) == 1


def test_flavor_grant_takes_ascii_digits_only(sandbox, bob):
    # Issue 16, finding 14: str.isdigit() passed "\u00b9" (a traceback from int()) and read
    # "\u0661" as flavor 1.
    out = sandbox.ok("flavor", "add", "--name", "gpu", "--memory", "1024", "--disk", "10", "--vcpu", "2",
                     "--private")
    assert out["id"] == "1"
    for value in ("\u00b9", "\u0661", "\uff11", "1" * 5000):
        assert "no server-flavor with id or name" in sandbox.error("flavor", "grant", value, BOB_EMAIL)
    assert sandbox.rows("SELECT * FROM flavor_access") == []


@pytest.mark.parametrize("args, message", [
    (["flavor", "add", "--name", "f" * 256, "--memory", "512", "--disk", "2", "--vcpu", "1"],
     "flavor name is too long: at most 255 characters"),
    (["image", "add", "--name", "i" * 256, "--os-name", "debian", "--os-major", "12", "--os-minor", "7",
      "--min-disk", "1", "--min-ram", "256"], "image name is too long: at most 255 characters"),
    (["image", "add", "--name", "ok", "--os-name", "d" * 65, "--os-major", "12", "--os-minor", "7",
      "--min-disk", "1", "--min-ram", "256"], "os-name is too long: at most 64 characters"),
    (["user", "create-superuser", "--email", "root@example.org", "--password", "Admin-pass-2026",
      "--name", "n" * 256], "name is too long: at most 255 characters"),
])
def test_agent_names_are_bounded(sandbox, args, message):
    before = sandbox.snapshot()
    assert message in sandbox.error(*args)
    assert sandbox.snapshot() == before
