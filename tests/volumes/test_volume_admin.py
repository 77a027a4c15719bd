"""The admin's home volumes (issue 41): `volume list` and `volume resize` through the service on
fake adapters (what the home uses, all or nothing), then through the real `cloud-agent` on a
sandbox whose homes are btrfs subvolumes, where the quota backend tells what a home uses."""

import configparser
import os
import sqlite3
import subprocess

import pytest

from controller.errors import Conflict, InvalidInput, NotFound
from controller.storage import volumes as volume_service
from host_adapters.accounts.directory import PosixAccount
from tests.agent.test_agent_controller import ADMIN_EMAIL, Sandbox, sandbox, sandbox_template  # noqa: F401
from tests.fixtures.api import enable, give_volume, make_caller

GIB = 1 << 30


# -- the service, on fake adapters --------------------------------------------------------------
@pytest.fixture
def alice(cctx, client):
    caller = make_caller(cctx, "alice@example.org")
    account = enable(cctx, caller, "alice")
    return caller, account, give_volume(client, caller, size=4)


def test_list_names_owner_account_size_usage_mount_point_and_date(cctx, client, alice):
    caller, account, vol = alice
    cctx.adapters.homes.homes["alice"].used_bytes = 3 * GIB // 2
    bob = make_caller(cctx, "bob@example.org")
    enable(cctx, bob, "bob")
    bobs = give_volume(client, bob, size=2)
    assert volume_service.list_all_volumes(cctx) == [
        dict(vol, owner="alice@example.org", username="alice", **{"used-bytes": 3 * GIB // 2}),
        dict(bobs, owner="bob@example.org", username="bob", **{"used-bytes": 0}),
    ]


def test_resize_by_email_or_id_records_the_size_and_sets_the_limit(cctx, alice):
    caller, account, vol = alice
    homes = cctx.adapters.homes
    assert volume_service.resize_volume(cctx, "ALICE@example.org", 9) == dict(vol, **{"volume-size": 9})
    assert homes.homes["alice"].size_gb == 9 and cctx.store.volume_of_user(caller.id)["size_gb"] == 9
    assert volume_service.resize_volume(cctx, vol["volume-id"], 1)["volume-size"] == 1
    assert homes.homes["alice"].size_gb == 1 and cctx.store.volume_of_user(caller.id)["size_gb"] == 1


def test_shrinking_below_what_the_home_uses_is_refused_and_changes_nothing(cctx, alice):
    caller, account, vol = alice
    homes = cctx.adapters.homes
    homes.homes["alice"].used_bytes = 3 * GIB + 1
    with pytest.raises(Conflict, match=r"^the home volume of alice uses 3\.1 GB, more than 3 GB: it cannot shrink"):
        volume_service.resize_volume(cctx, vol["volume-id"], 3)
    assert homes.homes["alice"].size_gb == 4 and cctx.store.volume_of_user(caller.id)["size_gb"] == 4
    # Down to what it holds, rounded up, is fine.
    assert volume_service.resize_volume(cctx, vol["volume-id"], 4)["volume-size"] == 4


def test_over_the_cap_names_the_setting(cctx, alice):
    caller, account, vol = alice
    top = cctx.config.volumes.max_size_gb
    with pytest.raises(InvalidInput) as e:
        volume_service.resize_volume(cctx, vol["volume-id"], top + 1)
    assert e.value.message == f"volume-size {top + 1} GB is too large: at most {top} GB ([volumes] max_size_gb)"
    assert cctx.adapters.homes.homes["alice"].size_gb == 4


def test_a_failed_record_puts_the_old_limit_back(cctx, alice, monkeypatch):
    caller, account, vol = alice

    def locked(volume_id, size_gb):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(cctx.store, "set_volume_size", locked)
    with pytest.raises(sqlite3.OperationalError):
        volume_service.resize_volume(cctx, vol["volume-id"], 7)
    assert cctx.adapters.homes.homes["alice"].size_gb == 4
    monkeypatch.undo()
    assert cctx.store.volume_of_user(caller.id)["size_gb"] == 4


def test_a_volume_deleted_meanwhile_is_refused_and_its_limit_put_back(cctx, alice, monkeypatch):
    caller, account, vol = alice
    monkeypatch.setattr(cctx.store, "set_volume_size", lambda volume_id, size_gb: False)
    with pytest.raises(Conflict, match="is being deleted"):
        volume_service.resize_volume(cctx, vol["volume-id"], 7)
    assert cctx.adapters.homes.homes["alice"].size_gb == 4


def test_a_failed_limit_changes_no_record(cctx, alice):
    caller, account, vol = alice
    cctx.adapters.homes.fail_on["resize"] = OSError("quota tool gone")
    with pytest.raises(OSError):
        volume_service.resize_volume(cctx, vol["volume-id"], 7)
    assert cctx.store.volume_of_user(caller.id)["size_gb"] == 4


def test_a_user_without_a_volume_is_named(cctx, alice):
    make_caller(cctx, "carol@example.org")
    with pytest.raises(NotFound, match="^carol@example.org has no storage volume$"):
        volume_service.resize_volume(cctx, "carol@example.org", 2)


# -- account enable refuses the system's own names (fake directory) ------------------------------
@pytest.mark.parametrize("username", ["root", "daemon", "nobody", "sudo", "admin", "systemd-timesync"])
def test_reserved_names_are_refused_before_the_directory_is_touched(cctx, username):
    from controller.users.accounts import enable_account

    caller = make_caller(cctx, "dan@example.org")
    cctx.adapters.directory.fail_on["create_account"] = AssertionError("create_account was called")
    with pytest.raises(InvalidInput) as e:
        enable_account(cctx, caller.email, username=username)
    assert e.value.message == f"{username} is a system account name; choose another"
    assert cctx.store.account_of_user(caller.id, cctx.config.controller_id) is None


def test_a_name_the_directory_holds_below_the_first_uid_is_refused(cctx):
    from controller.users.accounts import enable_account

    directory = cctx.adapters.directory
    directory.accounts["svcfoo"] = PosixAccount("svcfoo", 990, 990, "/nonexistent", "/usr/sbin/nologin")
    directory.accounts["human"] = PosixAccount("human", 20000, 20000, "/home/human", "/bin/bash")
    caller = make_caller(cctx, "dan@example.org")
    with pytest.raises(InvalidInput, match="^svcfoo is a system account name; choose another$"):
        enable_account(cctx, caller.email, username="svcfoo")
    with pytest.raises(Conflict, match="already in use"):
        enable_account(cctx, caller.email, username="human")
    assert set(directory.accounts) == {"svcfoo", "human"}


def test_a_site_refused_group_name_is_refused_as_a_username(cctx, monkeypatch):
    """`[groups] refused_names` counts: the account's private group would take the name."""
    import dataclasses

    from controller.users.accounts import enable_account

    groups = dataclasses.replace(cctx.config.groups, refused_names=("labadmin",))
    monkeypatch.setattr(cctx, "config", dataclasses.replace(cctx.config, groups=groups))
    caller = make_caller(cctx, "dan@example.org")
    with pytest.raises(InvalidInput, match="^labadmin is a system account name; choose another$"):
        enable_account(cctx, caller.email, username="labadmin")


# -- the real cloud-agent on a sandbox with btrfs homes ------------------------------------------
def btrfs_sandbox(sandbox: Sandbox, home_root: str) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(sandbox.config)
    parser["volumes"]["home_root"] = home_root
    parser["volumes"]["quota_backend"] = "btrfs"
    with open(sandbox.config, "w") as f:
        parser.write(f)


def qgroup_limit(path: str) -> int:
    subvolume = subprocess.run(["btrfs", "inspect-internal", "rootid", path], capture_output=True, text=True,
                               check=True, timeout=60).stdout.strip()
    out = subprocess.run(["btrfs", "qgroup", "show", "-re", "--raw", path], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    row = next(line.split() for line in out.splitlines() if line.startswith(f"0/{subvolume} "))
    return int(row[3])


def sync(path: str) -> None:
    # qgroup figures are those of the last committed transaction.
    subprocess.run(["btrfs", "filesystem", "sync", path], check=True, capture_output=True, timeout=60)


@pytest.mark.integration
@pytest.mark.real_commands
def test_agent_lists_usage_and_refuses_to_shrink_a_btrfs_home_below_it(sandbox, btrfs_home_root):
    btrfs_sandbox(sandbox, btrfs_home_root)
    sandbox.ok("account", "enable", ADMIN_EMAIL, "--username", "ccadmin")
    api = sandbox.api()
    vol = api.create_volume(api.headers, size=3)
    home = os.path.join(btrfs_home_root, "ccadmin")
    assert vol["volume-type"]["mount-point"] == home and qgroup_limit(home) == 3 * GIB

    # 1.5 GiB written in the home (real blocks: the qgroup counts them).
    with open(os.path.join(home, "data"), "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(1536):
            f.write(chunk)
    sync(home)
    [listed] = sandbox.ok("volume", "list")["volumes"]
    assert 3 * GIB // 2 <= listed["used-bytes"] < 3 * GIB // 2 + (64 << 20)
    assert listed == dict(vol, owner=ADMIN_EMAIL, username="ccadmin", **{"used-bytes": listed["used-bytes"]})
    rows = sandbox.run("volume", "list").stdout.splitlines()
    assert rows[0].split() == ["ID", "OWNER", "USERNAME", "SIZE-GB", "USED-GB", "MOUNT-POINT", "CREATED"]
    assert rows[1].split()[:6] == [vol["volume-id"], ADMIN_EMAIL, "ccadmin", "3", "1.5", home]

    # Shrinking below what it holds: refused, limit and record unchanged.
    message = sandbox.error("volume", "resize", ADMIN_EMAIL, "1")
    assert message.startswith("error: the home volume of ccadmin uses 1.") and "more than 1 GB" in message
    assert qgroup_limit(home) == 3 * GIB and sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 3
    # Growing, and shrinking to what it holds, are fine.
    assert sandbox.ok("volume", "resize", ADMIN_EMAIL, "5")["volume-size"] == 5
    assert qgroup_limit(home) == 5 * GIB
    assert sandbox.ok("volume", "resize", vol["volume-id"], "2")["volume-size"] == 2
    assert qgroup_limit(home) == 2 * GIB and sandbox.rows("SELECT size_gb FROM volumes")[0]["size_gb"] == 2
    # Once the data is gone, the smallest size.
    os.remove(os.path.join(home, "data"))
    sync(home)
    assert sandbox.ok("volume", "resize", ADMIN_EMAIL, "1")["volume-size"] == 1
    assert qgroup_limit(home) == GIB
