"""The NoCloud seed: its documents, its ISO, and its bootcmd script run for real against fakes."""

import dataclasses
import io
import json
import os
import shlex
import shutil
import stat

import pycdlib
import pytest

from common.errors import InvalidInput
from host_adapters import subp
from host_adapters.guests import seed
from host_adapters.guests.guest import GuestGroup, GuestSpec, GuestUser, Nic

IID = "4f1c2d3e-0000-4000-8000-000000000001"
PRIVATE = Nic(mac="52:54:00:00:00:02", address="192.168.100.10", prefix=24, gateway="192.168.100.1",
              dns=("192.168.100.1",), network="cloud-controller")
PUBLIC = Nic(mac="52:54:00:00:00:01", address="203.0.113.7", prefix=26, gateway="203.0.113.1", bridge="br0")


def make_spec(home_root: str = "/home", *, users: tuple[GuestUser, ...] | None = None, nics=(PRIVATE,)) -> GuestSpec:
    if users is None:
        users = (
            GuestUser("alice", 10000, 10000, f"{home_root}/alice", mounted=True, groups=("proj",), sudo=True),
            GuestUser("bob", 10001, 10001, f"{home_root}/bob", mounted=True, groups=("proj", "viz")),
            GuestUser("carol", 10002, 5000, f"{home_root}/carol", mounted=False),
        )
    return GuestSpec(hostname="node-1", nics=nics, users=users,
                     groups=(GuestGroup("proj", 5000), GuestGroup("viz", 5001)))


def user_data(documents: dict[str, str]) -> dict:
    header, body = documents["user-data"].split("\n", 1)
    assert header == "#cloud-config"
    return json.loads(body)


# --- the documents -----------------------------------------------------------


def test_render_gives_three_json_documents():
    docs = seed.render(IID, make_spec())
    assert sorted(docs) == ["meta-data", "network-config", "user-data"]
    assert json.loads(docs["meta-data"]) == {"instance-id": IID, "local-hostname": "node-1"}
    ud = user_data(docs)
    assert ud["hostname"] == "node-1"
    assert ud["preserve_hostname"] is False and ud["manage_etc_hosts"] is True
    assert ud["ssh_pwauth"] is False and ud["disable_root"] is True
    assert ud["users"] == []
    assert not {"packages", "package_update", "package_upgrade", "runcmd"} & ud.keys()
    assert ud["bootcmd"] == [seed.bootcmd_script(make_spec())]


@pytest.mark.parametrize("instance_id", ["", "../etc", "a/b", "a b", "x" * 129, None])
def test_render_rejects_a_bad_instance_id(instance_id):
    with pytest.raises(InvalidInput):
        seed.render(instance_id, make_spec())


@pytest.mark.parametrize(
    ("nics", "gateways"),
    [
        ((PRIVATE,), ["192.168.100.1"]),
        # NICs are named in spec order (by MAC); the public one carries the default route.
        ((PRIVATE, PUBLIC), ["203.0.113.1", None]),
        ((dataclasses.replace(PRIVATE, gateway=None), PUBLIC), ["203.0.113.1", None]),
        ((PRIVATE, dataclasses.replace(PUBLIC, gateway=None)), [None, "192.168.100.1"]),
        ((), []),
    ],
)
def test_network_config_has_one_static_nic_per_nic_and_one_default_route(nics, gateways):
    spec = make_spec(nics=nics)
    net = json.loads(seed.render(IID, spec)["network-config"])
    assert net["version"] == 1
    assert [e["name"] for e in net["config"]] == [f"eth{i}" for i in range(len(nics))]
    for entry, nic, gateway in zip(net["config"], spec.nics, gateways, strict=True):
        assert entry["type"] == "physical" and entry["mac_address"] == nic.mac
        [subnet] = entry["subnets"]
        assert subnet["type"] == "static"
        assert subnet["address"] == f"{nic.address}/{nic.prefix}"
        assert subnet.get("gateway") == gateway
        assert subnet.get("dns_nameservers", []) == list(nic.dns)


def test_render_is_deterministic():
    assert seed.render(IID, make_spec()) == seed.render(IID, make_spec())


@pytest.mark.parametrize(
    "change",
    [{"uid": 20000}, {"gid": 5001}, {"home": "/srv/alice"}, {"groups": ()}, {"sudo": False}, {"mounted": False}],
)
def test_a_different_user_gives_different_user_data(change):
    base = make_spec()
    alice = dataclasses.replace(base.users[0], **change)
    changed = dataclasses.replace(base, users=(alice, *base.users[1:]))
    before, after = seed.render(IID, base), seed.render(IID, changed)
    assert before["user-data"] != after["user-data"]
    assert before["meta-data"] == after["meta-data"]  # the instance-id never changes


def test_interpolated_values_are_quoted():
    # guest.py forbids blanks and quotes in homes, but not ; & | ( ) * < >.
    home = "/srv/a;b&c|(d)*<e>"
    user = GuestUser("alice", 10000, 10000, home, mounted=True)
    script = seed.bootcmd_script(make_spec(users=(user,)))
    [line] = [x for x in script.splitlines() if x.startswith("ensure_user alice")]
    assert shlex.split(line) == ["ensure_user", "alice", "10000", "10000", home, ""]
    [line] = [x for x in script.splitlines() if x.startswith("mount_home ")]
    assert shlex.split(line) == ["mount_home", "alice", home]


# --- the ISO -----------------------------------------------------------------


def test_iso_round_trip():
    docs = seed.render(IID, make_spec())
    data = seed.build_iso(docs)
    assert seed.read_iso(data) == docs
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    try:
        assert iso.pvd.volume_identifier.rstrip() == b"cidata"
        names = sorted(r.file_identifier() for r in iso.list_children(iso_path="/") if r.is_file())
        assert names == [b"METADATA.;1", b"NETWORKC.;1", b"USERDATA.;1"]
        assert iso.has_rock_ridge() and iso.has_joliet()
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, joliet_path="/user-data")
        assert out.getvalue().decode() == docs["user-data"]
    finally:
        iso.close()


def _iso(label: str, files: dict[str, bytes]) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.new(vol_ident=label, rock_ridge="1.09")
    for name, data in files.items():
        iso.add_fp(io.BytesIO(data), len(data), iso_path=f"/{name.upper().replace('-', '')[:8]}.;1", rr_name=name)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an iso at all" * 10,
        b"\0" * 70000,
        _iso("config-2", {"meta-data": b"{}", "user-data": b"#cloud-config\n{}"}),
        _iso("cidata", {"meta-data": b"{}"}),
        _iso("cidata", {"meta-data": b"{}", "user-data": b"\xff\xfe"}),
    ],
    ids=["empty", "text", "zeros", "other-label", "no-user-data", "not-utf8"],
)
def test_read_iso_rejects_what_is_not_a_seed(data):
    with pytest.raises(InvalidInput):
        seed.read_iso(data)


@pytest.mark.parametrize("documents", [{"User-Data": "x"}, {"a/b": "x"}, {"meta-data": "x", "metadata": "y"}])
def test_build_iso_rejects_bad_or_clashing_names(documents):
    with pytest.raises(InvalidInput):
        seed.build_iso(documents)


# --- the bootcmd script, run for real against fake commands ------------------

_LOGGING_FAKE = """#!/bin/sh
{ printf '%s' "${0##*/}"; for a in "$@"; do printf '\\t%s' "$a"; done; printf '\\n'; } >>"$CC_FAKE_LOG"
case " $CC_FAKE_FAIL " in *" ${0##*/} "*) echo "${0##*/}: failing on purpose" >&2; exit 1 ;; esac
"""
# getent DB KEY: by name or by numeric id, from the sandbox's own passwd and group files.
_GETENT = """#!/bin/sh
[ -f "$CC_FAKE_DB/$1" ] || exit 2
awk -F: -v k="$2" '$1 == k || $3 == k { print; found = 1 } END { exit found ? 0 : 2 }' "$CC_FAKE_DB/$1"
"""
# mountpoint -q PATH: mounted when listed in the sandbox's mounts file.
_MOUNTPOINT = _LOGGING_FAKE + 'grep -qxF -- "$2" "$CC_FAKE_DB/mounts" 2>/dev/null\n'
_LOGGED = ("groupadd", "groupmod", "groupdel", "useradd", "usermod", "userdel", "mount", "umount", "modprobe")


class Guest:
    """A scratch 'guest': fake account commands, a passwd/group database, state and sudoers dirs."""

    def __init__(self, root):
        self.root = root
        self.bin, self.db = root / "bin", root / "db"
        self.state, self.sudoers = root / "var/lib/cloud-controller", root / "etc/sudoers.d"
        self.log = root / "commands.log"
        self.extra_env: dict[str, str] = {}
        for d in (self.bin, self.db):
            d.mkdir(parents=True)
        fakes = {name: _LOGGING_FAKE for name in _LOGGED} | {"getent": _GETENT, "mountpoint": _MOUNTPOINT}
        for name, text in fakes.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    def set_db(self, *, passwd=(), group=(), mounts=()):
        (self.db / "passwd").write_text("".join(line + "\n" for line in passwd))
        (self.db / "group").write_text("".join(line + "\n" for line in group))
        (self.db / "mounts").write_text("".join(str(m) + "\n" for m in mounts))

    def boot(self, spec: GuestSpec, *, fail: str = "", ok_codes=(0,)):
        """Run the seed's bootcmd as cloud-init does (a file with `#!/bin/sh` and the entry, run by /bin/sh)."""
        self.log.write_text("")
        entry = seed.bootcmd_script(spec)
        assert user_data(seed.render(IID, spec))["bootcmd"] == [entry]
        script = self.root / "bootcmd"
        script.write_text("#!/bin/sh\n" + entry + "\n")
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "CC_FAKE_LOG": self.log, "CC_FAKE_DB": self.db,
               "CC_FAKE_FAIL": fail, "CC_SEED_STATE_DIR": self.state, "CC_SEED_SUDOERS_DIR": self.sudoers, **self.extra_env}
        argv = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), "/bin/sh", str(script)]
        return subp.run(argv, ok_codes=ok_codes, timeout=30)

    def commands(self, name: str | None = None) -> list[list[str]]:
        calls = [line.split("\t") for line in self.log.read_text().splitlines()]
        return [c[1:] for c in calls if c[0] == name] if name else calls


@pytest.fixture
def guest(tmp_path):
    g = Guest(tmp_path / "guest")
    g.set_db()
    return g


@pytest.mark.real_commands
def test_script_is_posix_sh(tmp_path):
    path = tmp_path / "bootcmd"
    path.write_text(seed.bootcmd_script(make_spec()))
    subp.run([shutil.which("dash") or "/bin/sh", "-n", str(path)])
    if shutil.which("bash"):
        subp.run(["bash", "--posix", "-n", str(path)])


@pytest.mark.real_commands
def test_first_boot_makes_groups_users_mounts_and_sudoers(guest, tmp_path):
    homes = tmp_path / "homes"
    spec = make_spec(str(homes))
    guest.boot(spec)

    assert guest.commands("groupadd") == [
        ["-g", "5000", "proj"], ["-g", "5001", "viz"], ["-g", "10000", "alice"], ["-g", "10001", "bob"],
    ]  # carol's primary gid is proj's: no own group
    assert guest.commands("useradd") == [
        ["-M", "-N", "-u", "10000", "-g", "10000", "-d", f"{homes}/alice", "-s", "/bin/bash", "alice"],
        ["-M", "-N", "-u", "10001", "-g", "10001", "-d", f"{homes}/bob", "-s", "/bin/bash", "bob"],
        ["-M", "-N", "-u", "10002", "-g", "5000", "-d", f"{homes}/carol", "-s", "/bin/bash", "carol"],
    ]
    assert guest.commands("usermod") == [
        ["-p", "*", "-G", "proj", "alice"], ["-p", "*", "-G", "proj,viz", "bob"], ["-p", "*", "-G", "", "carol"],
    ]
    assert guest.commands("modprobe") == [["virtiofs"]]
    assert guest.commands("mount") == [
        ["-t", "virtiofs", "alice", f"{homes}/alice", "-o", "nosuid,nodev"],
        ["-t", "virtiofs", "bob", f"{homes}/bob", "-o", "nosuid,nodev"],
    ]
    assert (homes / "alice").is_dir() and not (homes / "carol").exists()
    assert not guest.commands("userdel") and not guest.commands("groupdel") and not guest.commands("umount")

    sudoers = guest.sudoers / "cloud-controller"
    assert sudoers.read_text() == "alice ALL=(ALL) NOPASSWD:ALL\n"
    assert stat.S_IMODE(sudoers.stat().st_mode) == 0o440
    assert os.listdir(guest.sudoers) == ["cloud-controller"]
    # Groups in the order the script made them: the spec's, then the users' own.
    assert (guest.state / "provisioned").read_text().splitlines() == [
        "user alice", "user bob", "user carol", "group proj", "group viz", "group alice", "group bob",
    ]


def _as_made(spec: GuestSpec) -> dict:
    """The guest's database after a boot with `spec`: what the real commands would have left."""
    own = [f"{u.username}:x:{u.gid}:" for u in spec.users if u.gid not in {g.gid for g in spec.groups}]
    return {
        "passwd": ["root:x:0:0:root:/root:/bin/bash"]
        + [f"{u.username}:x:{u.uid}:{u.gid}::{u.home}:/bin/bash" for u in spec.users],
        "group": ["root:x:0:", "users:x:100:"] + [f"{g.name}:x:{g.gid}:" for g in spec.groups] + own,
        "mounts": [s.source_dir for s in spec.shares],
    }


@pytest.mark.real_commands
def test_second_boot_with_the_same_seed_changes_nothing(guest, tmp_path):
    spec = make_spec(str(tmp_path / "homes"))
    guest.boot(spec)
    guest.set_db(**_as_made(spec))
    guest.boot(spec)
    # Only the password field and groups are set again; mounted homes stay as they are.
    assert [c[0] for c in guest.commands()] == ["usermod", "usermod", "usermod", "modprobe", "mountpoint", "mountpoint"]
    assert all(args[:2] == ["-p", "*"] for args in guest.commands("usermod"))


@pytest.mark.real_commands
def test_a_removed_user_is_unmounted_and_deleted_but_its_home_kept(guest, tmp_path):
    homes = tmp_path / "homes"
    before = make_spec(str(homes))
    guest.boot(before)
    guest.set_db(**_as_made(before))
    (homes / "bob" / "data").write_text("keep me")

    after = dataclasses.replace(before, users=before.users[:1] + before.users[2:],
                                groups=before.groups[:1])  # bob and viz are gone
    guest.boot(after)

    assert guest.commands("umount") == [[f"{homes}/bob"]]
    assert guest.commands("userdel") == [["bob"]]  # never -r
    assert guest.commands("groupdel") == [["viz"], ["bob"]]  # in the order the first boot made them
    calls = [c[0] for c in guest.commands()]
    assert calls.index("umount") < calls.index("userdel") < calls.index("groupdel")
    assert not guest.commands("useradd") and not guest.commands("groupadd")
    assert (homes / "bob" / "data").read_text() == "keep me"
    assert (guest.state / "provisioned").read_text().splitlines() == [
        "user alice", "user carol", "group proj", "group alice",
    ]


@pytest.mark.real_commands
def test_changed_ids_and_home_are_fixed_without_touching_system_accounts(guest, tmp_path):
    homes = tmp_path / "homes"
    spec = make_spec(str(homes), users=(
        GuestUser("alice", 10000, 10000, f"{homes}/alice", mounted=False),
        GuestUser("games", 10005, 10005, f"{homes}/games", mounted=False),
    ))
    guest.set_db(passwd=["alice:x:10009:10009::/old/alice:/bin/sh", "games:x:5:60::/usr/games:/usr/sbin/nologin"],
                 group=["alice:x:10009:", "proj:x:5000:", "viz:x:5001:", "games:x:60:"])
    # alice and her group were made by an earlier seed (only those are ever changed).
    guest.state.mkdir(parents=True)
    (guest.state / "provisioned").write_text("user alice\ngroup alice\n")
    guest.boot(spec, ok_codes=(1,))
    assert guest.commands("groupmod") == [["-g", "10000", "alice"]]
    assert guest.commands("usermod") == [
        ["-u", "10000", "alice"], ["-g", "10000", "alice"], ["-d", f"{homes}/alice", "alice"],
        ["-s", "/bin/bash", "alice"], ["-p", "*", "-G", "", "alice"],
    ]  # nothing for games: uid 5 is the image's


@pytest.mark.real_commands
def test_a_failed_mount_does_not_stop_the_script(guest, tmp_path):
    result = guest.boot(make_spec(str(tmp_path / "homes")), fail="mount", ok_codes=(1,))
    assert len(guest.commands("mount")) == 2  # bob is still tried after alice failed
    assert "cannot mount share alice" in result.stderr
    assert (guest.sudoers / "cloud-controller").exists() and (guest.state / "provisioned").exists()


@pytest.mark.real_commands
def test_without_sudo_users_the_sudoers_file_goes(guest, tmp_path):
    guest.sudoers.mkdir(parents=True)
    (guest.sudoers / "cloud-controller").write_text("alice ALL=(ALL) NOPASSWD:ALL\n")
    (guest.sudoers / "other").write_text("keep\n")
    spec = make_spec(str(tmp_path / "homes"))
    spec = dataclasses.replace(spec, users=tuple(dataclasses.replace(u, sudo=False) for u in spec.users))
    guest.boot(spec)
    assert os.listdir(guest.sudoers) == ["other"]


@pytest.mark.real_commands
def test_an_unusual_home_reaches_the_commands_intact(guest, tmp_path):
    home = f"{tmp_path}/a;b&c|(d)*<e>"
    guest.boot(make_spec(users=(GuestUser("alice", 10000, 10000, home, mounted=True),)))
    assert guest.commands("useradd")[0][7] == home
    assert guest.commands("mount") == [["-t", "virtiofs", "alice", home, "-o", "nosuid,nodev"]]
    assert os.path.isdir(home)


# --- the bootcmd script with the real shadow tools, in a scratch system root ---------

_REAL_TOOL = '#!/bin/sh\nexec /usr/sbin/{name} -R "$CC_ROOT" "$@"\n'
# getent DB KEY, read from the scratch root's etc (getent itself has no root option).
_ROOT_GETENT = """#!/bin/sh
awk -F: -v k="$2" '$1 == k || $3 == k { print; found = 1 } END { exit found ? 0 : 2 }' "$CC_ROOT/etc/$1"
"""


class RealGuest(Guest):
    """A 'guest' whose accounts are made by the real groupadd, groupmod, useradd and usermod
    (`-R ROOT`) in a scratch system root; mounts stay fakes."""

    def __init__(self, root, sysroot: str):
        super().__init__(root)
        self.sysroot = sysroot
        for name in ("groupadd", "groupmod", "groupdel", "useradd", "usermod", "userdel"):
            (self.bin / name).write_text(_REAL_TOOL.format(name=name))
        (self.bin / "getent").write_text(_ROOT_GETENT)
        self.extra_env["CC_ROOT"] = sysroot

    def group(self) -> dict[str, list[str]]:
        lines = (self.root.parent / "sysroot" / "etc" / "group").read_text().splitlines()
        return {f[0]: [f[2], f[3]] for f in (line.split(":") for line in lines)}


@pytest.fixture
def real_guest(tmp_path, sysroot):
    return RealGuest(tmp_path / "guest", sysroot)


@pytest.mark.real_commands
def test_a_group_named_like_an_image_group_is_not_joined_and_is_reported(real_guest, tmp_path):
    # The image's own groups: on RHEL, ssh_keys reads the host keys and stapdev gives root;
    # `lab` is a group of the image above 1000 that no seed made.
    with open(os.path.join(real_guest.sysroot, "etc", "group"), "a") as f:
        f.write("ssh_keys:x:101:\nstapdev:x:158:\nlab:x:1500:\n")
    home = str(tmp_path / "homes" / "alice")
    groups = (GuestGroup("ssh_keys", 70001), GuestGroup("stapdev", 70002), GuestGroup("g-lab", 70003),
              GuestGroup("lab", 70004))
    alice = GuestUser("alice", 10000, 10000, home, mounted=False, groups=tuple(g.name for g in groups))
    spec = GuestSpec(hostname="node-1", users=(alice,), groups=groups)

    result = real_guest.boot(spec, ok_codes=(1,))

    group = real_guest.group()
    assert group["ssh_keys"] == ["101", ""] and group["stapdev"] == ["158", ""] and group["lab"] == ["1500", ""]
    assert group["g-lab"] == ["70003", "alice"] and group["alice"] == ["10000", ""]
    for name, gid, ours in (("ssh_keys", 101, 70001), ("stapdev", 158, 70002), ("lab", 1500, 70004)):
        assert (f"cloud-controller seed: group {name} exists in this image with gid {gid}, "
                f"not the cluster's gid {ours}: skipped, no user joins it") in result.stderr
        assert f"user alice not added to group {name}" in result.stderr
    assert (real_guest.state / "provisioned").read_text().splitlines() == ["user alice", "group g-lab", "group alice"]

    # Out of the spec again: the image's groups are not the seed's to remove.
    later = dataclasses.replace(spec, users=(dataclasses.replace(alice, groups=()),), groups=())
    real_guest.boot(later)
    group = real_guest.group()
    assert {"ssh_keys", "stapdev", "lab", "alice"} <= group.keys() and "g-lab" not in group


@pytest.mark.real_commands
def test_a_group_the_seed_made_keeps_its_members_and_follows_the_cluster_gid(real_guest, tmp_path):
    home = str(tmp_path / "homes" / "alice")
    alice = GuestUser("alice", 10000, 10000, home, mounted=False, groups=("g-lab",))
    spec = GuestSpec(hostname="node-1", users=(alice,), groups=(GuestGroup("g-lab", 70003),))
    real_guest.boot(spec)
    assert real_guest.group()["g-lab"] == ["70003", "alice"]
    real_guest.boot(spec)  # the same seed again: nothing to report
    # Re-made on the head node with another gid: the seed's own group follows it.
    real_guest.boot(dataclasses.replace(spec, groups=(GuestGroup("g-lab", 70009),)))
    assert real_guest.group()["g-lab"] == ["70009", "alice"]
