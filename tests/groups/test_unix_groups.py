import inspect
import os
import subprocess

import pytest

from controller.errors import (
    CommandError,
    Conflict,
    HostError,
    HostUnavailable,
    InvalidInput,
    NotFound,
)
from host_adapters import subp
from host_adapters.accounts import sysroot as sysroot_mod
from host_adapters.accounts.directory import FakeDirectory
from host_adapters.accounts.sysroot import make_sysroot
from host_adapters.accounts.local_groups import CommandUnixGroups
from host_adapters.accounts.unix_groups import FakeUnixGroups, UnixGroups

BAD_NAMES = ["bad;name", "-rf", "Root", "a" * 33, "", None, 5, "a b", "../etc", "dev\n"]


def etc_lines(root: str, name: str) -> list[str]:
    with open(os.path.join(root, "etc", name), encoding="utf-8") as f:
        return f.read().splitlines()


def group_line_members(root: str, name: str) -> list[str] | None:
    """Members as the group file lists them, read without the adapter's parser."""
    for line in etc_lines(root, "group"):
        fields = line.split(":")
        if fields[0] == name:
            return [m for m in fields[3].split(",") if m]
    return None


def write_account(root: str, name: str) -> None:
    """An account with its private group, as `useradd -U` leaves them."""
    ids = [int(line.split(":")[2]) for f in ("passwd", "group") for line in etc_lines(root, f)]
    uid = max(ids + [9999]) + 1
    lines = {
        "passwd": f"{name}:x:{uid}:{uid}::/home/{name}:/bin/bash",
        "shadow": f"{name}:!:20000::::::",
        "group": f"{name}:x:{uid}:",
        "gshadow": f"{name}:!::",
    }
    for file, line in lines.items():
        with open(os.path.join(root, "etc", file), "a", encoding="utf-8") as f:
            f.write(line + "\n")


class UnixGroupsContract:
    """Run against each implementation. Subclasses provide the fixtures
    `groups` (the adapter), `add_account(name)` (an account with its private
    group) and `host_members(name)` (members as the host holds them, None when
    there is no group)."""

    def test_create_without_members(self, groups, host_members):
        groups.create("devs")
        assert groups.get("devs") == []
        assert host_members("devs") == []

    def test_create_with_members(self, groups, add_account, host_members):
        add_account("alice")
        add_account("bob")
        groups.create("devs", members=["alice", "bob", "alice"])
        assert groups.get("devs") == ["alice", "bob"]
        assert host_members("devs") == ["alice", "bob"]

    def test_create_existing_is_conflict(self, groups, add_account, host_members):
        add_account("alice")
        groups.create("devs", members=["alice"])
        with pytest.raises(Conflict):
            groups.create("devs")
        assert host_members("devs") == ["alice"]

    def test_create_over_private_group_is_conflict(self, groups, add_account):
        add_account("alice")
        with pytest.raises(Conflict):
            groups.create("alice")

    def test_create_with_unknown_member_leaves_no_group(self, groups, add_account, host_members):
        add_account("alice")
        with pytest.raises(InvalidInput, match="ghost"):
            groups.create("devs", members=["alice", "ghost"])
        assert host_members("devs") is None
        assert groups.get("devs") is None

    @pytest.mark.parametrize("name", BAD_NAMES)
    def test_bad_group_name_refused_before_any_command(self, groups, name, no_commands):
        for call in (
            lambda: groups.get(name),
            lambda: groups.create(name),
            lambda: groups.add_members(name, []),
            lambda: groups.remove_members(name, []),
            lambda: groups.set_members(name, []),
            lambda: groups.delete(name),
        ):
            with pytest.raises(InvalidInput):
                call()

    @pytest.mark.parametrize("member", BAD_NAMES)
    def test_bad_member_name_refused_before_any_command(
        self, groups, member, host_members, no_commands
    ):
        with pytest.raises(InvalidInput):
            groups.create("devs", members=[member])
        assert host_members("devs") is None

    def test_members_as_a_string_refused(self, groups, add_account):
        add_account("alice")
        groups.create("devs")
        with pytest.raises(InvalidInput):
            groups.add_members("devs", "alice")
        with pytest.raises(InvalidInput):
            groups.create("ops", members="alice")

    def test_get_missing(self, groups):
        assert groups.get("nosuch") is None

    def test_add_members_keeps_existing(self, groups, add_account, host_members):
        for user in ("alice", "bob", "carol"):
            add_account(user)
        groups.create("devs", members=["alice"])
        groups.add_members("devs", ["bob", "alice", "carol"])
        assert groups.get("devs") == ["alice", "bob", "carol"]
        assert host_members("devs") == ["alice", "bob", "carol"]

    def test_add_unknown_member_changes_nothing(self, groups, add_account, host_members):
        add_account("alice")
        add_account("bob")
        groups.create("devs", members=["alice"])
        with pytest.raises(InvalidInput, match="ghost"):
            groups.add_members("devs", ["bob", "ghost"])
        assert host_members("devs") == ["alice"]

    def test_member_changes_on_missing_group_are_not_found(self, groups, add_account):
        add_account("alice")
        for call in (groups.add_members, groups.remove_members, groups.set_members):
            with pytest.raises(NotFound):
                call("nosuch", ["alice"])

    def test_remove_members(self, groups, add_account, host_members):
        for user in ("alice", "bob", "carol"):
            add_account(user)
        groups.create("devs", members=["alice", "bob"])
        groups.remove_members("devs", ["alice", "carol", "ghost"])
        assert groups.get("devs") == ["bob"]
        assert host_members("devs") == ["bob"]

    def test_set_members_replaces(self, groups, add_account, host_members):
        for user in ("alice", "bob", "carol"):
            add_account(user)
        groups.create("devs", members=["alice", "bob"])
        groups.set_members("devs", ["carol", "bob"])
        assert host_members("devs") == ["carol", "bob"]
        groups.set_members("devs", [])
        assert host_members("devs") == []
        assert groups.get("devs") == []

    def test_set_unknown_member_changes_nothing(self, groups, add_account, host_members):
        add_account("alice")
        groups.create("devs", members=["alice"])
        with pytest.raises(InvalidInput):
            groups.set_members("devs", ["ghost"])
        assert host_members("devs") == ["alice"]

    def test_delete(self, groups, add_account, host_members):
        add_account("alice")
        groups.create("devs", members=["alice"])
        groups.delete("devs")
        assert host_members("devs") is None
        assert groups.get("devs") is None

    def test_delete_missing_succeeds(self, groups, host_members):
        groups.delete("nosuch")
        groups.create("devs")
        groups.delete("devs")
        groups.delete("devs")
        assert host_members("devs") is None

    def test_delete_primary_group_is_conflict(self, groups, add_account, host_members):
        add_account("alice")
        with pytest.raises(Conflict):
            groups.delete("alice")
        assert host_members("alice") == []

    def test_private_group_members_can_be_read(self, groups, add_account):
        add_account("alice")
        assert groups.get("alice") == []

    def test_list_groups(self, groups, add_account):
        add_account("alice")
        groups.create("devs", members=["alice"])
        listed = groups.list_groups()
        assert listed["devs"] == ["alice"]
        assert listed["alice"] == []

    def test_check(self, groups):
        groups.check()


class TestFakeUnixGroups(UnixGroupsContract):
    @pytest.fixture
    def groups(self):
        return FakeUnixGroups()

    @pytest.fixture
    def add_account(self, groups):
        return lambda name: groups.directory.create_account(name, home=f"/home/{name}")

    @pytest.fixture
    def host_members(self, groups):
        return lambda name: groups.groups.get(name)

    def test_fail_on_raises_before_any_change(self, groups):
        groups.fail_on["create"] = HostError("boom")
        with pytest.raises(HostError, match="boom"):
            groups.create("devs")
        assert groups.get("devs") is None
        del groups.fail_on["create"]
        groups.create("devs")

    def test_extra_users_may_be_members(self):
        groups = FakeUnixGroups(users=["ldapuser"])
        groups.create("devs", members=["ldapuser"])
        assert groups.get("devs") == ["ldapuser"]

    def test_shares_groups_with_its_directory(self):
        directory = FakeDirectory()
        groups = FakeUnixGroups(directory=directory)
        directory.create_account("alice", home="/home/alice")
        groups.create("devs", members=["alice"])
        directory.delete_account("alice")
        assert groups.get("alice") is None
        assert groups.get("devs") == []


@pytest.mark.real_commands
class TestCommandUnixGroups(UnixGroupsContract):
    @pytest.fixture
    def groups(self, sysroot):
        return CommandUnixGroups(sysroot)

    @pytest.fixture
    def add_account(self, sysroot):
        return lambda name: write_account(sysroot, name)

    @pytest.fixture
    def host_members(self, sysroot):
        return lambda name: group_line_members(sysroot, name)

    def test_gshadow_follows(self, groups, add_account, sysroot):
        add_account("alice")
        groups.create("devs", members=["alice"])
        assert "devs:!::alice" in etc_lines(sysroot, "gshadow")
        groups.delete("devs")
        assert not [line for line in etc_lines(sysroot, "gshadow") if line.startswith("devs:")]

    def test_failed_member_setting_removes_the_group(self, groups, sysroot, monkeypatch):
        # Skip the pre-check so the real gpasswd is the one that refuses.
        monkeypatch.setattr(sysroot_mod, "unknown_users", lambda root, names: [])
        with pytest.raises(CommandError):
            groups.create("devs", members=["ghost"])
        assert group_line_members(sysroot, "devs") is None

    def test_check_without_group_file(self, sysroot):
        os.unlink(os.path.join(sysroot, "etc", "group"))
        with pytest.raises(HostUnavailable, match="group"):
            CommandUnixGroups(sysroot).check()

    def test_check_without_root(self, tmp_path):
        with pytest.raises(HostUnavailable, match="system root"):
            CommandUnixGroups(str(tmp_path / "nosuch")).check()

    def test_check_without_binaries(self, sysroot, monkeypatch, tmp_path):
        monkeypatch.setenv("PATH", str(tmp_path))
        with pytest.raises(HostUnavailable, match="groupadd"):
            CommandUnixGroups(sysroot).check()


# Exact argv, no real commands.


class Recorder:
    def __init__(self):
        self.calls: list[list[str]] = []
        self.codes: dict[tuple[str, ...], int] = {}  # argv prefix -> exit code

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        matching = [c for prefix, c in self.codes.items() if tuple(argv[: len(prefix)]) == prefix]
        code = matching[0] if matching else 0
        return subprocess.CompletedProcess(argv, code, "", "simulated failure")


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(subp, "_run", rec)
    return rec


@pytest.fixture
def fake_root(tmp_path) -> str:
    root = make_sysroot(tmp_path / "root")
    write_account(root, "alice")
    write_account(root, "bob")
    with open(os.path.join(root, "etc", "group"), "a", encoding="utf-8") as f:
        f.write("devs:x:20000:alice\n")
    return root


@pytest.fixture(params=["root", "host"])
def mode(request, fake_root, monkeypatch):
    """(adapter, flag args): inside a system root, or on a host whose files are fake_root's."""
    if request.param == "root":
        return CommandUnixGroups(fake_root), {"-R": ["-R", fake_root], "-Q": ["-Q", fake_root]}
    monkeypatch.setattr(sysroot_mod, "HOST_ROOT", fake_root)

    def no_nss(name):
        raise KeyError(name)

    monkeypatch.setattr("pwd.getpwnam", no_nss)
    return CommandUnixGroups(None), {"-R": [], "-Q": []}


def test_argv_create(mode, recorder):
    groups, flag = mode
    groups.create("ops")
    groups.create("web", members=["alice", "bob"])
    assert recorder.calls == [
        ["groupadd", *flag["-R"], "ops"],
        ["groupadd", *flag["-R"], "web"],
        ["gpasswd", *flag["-Q"], "-M", "alice,bob", "web"],
    ]


def test_argv_add_and_remove_members(mode, recorder):
    groups, flag = mode
    groups.add_members("devs", ["alice", "bob"])
    groups.remove_members("devs", ["alice", "bob"])
    assert recorder.calls == [
        ["gpasswd", *flag["-Q"], "-a", "bob", "devs"],
        ["gpasswd", *flag["-Q"], "-d", "alice", "devs"],
    ]


def test_argv_set_members(mode, recorder):
    groups, flag = mode
    groups.set_members("devs", ["bob", "alice"])
    groups.set_members("devs", [])
    assert recorder.calls == [
        ["gpasswd", *flag["-Q"], "-M", "bob,alice", "devs"],
        ["gpasswd", *flag["-Q"], "-M", "", "devs"],
    ]


def test_argv_delete(mode, recorder):
    groups, flag = mode
    groups.delete("devs")
    assert recorder.calls == [["groupdel", *flag["-R"], "devs"]]


def test_unknown_member_on_host(mode, recorder):
    groups, _ = mode
    with pytest.raises(InvalidInput, match="ghost"):
        groups.create("ops", members=["ghost"])
    assert recorder.calls == []


def test_host_mode_accepts_nss_accounts(fake_root, recorder, monkeypatch):
    monkeypatch.setattr(sysroot_mod, "HOST_ROOT", fake_root)
    monkeypatch.setattr("pwd.getpwnam", lambda name: object())
    CommandUnixGroups("").create("ops", members=["ldapuser"])
    assert recorder.calls[-1] == ["gpasswd", "-M", "ldapuser", "ops"]


def test_relative_root_becomes_absolute(fake_root, recorder, monkeypatch):
    monkeypatch.chdir(os.path.dirname(fake_root))
    CommandUnixGroups(os.path.basename(fake_root)).delete("devs")
    assert recorder.calls == [["groupdel", "-R", fake_root, "devs"]]


def test_groupadd_name_in_use_is_conflict(fake_root, recorder):
    recorder.codes[("groupadd",)] = 9  # e.g. a group only NSS knows
    with pytest.raises(Conflict):
        CommandUnixGroups(fake_root).create("ops")


def test_failed_gpasswd_in_create_removes_the_group(fake_root, recorder):
    recorder.codes[("gpasswd",)] = 3
    with pytest.raises(CommandError) as caught:
        CommandUnixGroups(fake_root).create("ops", members=["alice"])
    assert caught.value.argv[0] == "gpasswd"
    assert recorder.calls[-1] == ["groupdel", "-R", fake_root, "ops"]


def test_partial_add_is_undone(fake_root, recorder):
    with open(os.path.join(fake_root, "etc", "group"), "a", encoding="utf-8") as f:
        f.write("ops:x:20001:\n")
    recorder.codes[("gpasswd", "-Q", fake_root, "-a", "bob")] = 10
    with pytest.raises(CommandError):
        CommandUnixGroups(fake_root).add_members("ops", ["alice", "bob"])
    assert recorder.calls == [
        ["gpasswd", "-Q", fake_root, "-a", "alice", "ops"],
        ["gpasswd", "-Q", fake_root, "-a", "bob", "ops"],
        ["gpasswd", "-Q", fake_root, "-d", "alice", "ops"],
    ]


@pytest.mark.parametrize("code, error", [(6, None), (8, Conflict), (10, CommandError)])
def test_groupdel_exit_codes(fake_root, recorder, code, error):
    recorder.codes[("groupdel",)] = code
    groups = CommandUnixGroups(fake_root)
    if error is None:
        groups.delete("devs")
    else:
        with pytest.raises(error):
            groups.delete("devs")


def test_malformed_group_file_is_a_host_error(fake_root, no_commands):
    with open(os.path.join(fake_root, "etc", "group"), "a", encoding="utf-8") as f:
        f.write("broken-line\n")
    with pytest.raises(HostError, match="line"):
        CommandUnixGroups(fake_root).get("devs")


def test_missing_group_file_is_unavailable(tmp_path, no_commands):
    with pytest.raises(HostUnavailable):
        CommandUnixGroups(str(tmp_path)).list_groups()


# The fake and the real class must offer exactly the interface.


def public_methods(cls) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize("cls", [CommandUnixGroups, FakeUnixGroups])
def test_signatures_match_the_interface(cls):
    assert public_methods(cls) == public_methods(UnixGroups)


def test_interface_methods_are_abstract():
    base = UnixGroups()
    for call in (
        base.check,
        base.list_groups,
        lambda: base.get("devs"),
        lambda: base.create("devs"),
        lambda: base.add_members("devs", []),
        lambda: base.remove_members("devs", []),
        lambda: base.set_members("devs", []),
        lambda: base.delete("devs"),
    ):
        with pytest.raises(NotImplementedError):
            call()
