"""The black-box group tests run on both groups backends: `env` here is the shared
sandbox (`[groups] backend = local`, groups in its system root) or a second served
sandbox whose accounts and groups live in the slapd fixture (`[directory] backend =
ldap`, so `[groups] backend` follows as ldap). Each has `groups_backend`, `group_line`
and `existing_group` (a group that exists before any test, made outside the API)."""

import os

import ldap
import ldap.filter
import pytest

from tests.fixtures.blackbox import Env, sandbox_service


class LdapEnv(Env):
    """A served sandbox whose accounts and groups are entries below `tree` on `server`."""

    groups_backend = "ldap"
    existing_group = "sitegroup"

    def __init__(self, root, server, tree):
        super().__init__(root)
        self.server, self.tree = server, tree

    def _search(self, flt: str, attrs: list[str]) -> list:
        conn = ldap.initialize(self.server.uri)
        conn.timeout = 10
        try:
            conn.simple_bind_s(self.server.bind_dn, self.server.password)
            return conn.search_s(self.tree, ldap.SCOPE_SUBTREE, flt, attrs)
        finally:
            conn.unbind_s()

    def account_ids(self, username):
        [(_, attrs)] = self._search(f"(&(objectClass=posixAccount)(uid={ldap.filter.escape_filter_chars(username)}))",
                                    ["uidNumber", "gidNumber"])
        return int(attrs["uidNumber"][0]), int(attrs["gidNumber"][0])

    def group_line(self, name):
        """(gid, members) of the posixGroup `name` in the directory, or None."""
        flt = f"(&(objectClass=posixGroup)(cn={ldap.filter.escape_filter_chars(name)}))"
        found = self._search(flt, ["gidNumber", "memberUid"])
        assert len(found) <= 1, found
        if not found:
            return None
        attrs = found[0][1]
        return int(attrs["gidNumber"][0]), sorted(m.decode() for m in attrs.get("memberUid", []))


def _make_tree(server) -> str:
    """ou=<unique> below the server's base with ou=people, ou=groups and a group made by hand."""
    name = f"bb{os.getpid()}-{os.urandom(3).hex()}"
    base = f"ou={name},{server.base_dn}"
    conn = ldap.initialize(server.uri)
    conn.timeout = 10
    try:
        conn.simple_bind_s(server.bind_dn, server.password)
        conn.add_s(base, [("objectClass", [b"organizationalUnit"]), ("ou", [name.encode()])])
        for ou in ("people", "groups"):
            conn.add_s(f"ou={ou},{base}", [("objectClass", [b"organizationalUnit"]), ("ou", [ou.encode()])])
        conn.add_s(f"cn={LdapEnv.existing_group},ou=groups,{base}",
                   [("objectClass", [b"top", b"posixGroup"]), ("cn", [LdapEnv.existing_group.encode()]),
                    ("gidNumber", [b"5000"])])
    finally:
        conn.unbind_s()
    return base


@pytest.fixture(scope="session", params=["local", pytest.param("ldap", marks=pytest.mark.integration)])
def env(request, env, tmp_path_factory):
    if request.param == "local":
        env.groups_backend, env.existing_group = "local", "root"  # root: in the system root
        yield env
        return
    server = request.getfixturevalue("slapd")
    tree = _make_tree(server)

    def tune(cp):
        cp["directory"] = {"backend": "ldap", "uri": server.uri, "base_dn": tree, "bind_dn": server.bind_dn,
                           "bind_password_file": server.password_file, "uid_min": "46000", "uid_max": "46999",
                           "default_shell": "/bin/bash"}

    with sandbox_service(tmp_path_factory.mktemp("blackbox-ldap"), tune=tune,
                         make_env=lambda root: LdapEnv(root, server, tree)) as served:
        yield served
