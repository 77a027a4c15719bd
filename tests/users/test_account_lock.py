"""Deactivation locks the system account, reactivation unlocks it (issue 8, finding 9).

`active = 0` used to stop only the user's tokens: the cluster account kept working for
SSH and every other login. Now the account is locked (expired, password locked) in the
directory; data, groups and instances are kept.
"""

import pytest

from controller.users.accounts import enable_account
from controller.errors import HostError
from controller.maintenance.reconcile import reconcile
from host_adapters.accounts import sysroot as sysroot_mod
from host_adapters.accounts.local_directory import LocalDirectory
from tests.fixtures.api import enable, give_volume, make_caller


def update(client, admin, who, active):
    return client.simulate_post(f"/v1/user/update/{who.id}", headers=admin.headers, json={"active": active})


@pytest.fixture
def alice(cctx):
    caller = make_caller(cctx, "alice@example.org")
    enable(cctx, caller, username="alice")
    return caller


def test_deactivation_locks_the_account_and_keeps_data_groups_and_instances(client, cctx, adapters, admin,
                                                                            alice, catalog):
    give_volume(client, alice)
    r = client.simulate_post("/v1/group", headers=alice.headers, json={"group-name": "lab", "group-members": ["alice"]})
    assert r.status_code == 201
    r = client.simulate_post("/v1/server-instance", headers=alice.headers,
                             json={"server-image": catalog["public"]["id"], "server-flavor": catalog["small"]["id"]})
    assert r.status_code == 201
    instance = r.json["data"][0]

    r = update(client, admin, alice, 0)
    assert r.status_code == 200, r.text
    assert adapters.directory.get_account("alice").locked is True
    assert cctx.store.get_user(alice.id)["active"] == 0
    # Kept: the home, the group membership and the running instance.
    assert adapters.homes.inspect("alice").exists
    assert adapters.groups.get("lab") == ["alice"]
    assert adapters.hypervisor.status(instance["id"]) == "running"
    assert client.simulate_get("/v1/group", headers=alice.headers).status_code == 401

    r = update(client, admin, alice, 1)
    assert r.status_code == 200, r.text
    assert adapters.directory.get_account("alice").locked is False


def test_a_directory_that_cannot_lock_leaves_the_user_active(client, cctx, adapters, admin, alice):
    """All or nothing: a 503 and no change, so the admin knows to retry."""
    adapters.directory.fail_on["lock_account"] = HostError("LDAP modify failed")
    r = update(client, admin, alice, 0)
    assert r.status_code == 503 and "LDAP modify failed" in r.json["message"]
    assert cctx.store.get_user(alice.id)["active"] == 1
    assert adapters.directory.get_account("alice").locked is False


def test_a_failed_database_update_unlocks_again(client, cctx, adapters, admin, alice, monkeypatch):
    def broken(user_id, changes):
        raise HostError("database went away")

    monkeypatch.setattr(cctx.store, "update_user", broken)
    r = update(client, admin, alice, 0)
    assert r.status_code == 503
    assert adapters.directory.get_account("alice").locked is False


def test_users_without_an_account_and_other_updates_touch_no_directory(client, cctx, adapters, admin):
    bob = make_caller(cctx, "bob@example.org")
    adapters.directory.fail_on["get_account"] = AssertionError("the directory was asked")
    assert update(client, admin, bob, 0).status_code == 200
    r = client.simulate_post(f"/v1/user/update/{admin.id}", headers=admin.headers, json={"name": "Root"})
    assert r.status_code == 200


def test_an_inactive_users_new_account_is_born_locked(cctx, adapters):
    carol = make_caller(cctx, "carol@example.org", active=0)
    enable_account(cctx, carol.email, username="carol")
    assert adapters.directory.get_account("carol").locked is True


def test_reconcile_applies_a_deactivation_the_user_interface_made_alone(cctx, adapters, alice):
    """The user interface served without host adapters changes only the row: reconcile
    reports the account that should be locked, and --fix locks it (and the reverse)."""
    cctx.store.update_user(alice.id, {"active": 0})
    [drift] = [d for d in reconcile(cctx) if d["kind"] == "account-lock"]
    assert drift["target"] == "alice" and drift["fixable"] and "inactive" in drift["detail"]
    assert adapters.directory.get_account("alice").locked is False
    reconcile(cctx, fix=True)
    assert adapters.directory.get_account("alice").locked is True
    assert [d for d in reconcile(cctx) if d["kind"] == "account-lock"] == []
    cctx.store.update_user(alice.id, {"active": 1})
    reconcile(cctx, fix=True)
    assert adapters.directory.get_account("alice").locked is False


def test_reconcile_recreates_an_inactive_users_account_locked(cctx, adapters, alice):
    cctx.store.update_user(alice.id, {"active": 0})
    adapters.directory.delete_account("alice")
    reconcile(cctx, fix=True)
    assert adapters.directory.get_account("alice").locked is True


def test_the_user_interface_alone_deactivates_without_host_adapters(user_client, ctx, admin):
    bob = make_caller(ctx, "bob@example.org")
    ctx.store.insert_account({"user_id": bob.id, "username": "bob", "uuid": "00000000-0000-4000-8000-00000000000b",
                              "uid": 10000, "gid": 10000, "home": "/home/bob", "cloud_controller_id": 1,
                              "created_at_utc": "2026-01-01T00:00:00Z"})
    r = user_client.simulate_post(f"/v1/user/update/{bob.id}", headers=admin.headers, json={"active": 0})
    assert r.status_code == 200 and ctx.store.get_user(bob.id)["active"] == 0


@pytest.mark.real_commands
def test_deactivation_through_the_api_locks_the_real_account(client, cctx, admin, sysroot):
    """The real usermod in a system root: the shadow entry is expired and its password locked."""
    cctx.adapters.directory = LocalDirectory(sysroot)
    dave = make_caller(cctx, "dave@example.org")
    enable_account(cctx, dave.email, username="dave")
    assert update(client, admin, dave, 0).status_code == 200
    shadow = sysroot_mod.find_shadow(sysroot, "dave")
    assert shadow.expire == 1 and shadow.password.startswith("!")
    assert update(client, admin, dave, 1).status_code == 200
    assert sysroot_mod.find_shadow(sysroot, "dave").expire is None
