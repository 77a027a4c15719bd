"""LdapUnixGroups against a private slapd (tests/fixtures/slapd.py): the UNIX groups
contract of the local backend, and the entries as ldapsearch sees them."""

import ldap
import pytest

from controller.config import config_from_dict
from controller.errors import Conflict, HostError, HostUnavailable, InvalidInput
from host_adapters.factory import build_groups
from host_adapters.accounts.ldap_groups import LdapUnixGroups
from host_adapters.accounts.local_groups import CommandUnixGroups
from host_adapters.accounts.unix_groups import UnixGroups
from tests.groups.test_unix_groups import UnixGroupsContract, public_methods
from tests.users import test_ldap_directory as ldap_directory_tests
from tests.users.test_ldap_directory import directory, ldapsearch, make  # noqa: F401 (directory: a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.real_commands]

GID_RANGE = (70000, 70004)


def group_entry(tree, name: str) -> dict | None:
    """The posixGroup cn=name below the tree as ldapsearch prints it, or None."""
    found = ldapsearch(tree.server, tree.base_dn, f"(&(objectClass=posixGroup)(cn={name}))",
                       "objectClass", "gidNumber", "memberUid")
    assert len(found) <= 1, found
    return next(iter(found.values()), None)


class TestLdapUnixGroups(UnixGroupsContract):
    @pytest.fixture
    def groups(self, directory):
        return LdapUnixGroups(directory, gid_range=GID_RANGE)

    @pytest.fixture
    def add_account(self, directory):
        return lambda name: directory.create_account(name, home=f"/home/{name}")

    @pytest.fixture
    def host_members(self, ldap_tree):
        def members(name):
            entry = group_entry(ldap_tree, name)
            return None if entry is None else entry.get("memberUid", [])
        return members

    # Bad names are refused before any LDAP request.
    no_commands = ldap_directory_tests.TestLdapDirectory.no_commands

    def test_entry_is_a_posix_group_with_a_gid_from_the_range(self, groups, add_account, ldap_tree):
        add_account("alice")
        groups.create("devs", members=["alice"])
        entry = group_entry(ldap_tree, "devs")
        assert sorted(entry["objectClass"]) == ["posixGroup", "top"]
        assert entry["gidNumber"] == ["70000"] and entry["memberUid"] == ["alice"]
        assert groups.gid("devs") == 70000
        dn = f"cn=devs,ou=groups,{ldap_tree.base_dn}"
        assert dn in ldapsearch(ldap_tree.server, ldap_tree.base_dn, "(cn=devs)", "cn")
        groups.set_members("devs", [])
        assert "memberUid" not in group_entry(ldap_tree, "devs")


def test_gids_skip_every_number_a_posix_group_holds_and_stop_at_the_range(directory, ldap_tree):
    groups = LdapUnixGroups(directory, gid_range=GID_RANGE)
    # A group another tool wrote elsewhere in the directory holds 70001.
    with directory.entries.session("test") as entries:
        entries.add(f"cn=other,ou=people,{ldap_tree.base_dn}",
                      {"objectClass": [b"top", b"posixGroup"], "cn": [b"other"], "gidNumber": [b"70001"]})
    for name in ("g0", "g2", "g3", "g4"):
        groups.create(name)
    assert {n: groups.gid(n) for n in ("g0", "g2", "g3", "g4")} == {"g0": 70000, "g2": 70002, "g3": 70003,
                                                                    "g4": 70004}
    with pytest.raises(HostError, match="no free group number left in 70000-70004"):
        groups.create("g5")
    assert group_entry(ldap_tree, "g5") is None
    groups.delete("g2")
    groups.create("g5")  # a freed number is used again, as groupadd does
    assert groups.gid("g5") == 70002
    with pytest.raises(Conflict, match="other"):
        groups.create("other")  # a posixGroup of that name anywhere in the directory


def test_members_are_the_directorys_accounts_not_the_head_nodes(directory, ldap_tree):
    """The issue's case: root (known to this machine's NSS) is no directory account, and a
    directory account this machine's NSS does not know is a fine member."""
    groups = LdapUnixGroups(directory, gid_range=GID_RANGE)
    directory.create_account("ldaponly", home="/home/ldaponly")
    with pytest.raises(InvalidInput, match="no such user: root"):
        groups.create("devs", members=["ldaponly", "root"])
    assert group_entry(ldap_tree, "devs") is None
    groups.create("devs", members=["ldaponly"])
    assert group_entry(ldap_tree, "devs")["memberUid"] == ["ldaponly"]


def test_a_configured_base_holds_the_groups(directory, ldap_tree):
    base = f"ou=apigroups,{ldap_tree.base_dn}"
    with directory.entries.session("test") as entries:
        entries.add(base, {"objectClass": [b"organizationalUnit"], "ou": [b"apigroups"]})
    groups = LdapUnixGroups(directory, base_dn=base, gid_range=GID_RANGE)
    assert base in groups.check()
    groups.create("devs")
    assert list(ldapsearch(ldap_tree.server, ldap_tree.base_dn, "(cn=devs)", "cn")) == [f"cn=devs,{base}"]
    assert groups.list_groups() == {"devs": []}
    with pytest.raises(HostUnavailable, match="does not exist"):
        LdapUnixGroups(directory, base_dn=f"ou=nosuch,{ldap_tree.base_dn}").check()
    with pytest.raises(InvalidInput, match="not a DN"):
        LdapUnixGroups(directory, base_dn="not a dn")


def test_a_stopped_server_is_unavailable_and_changes_nothing(private_slapd):
    directory = make(private_slapd.server)
    groups = LdapUnixGroups(directory, gid_range=GID_RANGE)
    groups.create("devs")
    private_slapd.stop()
    for call in (lambda: groups.create("ops"), lambda: groups.set_members("devs", []),
                 lambda: groups.delete("devs"), lambda: groups.get("devs"), groups.check):
        with pytest.raises(HostUnavailable):
            call()
    private_slapd.start()
    assert groups.get("devs") == [] and groups.get("ops") is None


def test_server_refusals_are_host_errors(directory, ldap_tree, monkeypatch):
    groups = LdapUnixGroups(directory, gid_range=GID_RANGE)

    def refuse(dn, entry):
        raise ldap.INSUFFICIENT_ACCESS({"desc": "Insufficient access"})

    monkeypatch.setattr(directory, "_add", refuse)
    with pytest.raises(HostError, match="Insufficient access"):
        groups.create("devs")
    assert group_entry(ldap_tree, "devs") is None


def test_the_factory_builds_the_configured_backend(directory, ldap_tree, tmp_path):
    ldap_keys = {"backend": "ldap", "uri": ldap_tree.server.uri, "base_dn": ldap_tree.base_dn,
                 "bind_dn": ldap_tree.server.bind_dn, "bind_password_file": ldap_tree.server.password_file}
    config = config_from_dict({"directory": ldap_keys, "groups": {"gid_min": 71000, "gid_max": 71009}})
    assert config.groups.backend == "ldap"  # follows [directory] backend
    groups = build_groups(config, directory)
    assert isinstance(groups, LdapUnixGroups) and groups.gid_range == (71000, 71009)
    assert groups.base_dn == f"ou=groups,{ldap_tree.base_dn}"
    local = config.with_values({"groups": {"backend": "local"}, "unix": {"root": str(tmp_path)}})
    assert isinstance(build_groups(local, directory), CommandUnixGroups)
    assert config_from_dict({}).groups.backend == "local"
    with pytest.raises(InvalidInput, match=r"\[groups\] backend = ldap needs \[directory\] backend = ldap"):
        config_from_dict({"groups": {"backend": "ldap"}})
    with pytest.raises(InvalidInput, match=r"\[groups\] backend must be one of"):
        config_from_dict({"groups": {"backend": "nis"}})


@pytest.mark.parametrize("cls", [LdapUnixGroups])
def test_signatures_match_the_interface(cls):
    assert public_methods(cls) == public_methods(UnixGroups)


def test_agent_check_names_the_ldap_groups_backend(ldap_tree, tmp_path):
    import json
    import subprocess

    from controller.config import write_config
    from tests.fixtures.agent import AGENT, run_agent
    from tests.fixtures.api import config_values_for

    server = ldap_tree.server
    values = config_values_for(tmp_path)
    values["directory"] = {"backend": "ldap", "uri": server.uri, "base_dn": ldap_tree.base_dn,
                           "bind_dn": server.bind_dn, "bind_password_file": server.password_file}
    path = str(tmp_path / "controller.ini")
    write_config(values, path)
    subprocess.run([AGENT, "--config", path, "init"], check=True, capture_output=True)
    proc = run_agent("--config", path, "--json", "check")
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["system_root"] == {
        "name": "system_root", "ok": True,
        "detail": f"groups: LDAP posixGroups under ou=groups,{ldap_tree.base_dn} on {server.uri}, gids 70000-79999"}
    values["groups"] = {"ldap_base": f"ou=nosuch,{ldap_tree.base_dn}"}
    write_config(values, path)
    proc = run_agent("--config", path, "--json", "check")
    assert proc.returncode == 1
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert not checks["system_root"]["ok"] and "the groups base) does not exist" in checks["system_root"]["detail"]
