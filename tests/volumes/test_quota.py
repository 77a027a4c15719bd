"""Quota backends: exact argv for xfs and setquota (this kernel has no XFS/ext4
quota), the parsers, FakeQuota, the config factory, and btrfs for real."""

import inspect
import os
import subprocess

import pytest

from controller.errors import CommandError, Conflict, HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.homes.btrfs_quota import BtrfsQuota, parse_qgroup_rows, parse_qgroups
from host_adapters.homes.command_quota import CommandQuota
from host_adapters.homes.fake_quota import FakeQuota
from host_adapters.homes.quota import NoQuota, QuotaBackend, find_mount_point, mounts_below, remove_tree
from host_adapters.homes.quota_backends import make_quota_backend
from host_adapters.homes.setquota import SetQuota
from host_adapters.homes.xfs_quota import XfsQuota

GIB = 1 << 30


class Runner:
    """Stands in for subprocess.run: records argv, answers from a script of (rc, stdout, stderr)."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.answers: dict[tuple[str, ...], tuple[int, str, str]] = {}

    def answer(self, argv, *, rc=0, stdout="", stderr="", then=False):
        """Answer argv so from now on; with then=True, so after the answers already given."""
        queue = self.answers.setdefault(tuple(argv), [])
        if not then:
            queue.clear()
        queue.append((rc, stdout, stderr))

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        queue = self.answers.get(tuple(argv)) or [(0, "", "")]
        rc, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.fixture
def runner(monkeypatch):
    r = Runner()
    monkeypatch.setattr(subp, "_run", r)
    return r


# --- signatures ----------------------------------------------------------


def _public_methods(cls):
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize("impl", [NoQuota, FakeQuota, BtrfsQuota, XfsQuota, SetQuota, CommandQuota])
def test_backend_public_methods_match_the_interface(impl):
    interface = _public_methods(QuotaBackend)
    methods = _public_methods(impl)
    extra = {"project_id"} if impl is XfsQuota else set()
    assert set(methods) - extra == set(interface)
    for name, signature in interface.items():
        assert methods[name] == signature, name


# --- config factory --------------------------------------------------------


def test_make_quota_backend_maps_each_config_value(tmp_path):
    assert isinstance(make_quota_backend("none", home_root=str(tmp_path)), NoQuota)
    assert isinstance(make_quota_backend("btrfs", home_root=str(tmp_path)), BtrfsQuota)
    xfs = make_quota_backend("xfs", home_root=str(tmp_path / "not-yet"))
    assert isinstance(xfs, XfsQuota)
    assert xfs.mount_point == find_mount_point(str(tmp_path))
    setq = make_quota_backend("setquota", home_root=str(tmp_path))
    assert isinstance(setq, SetQuota) and setq.filesystem == find_mount_point(str(tmp_path))
    with pytest.raises(InvalidInput, match="quota_backend"):
        make_quota_backend("zfs", home_root=str(tmp_path))


def test_find_mount_point_walks_up_to_a_mount():
    assert find_mount_point("/proc/self/no/such/dir") == "/proc"
    assert find_mount_point("/") == "/"


# --- XfsQuota: exact argv --------------------------------------------------


def _xfs(command, mount="/srv"):
    return ["xfs_quota", "-x", "-c", command, mount]


def test_xfs_make_home_sets_up_the_project_of_the_uid(runner, tmp_path):
    backend = XfsQuota(mount_point=str(tmp_path))
    home = str(tmp_path / "alice")
    backend.make_home(home, uid=12345)
    assert runner.calls == [_xfs(f"project -s -p {home} 12345", str(tmp_path))]
    assert oct(os.stat(home).st_mode & 0o777) == "0o700"


def test_xfs_make_home_removes_the_directory_when_the_project_fails(runner, tmp_path):
    backend = XfsQuota(mount_point=str(tmp_path))
    home = str(tmp_path / "alice")
    # xfs_quota reports this on stderr and still exits 0.
    runner.answer(
        _xfs(f"project -s -p {home} 12345", str(tmp_path)),
        stderr="xfs_quota: cannot setup path for project dir /x: Invalid argument\n",
    )
    with pytest.raises(CommandError):
        backend.make_home(home, uid=12345)
    assert not os.path.lexists(home)


def test_xfs_set_limit_and_offset(runner):
    XfsQuota(mount_point="/srv").set_limit("/srv/home/alice", uid=12345, size_gb=5)
    XfsQuota(mount_point="/srv", project_id_offset=1000000).set_limit("/srv/home/alice", uid=7, size_gb=1)
    assert runner.calls == [_xfs("limit -p bhard=5g 12345"), _xfs("limit -p bhard=1g 1000007")]


def test_xfs_get_limit_reads_kib(runner):
    backend = XfsQuota(mount_point="/srv")
    runner.answer(
        _xfs("quota -p -N -n -v -b 12345"),
        stdout="/dev/sdb1                   4    5242880    5242880   00 [--------] /srv\n",
    )
    assert backend.get_limit("/srv/home/alice", uid=12345) == 5 * GIB
    assert runner.calls == [_xfs("quota -p -N -n -v -b 12345")]


def test_xfs_get_limit_of_a_wrapped_line_and_of_no_limit(runner):
    backend = XfsQuota(mount_point="/srv")
    runner.answer(
        _xfs("quota -p -N -n -v -b 1"),
        stdout="/dev/mapper/very-long-volume-name\n                    0          0    1048576   00 [------] /srv\n",
    )
    runner.answer(_xfs("quota -p -N -n -v -b 2"), stdout="/dev/sdb1  0  0  0  00 [------] /srv\n")
    assert backend.get_limit("/srv/home/a", uid=1) == GIB
    assert backend.get_limit("/srv/home/b", uid=2) is None
    assert backend.get_limit("/srv/home/c", uid=3) is None  # no output at all


def test_xfs_get_usage_reads_the_used_column_of_the_same_output(runner):
    backend = XfsQuota(mount_point="/srv")
    assert backend.reports_usage
    runner.answer(
        _xfs("quota -p -N -n -v -b 12345"),
        stdout="/dev/sdb1             1572864    5242880    5242880   00 [--------] /srv\n",
    )
    runner.answer(
        _xfs("quota -p -N -n -v -b 1"),
        stdout="/dev/mapper/very-long-volume-name\n                   10          0    1048576   00 [------] /srv\n",
    )
    assert backend.get_usage("/srv/home/alice", uid=12345) == 3 * GIB // 2
    assert backend.get_usages([("/srv/home/a", 1), ("/srv/home/c", 3)]) == {"/srv/home/a": 10 * 1024,
                                                                            "/srv/home/c": None}
    assert runner.calls == [_xfs("quota -p -N -n -v -b 12345"), _xfs("quota -p -N -n -v -b 1"),
                            _xfs("quota -p -N -n -v -b 3")]


def test_xfs_remove_deletes_the_tree_then_clears_the_limit(runner, tmp_path):
    backend = XfsQuota(mount_point=str(tmp_path))
    home = tmp_path / "alice"
    (home / "sub").mkdir(parents=True)
    backend.remove(str(home), uid=12345)
    assert not home.exists()
    assert runner.calls == [_xfs("limit -p bhard=0 12345", str(tmp_path))]
    backend.remove(str(home), uid=12345)  # already gone: still fine


def test_xfs_check(runner):
    backend = XfsQuota(mount_point="/srv")
    state = "Project quota state on /srv (/dev/sdb1)\n  Accounting: ON\n  Enforcement: {}\n"
    runner.answer(_xfs("state -p"), stdout=state.format("ON"))
    backend.check("/srv/home")
    assert runner.calls == [_xfs("state -p")]
    runner.answer(_xfs("state -p"), stdout=state.format("OFF"))
    with pytest.raises(HostUnavailable, match="prjquota"):
        backend.check("/srv/home")
    with pytest.raises(HostUnavailable, match="not on the xfs"):
        backend.check("/elsewhere")


def test_xfs_refuses_paths_xfs_quota_would_split(runner):
    backend = XfsQuota(mount_point="/srv")
    with pytest.raises(HostUnavailable):
        backend.check("/srv/my homes")
    with pytest.raises(HostError):
        backend.make_home("/srv/it's", uid=1)
    assert runner.calls == []


@pytest.mark.parametrize("uid", [-1, True, "12", 4294967295])
def test_xfs_refuses_bad_uids(runner, uid):
    with pytest.raises(InvalidInput):
        XfsQuota(mount_point="/srv").set_limit("/srv/a", uid=uid, size_gb=1)
    assert runner.calls == []


def test_xfs_refuses_project_zero(runner):
    with pytest.raises(InvalidInput, match="project id 0"):
        XfsQuota(mount_point="/srv").set_limit("/srv/a", uid=0, size_gb=1)


# --- SetQuota: exact argv --------------------------------------------------


def test_setquota_set_limit_in_kib(runner):
    backend = SetQuota(filesystem="/home")
    backend.set_limit("/home/alice", uid=12345, size_gb=1)
    backend.set_limit("/home/alice", uid=12345, size_gb=10)
    assert runner.calls == [
        ["setquota", "-u", "12345", "0", "1048576", "0", "0", "/home"],
        ["setquota", "-u", "12345", "0", "10485760", "0", "0", "/home"],
    ]


def test_setquota_remove_deletes_the_tree_and_leaves_the_uid_no_space(runner, tmp_path):
    """Not 0 0 0 0, which means unlimited: the account outlives its volume (issue 8, finding 11)."""
    backend = SetQuota(filesystem="/home")
    home = tmp_path / "alice"
    home.mkdir()
    (home / "f").write_text("x")
    backend.remove(str(home), uid=12345)
    assert not home.exists()
    assert runner.calls == [["setquota", "-u", "12345", "0", "1", "0", "1", "/home"]]


def test_setquota_a_new_volume_after_a_delete_lifts_the_inode_limit(runner, tmp_path):
    backend = SetQuota(filesystem="/home")
    backend.remove(str(tmp_path / "gone"), uid=12345)
    backend.set_limit("/home/alice", uid=12345, size_gb=2)
    assert runner.calls[-1] == ["setquota", "-u", "12345", "0", "2097152", "0", "0", "/home"]


QUOTA_ARGV = ["quota", "-u", "-v", "-w", "-p", "--filesystem=/home", "12345"]


def test_setquota_get_limit(runner):
    backend = SetQuota(filesystem="/home")
    runner.answer(
        QUOTA_ARGV,
        stdout=(
            "Disk quotas for user #12345 (uid 12345): \n"
            "     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace\n"
            "      /dev/sda2      12       0 2097152       0       3       0       0       0\n"
        ),
    )
    assert backend.get_limit("/home/alice", uid=12345) == 2 * GIB
    assert runner.calls == [QUOTA_ARGV]


def test_setquota_get_limit_when_over_or_none(runner):
    backend = SetQuota(filesystem="/home")
    over = (
        "Disk quotas for user #12345 (uid 12345): \n"
        "     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace\n"
        "      /dev/sda2 1048577*      0 1048576       0       3       0       0       0\n"
    )
    runner.answer(QUOTA_ARGV, rc=1, stdout=over)  # quota exits 1 when over a limit
    assert backend.get_limit("/home/alice", uid=12345) == GIB
    runner.answer(QUOTA_ARGV, stdout="Disk quotas for user #12345 (uid 12345): none\n")
    assert backend.get_limit("/home/alice", uid=12345) is None


def test_setquota_get_usage_reads_the_blocks_column_over_a_limit_too(runner):
    backend = SetQuota(filesystem="/home")
    assert backend.reports_usage
    over = (
        "Disk quotas for user #12345 (uid 12345): \n"
        "     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace\n"
        "      /dev/sda2 1048577*      0 1048576       0       3       0       0       0\n"
    )
    runner.answer(QUOTA_ARGV, rc=1, stdout=over)
    assert backend.get_usage("/home/alice", uid=12345) == GIB + 1024
    runner.answer(QUOTA_ARGV, stdout="Disk quotas for user #12345 (uid 12345): none\n")
    assert backend.get_usage("/home/alice", uid=12345) is None
    runner.answer(QUOTA_ARGV, stdout=over.replace("1048577*", "lots"))
    with pytest.raises(HostError, match="cannot read the quota output"):
        backend.get_usage("/home/alice", uid=12345)


def test_setquota_check(runner):
    backend = SetQuota(filesystem="/home")
    argv = ["quotaon", "-p", "-u", "/home"]
    runner.answer(argv, rc=1, stdout="user quota on /home (/dev/sda2) is on\n")
    backend.check("/home")
    runner.answer(argv, rc=0, stdout="user quota on /home (/dev/sda2) is off\n")
    with pytest.raises(HostUnavailable, match="user quota is off"):
        backend.check("/home")
    assert runner.calls == [argv, argv]


def test_setquota_make_home_runs_nothing(runner, tmp_path):
    SetQuota(filesystem=str(tmp_path)).make_home(str(tmp_path / "a"), uid=5)
    assert (tmp_path / "a").is_dir() and runner.calls == []


# --- btrfs parsers and the checks made before any command -----------------


QGROUPS = """\
Qgroupid    Referenced    Exclusive  Max referenced  Max exclusive   Path 
--------    ----------    ---------  --------------  -------------   ---- 
0/5              16384        16384            none           none   <toplevel>
0/256       1073725440   1073725440      1073741824           none   homes/alice
0/258            16384        16384            none           none   homes/alice/my dir
"""


def test_parse_qgroups():
    assert parse_qgroups(QGROUPS) == {"0/5": None, "0/256": GIB, "0/258": None}


def test_parse_qgroup_rows_keeps_what_each_references():
    assert parse_qgroup_rows(QGROUPS) == {"0/5": (16384, None), "0/256": (1073725440, GIB), "0/258": (16384, None)}


def test_btrfs_reads_the_usage_of_every_home_in_one_listing(runner, monkeypatch, tmp_path):
    backend = BtrfsQuota()
    ids = {str(tmp_path / "alice"): "0/256", str(tmp_path / "bob"): "0/258", str(tmp_path / "plain"): None}
    monkeypatch.setattr(backend, "_home_qgroup", lambda path: ids[path])
    show = ["btrfs", "qgroup", "show", "-re", "--raw", str(tmp_path / "alice")]
    runner.answer(show, stdout=QGROUPS)
    assert backend.get_usages([(p, 1000) for p in ids]) == {
        str(tmp_path / "alice"): 1073725440, str(tmp_path / "bob"): 16384, str(tmp_path / "plain"): None}
    assert runner.calls == [show]
    # No subvolume among them: nothing is run.
    assert backend.get_usages([(str(tmp_path / "plain"), 1000)]) == {str(tmp_path / "plain"): None}
    assert runner.calls == [show]


@pytest.mark.parametrize("backend", [NoQuota(), CommandQuota(program="/bin/true", timeout=1)])
def test_backends_that_cannot_tell_usage_say_none(runner, backend, tmp_path):
    assert not backend.reports_usage
    assert backend.get_usages([(str(tmp_path), 1)]) == {str(tmp_path): None}
    assert runner.calls == []


def test_parse_qgroups_refuses_a_forged_row():
    # A directory named "x\n0/256 0 0 none none" would print this.
    forged = QGROUPS + "0/256 0 0 none none\n"
    with pytest.raises(HostError, match="twice"):
        parse_qgroups(forged)


def test_btrfs_destroys_qgroups_the_kernel_left_behind(runner):
    show = ["btrfs", "qgroup", "show", "-re", "--raw", "/mnt/homes"]
    before = "0/5 16384 16384 none none <toplevel>\n0/300 0 0 1073741824 none <stale>\n"
    runner.answer(show, stdout=before)
    runner.answer(show, stdout="0/5 16384 16384 none none <toplevel>\n", then=True)
    BtrfsQuota()._destroy_qgroups("/mnt/homes", [300, 301])
    assert runner.calls == [
        show,
        ["btrfs", "filesystem", "sync", "/mnt/homes"],
        ["btrfs", "qgroup", "destroy", "0/300", "/mnt/homes"],
        show,
    ]


def test_btrfs_reports_a_qgroup_that_will_not_go(runner):
    show = ["btrfs", "qgroup", "show", "-re", "--raw", "/mnt/homes"]
    runner.answer(show, stdout="0/300 16384 16384 1073741824 none <stale>\n")
    runner.answer(["btrfs", "qgroup", "destroy", "0/300", "/mnt/homes"], rc=1, stderr="ERROR: Device or resource busy")
    with pytest.raises(HostError, match="0/300 remain"):
        BtrfsQuota()._destroy_qgroups("/mnt/homes", [300])


def test_btrfs_with_quotas_disabled_has_no_qgroups_to_destroy(runner):
    show = ["btrfs", "qgroup", "show", "-re", "--raw", "/mnt/homes"]
    runner.answer(show, rc=1, stderr="ERROR: can't list qgroups: quotas not enabled\n")
    BtrfsQuota()._destroy_qgroups("/mnt/homes", [300])
    assert runner.calls == [show]


def test_btrfs_set_limit_refuses_a_plain_directory(runner, tmp_path):
    # A qgroup limit on a plain directory would land on the whole parent subvolume.
    with pytest.raises(HostError, match="not a btrfs subvolume"):
        BtrfsQuota().set_limit(str(tmp_path), uid=1, size_gb=1)
    assert runner.calls == []


def test_btrfs_remove_of_a_plain_directory_removes_the_tree(runner, tmp_path):
    home = tmp_path / "alice"
    (home / "d").mkdir(parents=True)
    BtrfsQuota().remove(str(home), uid=1)
    assert not home.exists() and runner.calls == []


def test_btrfs_nested_subvolumes_of_a_plain_directory_or_nothing(runner, tmp_path):
    (tmp_path / "alice" / "d").mkdir(parents=True)
    backend = BtrfsQuota()
    assert backend.nested_subvolumes(str(tmp_path / "alice")) == ()
    assert backend.nested_subvolumes(str(tmp_path / "missing")) == ()
    (tmp_path / "link").symlink_to(tmp_path / "alice")
    assert backend.nested_subvolumes(str(tmp_path / "link")) == ()
    assert runner.calls == []


@pytest.mark.parametrize("backend", [NoQuota(), XfsQuota(mount_point="/srv"), SetQuota(filesystem="/srv")])
def test_backends_without_subvolumes_have_none_nested(runner, backend, tmp_path):
    assert backend.nested_subvolumes(str(tmp_path)) == ()
    assert runner.calls == []


def test_btrfs_check_maps_a_failure_to_unavailable(runner):
    argv = ["btrfs", "filesystem", "df", "/srv/home"]
    runner.answer(argv, rc=1, stderr="ERROR: not a btrfs filesystem: /srv/home\n")
    with pytest.raises(HostUnavailable, match="not on a usable btrfs"):
        BtrfsQuota().check("/srv/home")
    assert runner.calls == [argv]


# --- NoQuota and FakeQuota -------------------------------------------------


def test_noquota_makes_and_removes_plain_directories(tmp_path):
    backend = NoQuota()
    home = str(tmp_path / "alice")
    backend.make_home(home, uid=12345)
    assert os.path.isdir(home) and os.stat(home).st_mode & 0o777 == 0o700
    with pytest.raises(Conflict):
        backend.make_home(home, uid=12345)
    backend.set_limit(home, uid=12345, size_gb=3)
    assert backend.get_limit(home, uid=12345) is None
    backend.remove(home, uid=12345)
    backend.remove(home, uid=12345)
    assert not os.path.lexists(home)


def test_make_home_in_a_missing_root_is_a_host_error(tmp_path):
    with pytest.raises(HostError, match="No such file"):
        NoQuota().make_home(str(tmp_path / "missing" / "alice"), uid=1)


def test_remove_tree_does_not_follow_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    home = tmp_path / "home"
    (home / "d").mkdir(parents=True)
    (home / "d" / "to-outside").symlink_to(outside)
    (home / "to-etc").symlink_to("/etc")
    (home / "to-file").symlink_to(outside / "keep")
    remove_tree(str(home))
    assert not os.path.lexists(home)
    assert (outside / "keep").read_text() == "precious"
    assert os.path.exists("/etc/passwd")


def test_remove_tree_of_a_symlink_removes_only_the_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    link = tmp_path / "home"
    link.symlink_to(outside)
    remove_tree(str(link))
    assert not os.path.lexists(link) and (outside / "keep").exists()


def test_mounts_below_reads_mountinfo():
    assert "/proc" in mounts_below("/proc")
    assert mounts_below("/proc/self/no-such-dir") == []


def test_fake_quota_keeps_limits_and_fails_on_demand(tmp_path):
    fake = FakeQuota()
    home = str(tmp_path / "alice")
    fake.make_home(home, uid=1)
    fake.set_limit(home, uid=1, size_gb=2)
    assert fake.get_limit(home, uid=1) == 2 * GIB
    fake.fail_on["set_limit"] = HostError("boom")
    with pytest.raises(HostError, match="boom"):
        fake.set_limit(home, uid=1, size_gb=3)
    assert fake.get_limit(home, uid=1) == 2 * GIB
    with pytest.raises(InvalidInput):
        fake.set_limit(home, uid=1, size_gb=0)
    assert fake.nested_subvolumes(home) == ()
    fake.nested[home] = ("x", "x/y")
    assert fake.nested_subvolumes(home) == ("x", "x/y")
    fake.fail_on["nested_subvolumes"] = HostError("moved")
    with pytest.raises(HostError, match="moved"):
        fake.nested_subvolumes(home)
    assert fake.get_usage(home, uid=1) == 0
    fake.used[home] = 5
    assert fake.get_usages([(home, 1)]) == {home: 5}
    fake.remove(home, uid=1)
    assert fake.get_limit(home, uid=1) is None and not os.path.exists(home)
    assert fake.nested == {} and fake.used == {}
    assert fake.get_usage(home, uid=1) is None


# --- BtrfsQuota for real ---------------------------------------------------


def btrfs(*args) -> str:
    proc = subprocess.run(["btrfs", *args], capture_output=True, text=True, check=True)
    return proc.stdout


def qgroups(path) -> dict:
    return parse_qgroups(btrfs("qgroup", "show", "-re", "--raw", path))


def subvolume_id(path) -> int:
    return int(btrfs("inspect-internal", "rootid", path))



@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_backend_lifecycle(btrfs_home_root):
    backend = BtrfsQuota()
    backend.check(btrfs_home_root)
    home = os.path.join(btrfs_home_root, "alice")
    backend.make_home(home, uid=12345)
    assert os.stat(home).st_ino == 256  # a subvolume root
    assert os.stat(home).st_mode & 0o777 == 0o700
    sid = subvolume_id(home)
    backend.set_limit(home, uid=12345, size_gb=3)
    assert backend.get_limit(home, uid=12345) == 3 * GIB
    assert qgroups(home)[f"0/{sid}"] == 3 * GIB
    with open(os.path.join(home, "data"), "wb") as f:
        f.write(os.urandom(4 << 20))
    btrfs("filesystem", "sync", home)
    assert 4 << 20 <= backend.get_usage(home, uid=12345) < 5 << 20
    assert backend.get_usages([(home, 12345), (btrfs_home_root, 0)]) == {
        home: backend.get_usage(home, uid=12345), btrfs_home_root: None}  # home_root: no subvolume
    with pytest.raises(Conflict):
        backend.make_home(home, uid=12345)
    backend.remove(home, uid=12345)
    assert not os.path.lexists(home)
    assert f"0/{sid}" not in qgroups(btrfs_home_root)
    assert backend.get_limit(home, uid=12345) is None
    backend.remove(home, uid=12345)


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_backend_enables_quotas_when_needed(btrfs_home_root):
    btrfs("quota", "disable", btrfs_home_root)
    backend = BtrfsQuota()
    home = os.path.join(btrfs_home_root, "bob")
    backend.make_home(home, uid=12346)
    assert backend.get_limit(home, uid=12346) is None  # quotas are off
    backend.set_limit(home, uid=12346, size_gb=1)
    assert backend.get_limit(home, uid=12346) == GIB
    backend.remove(home, uid=12346)


@pytest.mark.real_commands
@pytest.mark.integration
def test_btrfs_check_refuses_a_non_btrfs_root(tmp_path):
    with pytest.raises(HostUnavailable, match="btrfs"):
        BtrfsQuota().check(str(tmp_path))


# --- removal acts on the recorded uid, never on the tree's owner (issue 16, finding 10) ----

BOB, OTHER = 12345, 23456


def _homes_on(tmp_path, backend) -> "DirectoryHomeVolumes":
    from host_adapters.homes.homes import DirectoryHomeVolumes

    if os.geteuid() != 0:
        pytest.fail("homes are chowned to their uid: run the tests as root", pytrace=False)
    root = tmp_path / "home"
    root.mkdir()
    return DirectoryHomeVolumes(str(root), backend)


def _chown_tree(path, uid) -> None:
    # What root in a guest can do through the home's share.
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, uid)


@pytest.mark.parametrize("kind", ["setquota", "xfs"])
def test_purge_of_a_home_chowned_to_another_uid_changes_only_the_recorded_uid(runner, tmp_path, kind):
    backend = SetQuota(filesystem=str(tmp_path)) if kind == "setquota" else XfsQuota(mount_point=str(tmp_path))
    homes = _homes_on(tmp_path, backend)
    path = homes.create("bob", uid=BOB, gid=BOB, size_gb=1)
    (tmp_path / "home" / "bob" / "f").write_text("x")
    _chown_tree(path, OTHER)
    runner.calls.clear()
    retired = homes.retire("bob", token="vol-1", uid=BOB)
    homes.purge(retired)
    assert not os.path.lexists(retired)
    if kind == "setquota":
        assert runner.calls == [["setquota", "-u", str(BOB), "0", "1", "0", "1", str(tmp_path)]]
    else:
        assert runner.calls == [_xfs(f"limit -p bhard=0 {BOB}", str(tmp_path))]
    assert not [argv for argv in runner.calls if any(str(OTHER) in a for a in argv)]


def test_purge_of_a_home_retired_without_a_uid_changes_no_quota(runner, tmp_path):
    """A home retired before uids were recorded: its tree goes, nobody's quota changes."""
    homes = _homes_on(tmp_path, SetQuota(filesystem=str(tmp_path)))
    homes.create("bob", uid=BOB, gid=BOB, size_gb=1)
    runner.calls.clear()
    retired = homes.retire("bob", token="vol-1", uid=None)
    assert os.path.basename(retired) == ".retired-vol-1"
    homes.purge(retired)
    assert not os.path.lexists(retired)
    assert runner.calls == []


def test_deleting_a_volume_whose_home_guest_root_chowned_removes_only_the_owners_quota(
        runner, tmp_path, cctx, client, adapters):
    """The whole path: POST records the uid in the volume row, DELETE hands it to the removal."""
    from tests.fixtures.api import enable, give_volume, make_caller

    bob = make_caller(cctx, "bob@example.org")
    account = enable(cctx, bob, "bob")
    adapters.homes = _homes_on(tmp_path, SetQuota(filesystem=str(tmp_path)))
    vol = give_volume(client, bob)
    assert cctx.store.volume_of_user(bob.id)["uid"] == account["uid"]
    _chown_tree(adapters.homes.path("bob"), OTHER)
    runner.calls.clear()
    r = client.simulate_delete(f"/v1/storage-volume/{vol['volume-id']}", headers=bob.headers)
    assert r.status_code == 200, r.json
    assert adapters.homes.list_retired() == []
    assert not os.path.lexists(adapters.homes.path("bob"))
    assert runner.calls == [["setquota", "-u", str(account["uid"]), "0", "1", "0", "1", str(tmp_path)]]


def test_migration_records_the_uid_of_existing_volumes_from_their_account(tmp_path):
    import sqlite3

    from controller.store import migrations
    from controller.store import Store

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in enumerate(migrations.MIGRATIONS[:10]):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {version + 1};\nCOMMIT;")
    for n, (user, uid) in enumerate([("u1", 5001), ("u2", 5002), ("u3", None)]):
        conn.execute("INSERT INTO users (id, email, password_hash, api_key, created_at_utc) VALUES (?, ?, 'x', ?, 't')",
                     (user, f"{user}@example.org", f"key-{user}"))
        if uid is not None:
            conn.execute("INSERT INTO system_accounts (user_id, username, uuid, uid, gid, home, cloud_controller_id, "
                         "created_at_utc) VALUES (?, ?, ?, ?, ?, ?, 1, 't')",
                         (user, user, f"uuid-{user}", uid, uid, f"/home/{user}"))
        # u2's volume is at another path than its account's home: its only account still decides.
        mount = f"/home/{user}" if user != "u2" else "/old/u2"
        conn.execute("INSERT INTO volumes (id, owner_id, size_gb, mount_point, creation_date) VALUES (?, ?, 1, ?, 't')",
                     (f"v{n}", user, mount))
    conn.close()
    store = Store(str(path))
    assert store.migrate() == (10, migrations.SCHEMA_VERSION)
    assert {v["id"]: v["uid"] for v in store.list_volumes(visible_to=None)} == {"v0": 5001, "v1": 5002, "v2": None}
    store.close()


def test_a_volume_made_while_the_old_home_is_removed_keeps_its_limit(runner, tmp_path, cctx, client, adapters):
    """setquota's limit is the uid's: removing the old home's quota after the user made a new
    volume must not leave the new one with 1 KiB and one inode."""
    from controller.background import Background
    from tests.fixtures.api import enable, give_volume, hold_purges, make_caller

    cctx.background = Background()
    bob = make_caller(cctx, "bob@example.org")
    uid = str(enable(cctx, bob, "bob")["uid"])
    adapters.homes = _homes_on(tmp_path, SetQuota(filesystem=str(tmp_path)))
    old = give_volume(client, bob, size=1)
    release, purging = hold_purges(adapters.homes)
    assert client.simulate_delete(f"/v1/storage-volume/{old['volume-id']}", headers=bob.headers).status_code == 200
    assert purging.wait(10)
    give_volume(client, bob, size=3)  # while the old tree is still being removed
    release.set()
    cctx.background.wait()
    assert adapters.homes.list_retired() == []
    limits = [argv[2:7] for argv in runner.calls if argv[0] == "setquota"]
    assert limits[-2:] == [[uid, "0", "1", "0", "1"], [uid, "0", str(3 * GIB // 1024), "0", "0"]]
    assert adapters.homes.inspect("bob").exists
