"""Home volumes: one contract run against the fake and the real adapter (no
quota, a fake quota, btrfs), then what only the real one can show: symlinks,
mounts, rollback, and a btrfs quota a user really hits."""

import os
import re
import subprocess
from dataclasses import dataclass

import pytest

from controller.errors import Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters.homes.btrfs_quota import BtrfsQuota, parse_qgroups
from host_adapters.homes.fake_quota import FakeQuota
from host_adapters.homes.homes import DirectoryHomeVolumes, FakeHomeVolumes, HomeInfo, HomeVolumes
from host_adapters.homes.quota import NoQuota
from tests.fixtures.interfaces import assert_offers_the_interface

GIB = 1 << 30
UID, GID = 12345, 12345

BTRFS = pytest.param("btrfs", marks=[pytest.mark.real_commands, pytest.mark.integration])


@dataclass
class Setup:
    volumes: HomeVolumes
    enforces_limits: bool


def _needs_root():
    # A proof that cannot run its real part fails: a skip here would turn every
    # real-home test green without testing anything.
    if os.geteuid() != 0:
        pytest.fail("real homes are chowned to another uid: run the tests as root", pytrace=False)


def _make(kind, request, tmp_path) -> Setup:
    if kind == "fake":
        return Setup(FakeHomeVolumes(str(tmp_path / "home")), True)
    _needs_root()
    if kind == "btrfs":
        root = request.getfixturevalue("btrfs_home_root")
        return Setup(DirectoryHomeVolumes(root, BtrfsQuota()), True)
    root = tmp_path / "home"
    root.mkdir()
    if kind == "noquota":
        return Setup(DirectoryHomeVolumes(str(root), NoQuota()), False)
    return Setup(DirectoryHomeVolumes(str(root), FakeQuota()), True)


@pytest.fixture(params=["fake", "noquota", "fakequota", BTRFS])
def setup(request, tmp_path) -> Setup:
    return _make(request.param, request, tmp_path)


@pytest.fixture(params=["noquota", BTRFS])
def real(request, tmp_path) -> DirectoryHomeVolumes:
    return _make(request.param, request, tmp_path).volumes


# --- signatures ----------------------------------------------------------


@pytest.mark.parametrize("impl", [DirectoryHomeVolumes, FakeHomeVolumes])
def test_public_methods_match_the_interface(impl):
    assert_offers_the_interface(impl, HomeVolumes)


def test_home_info_gives_the_limit_in_gb():
    assert HomeInfo(path="/h/a", exists=True, limit_bytes=3 * GIB).limit_gb == 3
    assert HomeInfo(path="/h/a", exists=True, limit_bytes=GIB // 2).limit_gb == 0.5
    assert HomeInfo(path="/h/a", exists=False).limit_gb is None


# --- the contract ----------------------------------------------------------


class TestContract:
    def test_check_passes(self, setup):
        setup.volumes.check()

    def test_path_is_under_the_root(self, setup):
        v = setup.volumes
        assert v.path("alice") == os.path.join(v.home_root, "alice")

    @pytest.mark.parametrize("name", ["../etc", "a/b", "Alice", "", ".", "-x", "a" * 33, None, 5])
    def test_bad_names_never_become_paths(self, setup, name):
        v = setup.volumes
        with pytest.raises(InvalidInput):
            v.path(name)
        with pytest.raises(InvalidInput):
            v.create(name, uid=UID, gid=GID, size_gb=1)
        with pytest.raises(InvalidInput):
            v.delete(name, uid=UID)

    def test_create_then_inspect(self, setup):
        v = setup.volumes
        path = v.create("alice", uid=UID, gid=GID + 1, size_gb=2)
        assert path == v.path("alice")
        info = v.inspect("alice")
        assert info.exists and info.is_dir and info.path == path
        assert (info.uid, info.gid, info.mode) == (UID, GID + 1, 0o700)
        assert info.limit_gb == (2 if setup.enforces_limits else None)
        v.delete("alice", uid=UID)

    def test_inspect_says_whether_a_quota_is_expected(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        assert v.inspect("alice").quota_expected == setup.enforces_limits
        v.delete("alice", uid=UID)

    def test_repair_owner(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        v.repair_owner("alice", uid=UID + 7, gid=GID + 8)
        info = v.inspect("alice")
        assert (info.uid, info.gid, info.mode) == (UID + 7, GID + 8, 0o700)
        with pytest.raises(InvalidInput):
            v.repair_owner("alice", uid=-1, gid=GID)
        v.delete("alice", uid=UID + 7)
        with pytest.raises(NotFound):
            v.repair_owner("alice", uid=UID, gid=GID)

    def test_inspect_of_a_missing_home(self, setup):
        info = setup.volumes.inspect("nobody")
        assert not info.exists and info.uid is None and info.limit_gb is None

    def test_create_twice_is_a_conflict_and_changes_nothing(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        with pytest.raises(Conflict):
            v.create("alice", uid=UID + 1, gid=GID + 1, size_gb=3)
        info = v.inspect("alice")
        assert (info.uid, info.gid) == (UID, GID)
        assert info.limit_gb == (1 if setup.enforces_limits else None)
        v.delete("alice", uid=UID)

    @pytest.mark.parametrize("size", [0, -1, True, 1.5, "1", None])
    def test_bad_sizes(self, setup, size):
        v = setup.volumes
        with pytest.raises(InvalidInput):
            v.create("alice", uid=UID, gid=GID, size_gb=size)
        assert not v.inspect("alice").exists

    @pytest.mark.parametrize("ids", [(-1, GID), (UID, -1), (True, GID), (UID, "1"), (2**32, GID)])
    def test_bad_ids(self, setup, ids):
        v = setup.volumes
        with pytest.raises(InvalidInput):
            v.create("alice", uid=ids[0], gid=ids[1], size_gb=1)
        assert not v.inspect("alice").exists

    def test_resize(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        v.resize("alice", uid=UID, size_gb=4)
        assert v.inspect("alice").limit_gb == (4 if setup.enforces_limits else None)
        with pytest.raises(InvalidInput):
            v.resize("alice", uid=UID, size_gb=0)
        v.delete("alice", uid=UID)

    def test_usage(self, setup):
        v = setup.volumes
        assert v.reports_usage == setup.enforces_limits  # none cannot tell; fake, fake quota, btrfs can
        assert v.usages([("alice", UID)]) == {"alice": None}  # no home yet
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        used = v.usage("alice", uid=UID)
        if v.reports_usage:
            assert used is not None and 0 <= used < (1 << 20)
        else:
            assert used is None
        with pytest.raises(InvalidInput):
            v.usages([("../x", UID)])
        with pytest.raises(InvalidInput):
            v.usage("alice", uid=-1)
        v.delete("alice", uid=UID)
        assert v.usage("alice", uid=UID) is None

    def test_resize_of_a_missing_home_is_not_found(self, setup):
        with pytest.raises(NotFound):
            setup.volumes.resize("nobody", uid=UID, size_gb=2)

    def test_delete_then_delete_again(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        v.delete("alice", uid=UID)
        assert not v.inspect("alice").exists
        v.delete("alice", uid=UID)
        v.delete("never-made", uid=UID)

    def test_retire_frees_the_path_at_once_and_purge_removes_the_tree(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        retired = v.retire("alice", token="vol-1", uid=UID)
        assert retired == os.path.join(v.home_root, f".retired-vol-1.{UID}")
        assert not v.inspect("alice").exists
        assert v.list_retired() == [retired]
        v.create("alice", uid=UID, gid=GID, size_gb=2)  # a new volume at the same path, at once
        v.purge(retired)
        assert v.list_retired() == []
        assert v.inspect("alice").exists  # the new home is untouched
        v.purge(retired)  # again: already gone
        assert v.retire("nobody", token="vol-2", uid=1002) is None

    @pytest.mark.parametrize("path", ["/etc", "../x", ".retired-x", "/srv/home/.retired-x/../../etc"])
    def test_purge_refuses_what_retire_did_not_make(self, setup, path):
        with pytest.raises(InvalidInput):
            setup.volumes.purge(path)

    @pytest.mark.parametrize("token", ["", "../x", "a/b", ".x", "x" * 65])
    def test_retire_refuses_a_bad_token(self, setup, token):
        setup.volumes.create("alice", uid=UID, gid=GID, size_gb=1)
        with pytest.raises(InvalidInput):
            setup.volumes.retire("alice", token=token, uid=UID)
        assert setup.volumes.inspect("alice").exists

    def test_a_name_can_be_used_again_after_delete(self, setup):
        v = setup.volumes
        v.create("alice", uid=UID, gid=GID, size_gb=1)
        v.delete("alice", uid=UID)
        v.create("alice", uid=UID + 1, gid=GID + 1, size_gb=2)
        info = v.inspect("alice")
        assert info.uid == UID + 1 and info.limit_gb == (2 if setup.enforces_limits else None)
        v.delete("alice", uid=UID + 1)


# --- the fake's failure switches --------------------------------------------


def test_fake_fails_on_demand_and_changes_nothing():
    fake = FakeHomeVolumes("/srv/home")
    fake.fail_on["create"] = HostError("disk on fire")
    with pytest.raises(HostError, match="disk on fire"):
        fake.create("alice", uid=UID, gid=GID, size_gb=1)
    assert not fake.inspect("alice").exists
    del fake.fail_on["create"]
    fake.create("alice", uid=UID, gid=GID, size_gb=1)
    fake.fail_on["delete"] = HostError("busy")
    with pytest.raises(HostError):
        fake.delete("alice", uid=UID)
    assert fake.inspect("alice").exists
    fake.fail_on["check"] = HostUnavailable("gone")
    with pytest.raises(HostUnavailable):
        fake.check()


def test_fake_reports_nested_subvolumes_only_when_a_test_sets_them():
    fake = FakeHomeVolumes("/srv/home")
    fake.create("alice", uid=UID, gid=GID, size_gb=1)
    assert fake.inspect("alice").nested_subvolumes == ()
    fake.homes["alice"].nested_subvolumes = ("scratch", "scratch/deeper")
    assert fake.inspect("alice").nested_subvolumes == ("scratch", "scratch/deeper")


# --- real: what the fake cannot show ----------------------------------------


def test_delete_never_follows_symlinks_out_of_the_home(real, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    etc_before = sorted(os.listdir("/etc"))
    path = real.create("alice", uid=UID, gid=GID, size_gb=1)
    os.mkdir(os.path.join(path, "deep"))
    os.symlink("/etc", os.path.join(path, "etc"))
    os.symlink("/etc/passwd", os.path.join(path, "passwd"))
    os.symlink(str(outside), os.path.join(path, "deep", "outside"))
    real.delete("alice", uid=UID)
    assert not os.path.lexists(path)
    assert sorted(os.listdir("/etc")) == etc_before
    assert (outside / "keep").read_text() == "precious"


def test_delete_of_a_home_replaced_by_a_symlink_removes_only_the_link(real, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    path = real.path("alice")
    os.symlink(str(outside), path)
    assert real.inspect("alice").exists and not real.inspect("alice").is_dir
    with pytest.raises(NotFound):
        real.resize("alice", uid=UID, size_gb=1)
    real.delete("alice", uid=UID)
    assert not os.path.lexists(path) and (outside / "keep").exists()


def test_delete_of_read_only_content(real):
    path = real.create("alice", uid=UID, gid=GID, size_gb=1)
    inner = os.path.join(path, "ro")
    os.mkdir(inner)
    with open(os.path.join(inner, "f"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(inner, "f"), 0o400)
    os.chmod(inner, 0o500)
    os.chmod(path, 0o500)
    real.delete("alice", uid=UID)
    assert not os.path.lexists(path)


def test_delete_refuses_while_something_is_mounted_inside(real):
    path = real.create("alice", uid=UID, gid=GID, size_gb=1)
    mnt = os.path.join(path, "mnt")
    os.mkdir(mnt)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here (the tests run as root): {proc.stderr.strip()}", pytrace=False)
    try:
        with open(os.path.join(mnt, "keep"), "w") as f:
            f.write("x")
        with pytest.raises(HostError, match="mount points inside"):
            real.delete("alice", uid=UID)
        assert os.path.exists(os.path.join(mnt, "keep"))
    finally:
        subprocess.run(["umount", mnt], check=True)
    real.delete("alice", uid=UID)
    assert not os.path.lexists(path)


def test_check_refuses_a_missing_root(tmp_path):
    with pytest.raises(HostUnavailable, match="does not exist"):
        DirectoryHomeVolumes(str(tmp_path / "missing"), NoQuota()).check()


def test_check_reports_an_unusable_quota_backend(tmp_path):
    backend = FakeQuota()
    backend.fail_on["check"] = HostError("no quota on this filesystem")
    with pytest.raises(HostUnavailable, match="no quota on this filesystem"):
        DirectoryHomeVolumes(str(tmp_path), backend).check()


def test_home_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DirectoryHomeVolumes("home", NoQuota()).path("a") == str(tmp_path / "home" / "a")


@pytest.fixture
def fake_quota_homes(tmp_path):
    _needs_root()
    root = tmp_path / "home"
    root.mkdir()
    backend = FakeQuota()
    return DirectoryHomeVolumes(str(root), backend), backend


def test_a_failing_quota_leaves_no_directory(fake_quota_homes):
    volumes, backend = fake_quota_homes
    backend.fail_on["set_limit"] = HostError("quota refused")
    with pytest.raises(HostError, match="quota refused"):
        volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert not os.path.lexists(volumes.path("alice"))
    assert backend.limits == {}


def test_a_failing_make_home_leaves_nothing(fake_quota_homes):
    volumes, backend = fake_quota_homes
    backend.fail_on["make_home"] = HostError("no subvolume for you")
    with pytest.raises(HostError):
        volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert not os.path.lexists(volumes.path("alice"))


def test_a_failing_cleanup_is_reported_with_the_first_error(fake_quota_homes):
    volumes, backend = fake_quota_homes
    backend.fail_on["set_limit"] = HostError("quota refused")
    backend.fail_on["remove"] = HostError("cannot remove either")
    with pytest.raises(HostError, match="quota refused") as info:
        volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert any("cannot remove either" in note for note in info.value.__notes__)


def test_create_over_an_existing_file_is_a_conflict(fake_quota_homes):
    volumes, _ = fake_quota_homes
    with open(volumes.path("alice"), "w") as f:
        f.write("not a home")
    with pytest.raises(Conflict):
        volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    with open(volumes.path("alice")) as f:
        assert f.read() == "not a home"


def test_repair_owner_touches_only_the_home_directory(fake_quota_homes):
    volumes, _ = fake_quota_homes
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    inner = os.path.join(path, "inner")
    os.mkdir(inner, 0o755)
    os.chown(inner, 4242, 4242)
    os.chmod(path, 0o755)
    volumes.repair_owner("alice", uid=UID + 1, gid=GID + 1)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (UID + 1, GID + 1, 0o700)
    assert os.stat(inner).st_uid == 4242


def test_repair_owner_refuses_a_symlinked_home(fake_quota_homes, tmp_path):
    volumes, _ = fake_quota_homes
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(str(target), volumes.path("alice"))
    with pytest.raises(HostError):
        volumes.repair_owner("alice", uid=UID, gid=GID)
    assert os.stat(target).st_uid == 0


def test_inspect_reports_what_is_really_there(fake_quota_homes):
    volumes, _ = fake_quota_homes
    path = volumes.path("bob")
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)
    info = volumes.inspect("bob")
    assert info.exists and info.is_dir and info.mode == 0o755 and info.uid == 0
    assert info.limit_gb is None


def test_inspect_takes_nested_subvolumes_from_the_backend(fake_quota_homes):
    volumes, backend = fake_quota_homes
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    assert volumes.inspect("alice").nested_subvolumes == ()
    backend.nested[path] = ("x",)
    assert volumes.inspect("alice").nested_subvolumes == ("x",)


def test_plain_directories_have_no_nested_subvolumes(tmp_path):
    _needs_root()
    (tmp_path / "home").mkdir()
    volumes = DirectoryHomeVolumes(str(tmp_path / "home"), NoQuota())
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    os.mkdir(os.path.join(path, "d"))
    assert volumes.inspect("alice").nested_subvolumes == ()


# --- btrfs: the quota a user really hits ------------------------------------


def _as_user(uid, argv):
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        timeout=300,
    )


def _dd(uid, path, mib):
    return _as_user(uid, ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"])


def _btrfs(*args) -> str:
    return subprocess.run(["btrfs", *args], capture_output=True, text=True, check=True).stdout


def _subvolume_ids(path) -> set[int]:
    return {int(m) for m in re.findall(r"^ID (\d+) ", _btrfs("subvolume", "list", path), re.MULTILINE)}


def _qgroup_ids(path) -> set[str]:
    return set(parse_qgroups(_btrfs("qgroup", "show", "-re", "--raw", path)))


def _alice_home(volumes) -> tuple[str, int]:
    """alice's new 1 GB home and the id of its subvolume."""
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    return path, int(_btrfs("inspect-internal", "rootid", path))


def _assert_removed(volumes, path: str, *sids: int) -> None:
    """Nothing left of a home: its path, its subvolumes (`sids`), their qgroups."""
    assert not os.path.lexists(path)
    assert not set(sids) & _subvolume_ids(volumes.home_root)
    assert not {f"0/{sid}" for sid in sids} & _qgroup_ids(volumes.home_root)


@pytest.fixture
def btrfs_homes(btrfs_home_root):
    _needs_root()
    return DirectoryHomeVolumes(btrfs_home_root, BtrfsQuota())


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_retired_home_keeps_its_quota_until_purge_removes_subvolume_and_qgroup(btrfs_homes):
    volumes = btrfs_homes
    path, sid = _alice_home(volumes)
    assert _dd(UID, os.path.join(path, "data"), 16).returncode == 0
    retired = volumes.retire("alice", token="vol-1", uid=UID)
    assert int(_btrfs("inspect-internal", "rootid", retired)) == sid  # the same subvolume, moved
    assert f"0/{sid}" in _qgroup_ids(btrfs_homes.home_root)
    volumes.purge(retired)
    _assert_removed(volumes, retired, sid)


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_quota_stops_the_user_and_resize_lifts_it(btrfs_homes):
    volumes = btrfs_homes
    path, sid = _alice_home(volumes)

    small = _dd(UID, os.path.join(path, "small"), 64)
    assert small.returncode == 0, small.stderr

    big = _dd(UID, os.path.join(path, "big"), 1536)
    assert big.returncode != 0, "a 1.5 GiB write fitted in a 1 GiB quota"
    assert "Disk quota exceeded" in big.stderr or "No space left" in big.stderr, big.stderr
    assert os.path.getsize(os.path.join(path, "small")) + os.path.getsize(os.path.join(path, "big")) <= GIB

    volumes.resize("alice", uid=UID, size_gb=2)
    os.sync()  # settle the qgroup numbers of the failed write
    assert volumes.inspect("alice").limit_gb == 2
    assert parse_qgroups(_btrfs("qgroup", "show", "-re", "--raw", path))[f"0/{sid}"] == 2 * GIB
    more = _dd(UID, os.path.join(path, "more"), 256)
    assert more.returncode == 0, more.stderr

    volumes.delete("alice", uid=UID)
    _assert_removed(volumes, path, sid)


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_delete_with_nested_and_read_only_subvolumes(btrfs_homes):
    volumes = btrfs_homes
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    # All of this a user may do to their own home without privileges.
    for argv in (
        ["btrfs", "subvolume", "create", f"{path}/nested"],
        ["mkdir", f"{path}/nested/dir"],
        ["btrfs", "subvolume", "snapshot", "-r", f"{path}/nested", f"{path}/nested/dir/ro-snap"],
        ["btrfs", "subvolume", "create", f"{path}/nested/dir/odd\nID 5 name"],
        ["btrfs", "subvolume", "create", f"{path}/nested/inner"],
        ["ln", "-s", "/etc", f"{path}/nested/inner/etc"],
        ["btrfs", "property", "set", f"{path}/nested", "ro", "true"],
        ["btrfs", "property", "set", path, "ro", "true"],
    ):
        proc = _as_user(UID, argv)
        assert proc.returncode == 0, (argv, proc.stderr)
    ours = {
        int(_btrfs("inspect-internal", "rootid", p))
        for p in (path, f"{path}/nested", f"{path}/nested/dir/ro-snap", f"{path}/nested/inner",
                  f"{path}/nested/dir/odd\nID 5 name")
    }
    assert len(ours) == 5 and ours <= _subvolume_ids(path)

    volumes.delete("alice", uid=UID)

    _assert_removed(volumes, path, *ours)
    assert os.path.exists("/etc/passwd")


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_inspect_lists_nested_subvolumes_and_changes_nothing(btrfs_homes):
    volumes = btrfs_homes
    path = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    bob = volumes.create("bob", uid=UID + 1, gid=GID + 1, size_gb=1)
    assert volumes.inspect("alice").nested_subvolumes == ()
    _btrfs("subvolume", "create", f"{path}/escape")
    _btrfs("subvolume", "create", f"{path}/escape/inner")
    _btrfs("property", "set", f"{path}/escape", "ro", "true")
    os.mkdir(f"{path}/d")
    _btrfs("subvolume", "create", f"{path}/d/deep")
    _btrfs("subvolume", "create", f"{bob}/theirs")
    os.symlink(bob, f"{path}/to-bob")  # another home's subvolumes are not alice's

    nested = volumes.inspect("alice").nested_subvolumes

    assert sorted(nested) == ["d/deep", "escape", "escape/inner"]
    assert nested.index("escape") < nested.index("escape/inner")
    assert volumes.inspect("bob").nested_subvolumes == ("theirs",)
    assert _btrfs("property", "get", f"{path}/escape", "ro").strip() == "ro=true"
    volumes.delete("alice", uid=UID)
    volumes.delete("bob", uid=UID + 1)
    assert not os.path.lexists(path) and not os.path.lexists(bob)


def test_check_refuses_a_home_root_others_can_write(tmp_path):
    from controller.errors import HostUnavailable
    from host_adapters.homes.homes import DirectoryHomeVolumes
    from host_adapters.homes.quota import NoQuota

    root = tmp_path / "homes"
    root.mkdir(mode=0o755)
    homes = DirectoryHomeVolumes(str(root), NoQuota())
    homes.check()
    root.chmod(0o777)
    with pytest.raises(HostUnavailable, match="not writable by group or others"):
        homes.check()
    root.chmod(0o755)
    os.chown(root, 12345, 0)
    with pytest.raises(HostUnavailable, match="owned by root"):
        homes.check()


# --- reconcile reports what inspect finds -------------------------------------


class _Store:
    """The few store reads reconcile makes, over one account and its volume."""

    path = ":memory:"  # no lock file

    def __init__(self, account: dict, volume: dict):
        self.account, self.volume = dict(account, state="ready"), dict(volume, state="ready")

    def list_accounts(self):
        return [self.account]

    def list_volumes(self, *, visible_to, with_intents=False):
        return [self.volume]

    def account_of_user(self, user_id, controller_id):
        return self.account if user_id == self.account["user_id"] else None

    def get_user(self, user_id):
        return {"id": user_id, "active": 1} if user_id == self.account["user_id"] else None

    def list_groups(self, *, visible_to, with_intents=False):
        return []

    def record_reconcile(self, counts, *, fix):
        self.report = (counts, fix)

    def list_instance_claims(self):
        return []


def test_reconcile_reports_nested_subvolumes_and_leaves_them_alone():
    from types import SimpleNamespace

    from controller.maintenance.reconcile import reconcile
    from host_adapters.accounts.directory import FakeDirectory
    from host_adapters.accounts.unix_groups import FakeUnixGroups

    homes = FakeHomeVolumes("/srv/home")
    directory = FakeDirectory()
    directory.create_account("alice", home=homes.path("alice"), uid=UID)
    account = {"user_id": "u-1", "username": "alice", "uid": UID, "gid": UID, "home": homes.path("alice")}
    ctx = SimpleNamespace(
        config=SimpleNamespace(controller_id=1, is_sandbox=True, cloud_auth=SimpleNamespace(url="")),
        store=_Store(account, {"id": "vol-1", "owner_id": "u-1", "size_gb": 2}),
        adapters=SimpleNamespace(directory=directory, homes=homes, groups=FakeUnixGroups(directory=directory),
                                 hypervisor_in_process=True),
    )
    homes.create("alice", uid=UID, gid=UID, size_gb=2)
    assert reconcile(ctx, hypervisor=False) == []

    homes.homes["alice"].nested_subvolumes = ("scratch", "odd\nname")
    drift = reconcile(ctx, fix=True, hypervisor=False)

    assert [(d["kind"], d["target"], d["fixable"], d["fixed"]) for d in drift] == [
        ("home-nested-subvolume", "vol-1", False, False)
    ]
    detail = drift[0]["detail"]
    assert "'scratch'" in detail and "'odd\\nname'" in detail and "\n" not in detail
    assert "escapes" in detail and "quota" in detail
    assert homes.inspect("alice").nested_subvolumes == ("scratch", "odd\nname")


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_purge_of_a_home_chowned_to_another_uid_leaves_that_uids_quota(btrfs_homes):
    """Root in a guest chowns the home to another user's uid before the delete (issue 16, finding 10):
    the removal drops the home's own qgroup, and the other user's home keeps its limit."""
    volumes = btrfs_homes
    other = UID + 1
    mine = volumes.create("alice", uid=UID, gid=GID, size_gb=1)
    theirs = volumes.create("carol", uid=other, gid=other, size_gb=2)
    assert _dd(UID, os.path.join(mine, "data"), 4).returncode == 0
    mine_q = f"0/{int(_btrfs('inspect-internal', 'rootid', mine))}"
    theirs_q = f"0/{int(_btrfs('inspect-internal', 'rootid', theirs))}"
    for dirpath, _dirs, files in os.walk(mine):
        for name in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
            os.lchown(name, other, other)
    retired = volumes.retire("alice", token="vol-1", uid=UID)
    volumes.purge(retired)
    assert not os.path.lexists(retired)
    table = parse_qgroups(_btrfs("qgroup", "show", "-re", "--raw", volumes.home_root))
    assert mine_q not in table
    assert table[theirs_q] == 2 * GIB
    assert volumes.inspect("carol").limit_gb == 2


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_quota_stops_root_writing_in_the_home(btrfs_homes):
    """Root in a guest writes through the share as uid 0 (issue 16, finding 11): the home's
    qgroup limits the tree, so root's writes stop at the limit as the user's do."""
    path = btrfs_homes.create("alice", uid=UID, gid=GID, size_gb=1)
    proc = _dd(0, os.path.join(path, "by-root"), 1100)
    assert proc.returncode != 0 and "Disk quota exceeded" in proc.stderr, proc.stderr
    assert os.stat(os.path.join(path, "by-root")).st_uid == 0
    assert os.path.getsize(os.path.join(path, "by-root")) <= GIB
