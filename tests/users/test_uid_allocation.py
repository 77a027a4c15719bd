"""uids are never reused (issue 8, finding 7): controllers racing as separate processes
against a real slapd, and against one system root with the real useradd, never hand out a
number twice, not even one of an account removed meanwhile."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host_adapters.accounts.directory import FakeDirectory

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3
PER_PROCESS = 8

# One controller: creates PER_PROCESS accounts once the start file appears, removing every
# other one at once (a disabled account), and prints every uid it was given.
_WORKER = r"""
import json, os, sys, time
from host_adapters.accounts.ldap_directory import LdapDirectory
from host_adapters.accounts.local_directory import LocalDirectory

spec = json.loads(sys.argv[1])
if spec["kind"] == "ldap":
    d = LdapDirectory(uri=spec["uri"], base_dn=spec["base_dn"], bind_dn=spec["bind_dn"],
                      bind_password=spec["password"], uid_min=spec["uid_min"], uid_max=spec["uid_max"], timeout=30)
else:
    d = LocalDirectory(spec["root"])
while not os.path.exists(spec["start"]):
    time.sleep(0.001)
given = []
for k in range(spec["count"]):
    name = f"{spec['prefix']}{k}"
    given.append(d.create_account(name, home=f"/home/{name}").uid)
    if k % 2:
        d.delete_account(name)
print(json.dumps(given))
"""


def race(tmp_path, spec: dict) -> list[list[int]]:
    """Start PROCESSES workers, release them at once, and return the uids each was given."""
    start = tmp_path / "start"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER,
                          json.dumps(dict(spec, prefix=f"p{i}x", count=PER_PROCESS, start=str(start)))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        for i in range(PROCESSES)
    ]
    time.sleep(1.0)  # every interpreter is up and polling for the start file
    start.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def assert_never_reused(results: list[list[int]], low: int) -> list[int]:
    every = sorted(uid for given in results for uid in given)
    assert len(every) == PROCESSES * PER_PROCESS
    assert len(set(every)) == len(every), f"a uid was handed out twice: {every}"
    assert every[0] >= low
    return every


@pytest.mark.integration
def test_ldap_controllers_in_separate_processes_never_share_or_reuse_a_uid(ldap_tree, tmp_path):
    from tests.users.test_ldap_directory import UID_MIN, make

    server = ldap_tree.server
    results = race(tmp_path, {"kind": "ldap", "uri": server.uri, "base_dn": ldap_tree.base_dn,
                              "bind_dn": server.bind_dn, "password": server.password,
                              "uid_min": UID_MIN, "uid_max": UID_MIN + 99})
    every = assert_never_reused(results, UID_MIN)
    # Each process's own numbers only grow, and the removed accounts' numbers stay spent.
    for given in results:
        assert given == sorted(given)
    directory = make(server, ldap_tree.base_dn)
    try:
        assert directory.create_account("late", home="/home/late").uid == every[-1] + 1
    finally:
        directory._drop()


@pytest.mark.real_commands
def test_local_controllers_in_separate_processes_never_share_or_reuse_a_uid(sysroot, tmp_path):
    """The server and `cloud-agent` both run useradd in one system root: the flock'ed mark
    keeps them apart, and a removed account's uid is not taken again."""
    from host_adapters.accounts.local_directory import LocalDirectory

    results = race(tmp_path, {"kind": "local", "root": sysroot})
    every = assert_never_reused(results, 10000)
    assert LocalDirectory(sysroot).create_account("late", home="/home/late").uid == every[-1] + 1


def test_the_fake_never_reuses_a_uid_either():
    d = FakeDirectory()
    a = d.create_account("alice", home="/h/a")
    d.delete_account("alice")
    assert d.create_account("bob", home="/h/b").uid == a.uid + 1
    assert d.create_account("carol", home="/h/c", uid=12000).uid == 12000
    assert d.create_account("dave", home="/h/d").uid == 12001


# -- reconcile never repairs a home across a uid mismatch -----------------------------------------
def test_reconcile_never_chowns_a_home_back_to_a_recorded_uid_the_directory_no_longer_gives(
        client, cctx, adapters):
    """The directory gives alice another uid now (an admin changed it, or the account was
    made again): the recorded uid may be someone else's. The home's owner, quota and
    existence are reported, not repaired, while the uids differ."""
    from dataclasses import replace

    from controller.maintenance.reconcile import reconcile
    from tests.fixtures.api import enable, give_volume, make_caller

    alice = make_caller(cctx, "alice@example.org")
    account = enable(cctx, alice, username="alice")
    give_volume(client, alice)
    moved = replace(adapters.directory.accounts["alice"], uid=account["uid"] + 500)
    adapters.directory.accounts["alice"] = moved
    home = adapters.homes.homes["alice"]
    home.uid, home.size_gb = moved.uid, 7  # the admin chowned it to the new uid; a quota drifted

    drift = {d["kind"]: d for d in reconcile(cctx, fix=True)}
    assert drift["account-uid"]["fixable"] is False
    for kind in ("home-owner", "home-quota"):
        assert drift[kind]["fixable"] is False and drift[kind]["fixed"] is False, drift[kind]
        assert f"the directory gives alice uid {moved.uid}, the record says {account['uid']}" in drift[kind]["detail"]
    assert (home.uid, home.size_gb) == (moved.uid, 7)  # untouched

    del adapters.homes.homes["alice"]
    drift = {d["kind"]: d for d in reconcile(cctx, fix=True)}
    assert drift["home-missing"]["fixable"] is False and "alice" not in adapters.homes.homes

    # Once the directory agrees with the record again, the same drift is repaired.
    adapters.directory.accounts["alice"] = replace(moved, uid=account["uid"])
    drift = {d["kind"]: d for d in reconcile(cctx, fix=True)}
    assert drift["home-missing"]["fixed"] is True
    assert adapters.homes.homes["alice"].uid == account["uid"]


def test_reconcile_does_not_repair_a_home_whose_account_could_not_be_read(client, cctx, adapters):
    from controller.errors import HostUnavailable
    from controller.maintenance.reconcile import reconcile
    from tests.fixtures.api import enable, give_volume, make_caller

    alice = make_caller(cctx, "alice@example.org")
    enable(cctx, alice, username="alice")
    give_volume(client, alice)
    adapters.homes.homes["alice"].mode = 0o755
    adapters.directory.fail_on["get_account"] = HostUnavailable("LDAP down")
    drift = {d["kind"]: d for d in reconcile(cctx, fix=True)}
    assert drift["check-failed"]["target"] == "alice"
    assert drift["home-owner"]["fixable"] is False and adapters.homes.homes["alice"].mode == 0o755
