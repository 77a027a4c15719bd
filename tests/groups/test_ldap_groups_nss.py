"""LDAP groups as a cluster node sees them: `getent group` through a real NSS LDAP client
(Debian's libnss-ldapd and nslcd) against the slapd fixture.

The machine's own NSS is left alone: nslcd and getent run in a private mount namespace
(`unshare -m`) where /etc/nsswitch.conf and /etc/nslcd.conf are this test's files and
/run is a tmpfs of its own (nslcd's socket, /run/nslcd/socket, is compiled into
libnss_ldap). nslcd runs in the foreground there and is stopped by its PID when getent
is done. Needs root (a mount namespace) and the nslcd and libnss-ldapd packages
(scripts/setup-host.sh).
"""

import glob
import os
import pwd
import subprocess

import pytest

from host_adapters.accounts.ldap_groups import LdapUnixGroups
from tests.users.test_ldap_directory import make

pytestmark = [pytest.mark.integration]

NSLCD = "/usr/sbin/nslcd"
# In the namespace: a /run of our own, our two config files over the machine's, nslcd
# started and stopped by its PID, getent asked about the names given as arguments.
_IN_NAMESPACE = r"""
set -eu
dir=$1; shift
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir /run/nslcd
chown "$(stat -c %u:%g "$dir/nslcd-owner")" /run/nslcd
mount --bind "$dir/nsswitch.conf" /etc/nsswitch.conf
mount --bind "$dir/nslcd.conf" /etc/nslcd.conf
/usr/sbin/nslcd -d 2>"$dir/nslcd.log" &
pid=$!
trap 'kill "$pid"; wait "$pid" || true' EXIT
tries=0
until [ -S /run/nslcd/socket ]; do
  tries=$((tries + 1))
  [ "$tries" -le 100 ] || { echo "nslcd made no socket" >&2; exit 3; }
  sleep 0.1
done
status=0
getent group "$@" || status=$?
echo "getent-exit $status"
"""


def getent_group(tmp_path, server_uri: str, base_dn: str, *names: str) -> tuple[dict[str, tuple[int, list]], int]:
    """name -> (gid, members) as `getent group NAMES` prints them through nslcd, and getent's exit code."""
    # files first, as on a node: nslcd finds its own account there (no API group is in them).
    (tmp_path / "nsswitch.conf").write_text("passwd: files ldap\ngroup: files ldap\n")
    conf = tmp_path / "nslcd.conf"
    account = pwd.getpwnam("nslcd")
    conf.write_text(f"uid {account.pw_uid}\ngid {account.pw_gid}\nuri {server_uri}\nbase {base_dn}\n")
    conf.chmod(0o600)
    owner = tmp_path / "nslcd-owner"  # /run/nslcd belongs to nslcd's uid and gid
    owner.touch()
    os.chown(owner, account.pw_uid, account.pw_gid)
    done = subprocess.run(["unshare", "-m", "sh", "-c", _IN_NAMESPACE, "sh", str(tmp_path), *names],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    log = (tmp_path / "nslcd.log").read_text(errors="replace") if (tmp_path / "nslcd.log").exists() else ""
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines and lines[-1].startswith("getent-exit "), (done, log[-2000:])
    groups = {}
    for line in lines[:-1]:
        name, _, gid, members = line.split(":")
        groups[name] = (int(gid), [m for m in members.split(",") if m])
    return groups, int(lines[-1].split()[1])


@pytest.fixture
def nss_ldap():
    if os.geteuid() != 0:
        pytest.fail("needs root: nslcd and getent run in a mount namespace of their own", pytrace=False)
    if not os.path.exists(NSLCD) or not glob.glob("/usr/lib/*/libnss_ldap.so.2"):
        pytest.fail("nslcd or libnss-ldapd is missing: run scripts/setup-host.sh", pytrace=False)


def test_getent_through_nslcd_sees_the_ldap_groups(nss_ldap, ldap_tree, tmp_path):
    directory = make(ldap_tree.server, ldap_tree.base_dn)
    before = open("/etc/nsswitch.conf").read()
    try:
        groups = LdapUnixGroups(directory, gid_range=(70000, 70099))
        for user in ("ann", "ben"):
            directory.create_account(user, home=f"/home/{user}")
        groups.create("g-lab", members=["ann", "ben"])
        groups.create("g-empty")
        seen, code = getent_group(tmp_path, ldap_tree.server.uri, ldap_tree.base_dn, "g-lab", "g-empty")
        assert code == 0
        assert seen == {"g-lab": (groups.gid("g-lab"), ["ann", "ben"]), "g-empty": (groups.gid("g-empty"), [])}
        groups.remove_members("g-lab", ["ann"])
        groups.delete("g-empty")
        seen, code = getent_group(tmp_path, ldap_tree.server.uri, ldap_tree.base_dn, "g-lab", "g-empty")
        assert seen == {"g-lab": (groups.gid("g-lab"), ["ben"])} and code == 2  # 2: a name not found
    finally:
        directory._drop()
    # The machine's own NSS never saw any of it.
    assert open("/etc/nsswitch.conf").read() == before
    assert not os.path.exists("/run/nslcd")
