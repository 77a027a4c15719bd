import os

import pytest

from controller.errors import CommandError, Conflict, HostError, HostUnavailable, InvalidInput, NotFound
from host_adapters import subp
from host_adapters.accounts import sysroot as sysroot_mod
from host_adapters.accounts.directory import Directory, FakeDirectory, PosixAccount
from host_adapters.accounts.local_directory import LocalDirectory
from host_adapters.accounts.sysroot import make_sysroot
from tests.fixtures.interfaces import assert_offers_the_interface

BAD_NAMES = ["bad;name", "-rf", "Root", "a" * 33, "", None, 5, "a b", "../etc", "dev\n"]
BAD_HOMES = ["home/alice", "", None, "/home/a:b", "/home/a\nb", 7]
BAD_UIDS = [0, -1, 4294967295, True, "10000", 1.5]


def etc_lines(root: str, name: str) -> list[str]:
    with open(os.path.join(root, "etc", name), encoding="utf-8") as f:
        return f.read().splitlines()


def find_line(root: str, file: str, name: str) -> list[str] | None:
    """The fields of name's line, read without the adapter's parser."""
    for line in etc_lines(root, file):
        fields = line.split(":")
        if fields[0] == name:
            return fields
    return None


def append_line(root: str, file: str, line: str) -> None:
    with open(os.path.join(root, "etc", file), "a", encoding="utf-8") as f:
        f.write(line + "\n")


class DirectoryContract:
    """Run against each implementation. Subclasses provide the fixtures
    `directory`, `host_account(name)` -> (uid, gid, home, shell) or None,
    `host_group(name)` -> members or None, `add_group(name, members)` and
    `add_member(group, user)` (both change the host behind the directory's back)."""

    def test_create_allocates_from_10000(self, directory, host_account, host_group):
        alice = directory.create_account("alice", home="/srv/home/alice")
        assert alice == PosixAccount("alice", 10000, 10000, "/srv/home/alice", "/bin/bash")
        assert host_account("alice") == (10000, 10000, "/srv/home/alice", "/bin/bash")
        assert host_group("alice") == []
        bob = directory.create_account("bob", home="/srv/home/bob")
        assert bob.uid == 10001

    def test_create_with_uid(self, directory, host_account):
        account = directory.create_account("alice", home="/home/alice", uid=23456)
        assert account.uid == 23456
        assert host_account("alice")[0] == 23456
        assert directory.get_account_by_uid(23456) == account

    def test_username_taken(self, directory, host_account):
        first = directory.create_account("alice", home="/home/alice")
        with pytest.raises(Conflict):
            directory.create_account("alice", home="/elsewhere", uid=30000)
        assert directory.get_account("alice") == first
        assert directory.get_account_by_uid(30000) is None

    def test_group_name_taken(self, directory, host_account, add_group, host_group):
        add_group("devs", [])
        with pytest.raises(Conflict):
            directory.create_account("devs", home="/home/devs")
        assert host_account("devs") is None
        assert host_group("devs") == []

    def test_uid_taken(self, directory, host_account):
        directory.create_account("alice", home="/home/alice", uid=20000)
        with pytest.raises(Conflict):
            directory.create_account("bob", home="/home/bob", uid=20000)
        assert host_account("bob") is None

    def test_lookups(self, directory):
        account = directory.create_account("alice", home="/home/alice")
        assert directory.get_account("alice") == account
        assert directory.get_account_by_uid(account.uid) == account
        assert directory.get_account("bob") is None
        assert directory.get_account_by_uid(40000) is None

    def test_delete(self, directory, host_account, host_group):
        directory.create_account("alice", home="/home/alice")
        directory.delete_account("alice")
        assert directory.get_account("alice") is None
        assert host_account("alice") is None
        assert host_group("alice") is None

    def test_delete_missing_succeeds(self, directory):
        directory.delete_account("alice")
        directory.create_account("alice", home="/home/alice")
        directory.delete_account("alice")
        directory.delete_account("alice")

    def test_delete_removes_private_group_with_other_members(
        self, directory, add_group, add_member, host_group
    ):
        directory.create_account("alice", home="/home/alice")
        directory.create_account("bob", home="/home/bob")
        add_group("devs", ["alice", "bob"])
        # Someone put bob into alice's private group: userdel then keeps it.
        add_member("alice", "bob")
        assert host_group("alice") == ["bob"]
        directory.delete_account("alice")
        assert host_group("alice") is None
        assert host_group("devs") == ["bob"]

    def test_delete_leaves_a_group_that_is_not_the_accounts(self, directory, add_group, host_group):
        add_group("carol", [])
        directory.delete_account("carol")
        assert host_group("carol") == []

    @pytest.mark.parametrize("name", BAD_NAMES)
    def test_bad_username_refused_before_any_command(self, directory, name, no_commands):
        with pytest.raises(InvalidInput):
            directory.create_account(name, home="/home/x")
        with pytest.raises(InvalidInput):
            directory.get_account(name)
        with pytest.raises(InvalidInput):
            directory.delete_account(name)
        with pytest.raises(InvalidInput):
            directory.lock_account(name)
        with pytest.raises(InvalidInput):
            directory.unlock_account(name)

    # -- uids are never reused (issue 8, finding 7) --
    def test_a_removed_accounts_uid_is_never_handed_out_again(self, directory):
        directory.create_account("alice", home="/home/alice")
        bob = directory.create_account("bob", home="/home/bob")
        # bob held the highest uid: allocating "the highest + 1" or "the lowest free" would reuse it.
        directory.delete_account("bob")
        carol = directory.create_account("carol", home="/home/carol")
        assert carol.uid == bob.uid + 1
        directory.delete_account("alice")
        directory.delete_account("carol")
        assert directory.create_account("dave", home="/home/dave").uid == carol.uid + 1

    # -- locking logins (issue 8, finding 9) --
    def test_lock_and_unlock(self, directory, host_account):
        alice = directory.create_account("alice", home="/home/alice")
        assert alice.locked is False
        directory.lock_account("alice")
        directory.lock_account("alice")  # already locked: fine
        locked = directory.get_account("alice")
        assert locked.locked is True
        assert (locked.uid, locked.gid, locked.home, locked.shell) == (alice.uid, alice.gid, alice.home, alice.shell)
        assert directory.get_account_by_uid(alice.uid).locked is True
        directory.unlock_account("alice")
        directory.unlock_account("alice")  # not locked: fine
        assert directory.get_account("alice") == alice

    def test_lock_of_a_missing_account_is_not_found(self, directory):
        with pytest.raises(NotFound):
            directory.lock_account("ghost")
        with pytest.raises(NotFound):
            directory.unlock_account("ghost")

    @pytest.mark.parametrize("home", BAD_HOMES)
    def test_bad_home_refused(self, directory, home, host_account, no_commands):
        with pytest.raises(InvalidInput):
            directory.create_account("alice", home=home)
        assert host_account("alice") is None

    @pytest.mark.parametrize("uid", BAD_UIDS)
    def test_bad_uid_refused(self, directory, uid, host_account, no_commands):
        with pytest.raises(InvalidInput):
            directory.create_account("alice", home="/home/alice", uid=uid)
        with pytest.raises(InvalidInput):
            directory.get_account_by_uid(uid)
        assert host_account("alice") is None

    def test_check(self, directory):
        directory.check()


class TestFakeDirectory(DirectoryContract):
    @pytest.fixture
    def directory(self):
        return FakeDirectory()

    @pytest.fixture
    def host_account(self, directory):
        def read(name):
            a = directory.accounts.get(name)
            return None if a is None else (a.uid, a.gid, a.home, a.shell)

        return read

    @pytest.fixture
    def host_group(self, directory):
        return lambda name: directory.groups.get(name)

    @pytest.fixture
    def add_group(self, directory):
        return lambda name, members: directory.groups.__setitem__(name, list(members))

    @pytest.fixture
    def add_member(self, directory):
        return lambda group, user: directory.groups[group].append(user)

    def test_fail_on_raises_before_any_change(self, directory):
        directory.fail_on["create_account"] = HostError("boom")
        with pytest.raises(HostError, match="boom"):
            directory.create_account("alice", home="/home/alice")
        assert directory.accounts == {} and directory.groups == {}


@pytest.mark.real_commands
class TestLocalDirectory(DirectoryContract):
    @pytest.fixture
    def directory(self, sysroot):
        return LocalDirectory(sysroot)

    @pytest.fixture
    def host_account(self, sysroot):
        def read(name):
            fields = find_line(sysroot, "passwd", name)
            if fields is None:
                return None
            return (int(fields[2]), int(fields[3]), fields[5], fields[6])

        return read

    @pytest.fixture
    def host_group(self, sysroot):
        def read(name):
            fields = find_line(sysroot, "group", name)
            return None if fields is None else [m for m in fields[3].split(",") if m]

        return read

    @pytest.fixture
    def add_group(self, sysroot):
        def add(name, members):
            subp.run(["groupadd", "-R", sysroot, name])
            subp.run(["gpasswd", "-Q", sysroot, "-M", ",".join(members), name])

        return add

    @pytest.fixture
    def add_member(self, sysroot):
        return lambda group, user: subp.run(["gpasswd", "-Q", sysroot, "-a", user, group])

    def test_shadow_entries_follow(self, directory, sysroot):
        directory.create_account("alice", home="/home/alice")
        assert find_line(sysroot, "shadow", "alice") is not None
        assert find_line(sysroot, "gshadow", "alice") is not None
        directory.delete_account("alice")
        assert find_line(sysroot, "shadow", "alice") is None
        assert find_line(sysroot, "gshadow", "alice") is None

    def test_no_home_is_created(self, directory, tmp_path):
        home = tmp_path / "home" / "alice"
        directory.create_account("alice", home=str(home))
        assert not home.exists()

    def test_lock_expires_the_account_and_locks_its_password(self, directory, sysroot):
        directory.create_account("alice", home="/home/alice")
        subp.run(["usermod", "-R", sysroot, "-p", "$6$salt$hash", "alice"])
        directory.lock_account("alice")
        fields = find_line(sysroot, "shadow", "alice")
        assert fields[1] == "!$6$salt$hash" and fields[7] == "1"
        directory.unlock_account("alice")
        fields = find_line(sysroot, "shadow", "alice")
        assert fields[1] == "$6$salt$hash" and fields[7] == ""

    def test_unlock_leaves_an_expiry_an_admin_set(self, directory, sysroot):
        directory.create_account("alice", home="/home/alice")
        subp.run(["usermod", "-R", sysroot, "-e", "2031-01-01", "alice"])
        expire = find_line(sysroot, "shadow", "alice")[7]
        assert directory.get_account("alice").locked is False
        directory.unlock_account("alice")
        assert find_line(sysroot, "shadow", "alice")[7] == expire

    def test_uid_mark_file_is_kept_in_the_system_root(self, directory, sysroot):
        directory.create_account("alice", home="/home/alice", uid=12000)
        mark = os.path.join(sysroot, "var", "lib", "cloud-controller", "uid-mark")
        with open(mark) as f:
            assert f.read() == "12000\n"
        directory.delete_account("alice")
        assert directory.create_account("bob", home="/home/bob").uid == 12001
        with open(mark) as f:
            assert f.read() == "12001\n"

    def test_private_group_removed_when_userdel_keeps_it(self, directory, sysroot):
        login_defs = os.path.join(sysroot, "etc", "login.defs")
        with open(login_defs, encoding="utf-8") as f:
            text = f.read().replace("USERGROUPS_ENAB yes", "USERGROUPS_ENAB no")
        with open(login_defs, "w", encoding="utf-8") as f:
            f.write(text)
        directory.create_account("alice", home="/home/alice")
        directory.delete_account("alice")
        assert find_line(sysroot, "group", "alice") is None

    def test_check_without_passwd(self, sysroot):
        os.unlink(os.path.join(sysroot, "etc", "passwd"))
        with pytest.raises(HostUnavailable, match="passwd"):
            LocalDirectory(sysroot).check()

    def test_check_without_binaries(self, sysroot, monkeypatch, tmp_path):
        monkeypatch.setenv("PATH", str(tmp_path))
        with pytest.raises(HostUnavailable, match="useradd"):
            LocalDirectory(sysroot).check()


def test_make_sysroot_files_and_modes(tmp_path):
    root = make_sysroot(tmp_path / "r")
    assert root == str(tmp_path / "r")
    etc = os.path.join(root, "etc")
    modes = {name: os.stat(os.path.join(etc, name)).st_mode & 0o777 for name in os.listdir(etc)}
    assert modes == {
        "passwd": 0o644,
        "group": 0o644,
        "shadow": 0o640,
        "gshadow": 0o640,
        "login.defs": 0o644,
    }
    assert etc_lines(root, "passwd") == ["root:x:0:0:root:/root:/bin/bash"]
    assert etc_lines(root, "group") == ["root:x:0:"]


def test_make_sysroot_keeps_existing_accounts(tmp_path):
    root = make_sysroot(tmp_path / "r")
    append_line(root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    os.unlink(os.path.join(root, "etc", "gshadow"))
    make_sysroot(root)
    assert find_line(root, "passwd", "alice") is not None
    assert etc_lines(root, "gshadow") == ["root:*::"]


# Exact argv, no real commands (the `recorder` of tests/fixtures/commands.py).


@pytest.fixture
def fake_root(tmp_path) -> str:
    return make_sysroot(tmp_path / "root")


def pretend_useradd(root: str, uid: int = 10000):
    """What useradd -U writes, for a recorder standing in for it."""

    def effect():
        append_line(root, "passwd", f"alice:x:{uid}:{uid}::/home/alice:/bin/bash")
        append_line(root, "group", f"alice:x:{uid}:")

    return effect


@pytest.fixture(params=["root", "host"])
def mode(request, fake_root, monkeypatch):
    """(directory, -R args): inside a system root, or on a host whose files are fake_root's."""
    if request.param == "root":
        return LocalDirectory(fake_root), ["-R", fake_root]
    monkeypatch.setattr(sysroot_mod, "HOST_ROOT", fake_root)
    return LocalDirectory(None), []


def test_argv_create(mode, fake_root, recorder):
    """The controller picks the uid itself (-u): above its mark, never reusing one."""
    directory, r = mode
    recorder.effects["useradd"] = pretend_useradd(fake_root)
    account = directory.create_account("alice", home="/home/alice")
    assert account.uid == 10000
    assert recorder.calls == [
        ["useradd", *r, "-U", "-M", "-d", "/home/alice", "-s", "/bin/bash", "-u", "10000", "alice"]
    ]


def test_argv_create_with_uid_and_shell(fake_root, recorder):
    recorder.effects["useradd"] = pretend_useradd(fake_root, 12345)
    directory = LocalDirectory(fake_root, shell="/bin/zsh")
    directory.create_account("alice", home="/h/alice", uid=12345)
    assert recorder.calls == [
        ["useradd", "-R", fake_root, "-U", "-M", "-d", "/h/alice", "-s", "/bin/zsh", "-u", "12345",
         "alice"]
    ]


def test_argv_lock_and_unlock(mode, fake_root, recorder):
    directory, r = mode
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    append_line(fake_root, "shadow", "alice:!:20000::::::")
    directory.lock_account("alice")
    assert recorder.calls == [["usermod", *r, "-L", "-e", "1", "alice"]]
    directory.unlock_account("alice")  # the recorder changed nothing: not locked, nothing to undo
    assert len(recorder.calls) == 1
    append_line(fake_root, "passwd", "bob:x:10001:10001::/home/bob:/bin/bash")
    append_line(fake_root, "shadow", "bob:!:20000:::::1:")
    directory.lock_account("bob")  # already locked
    directory.unlock_account("bob")
    assert recorder.calls[1:] == [["usermod", *r, "-U", "-e", "", "bob"]]


def test_usermod_of_a_vanished_account_is_not_found(fake_root, recorder):
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    recorder.codes[("usermod",)] = 6
    with pytest.raises(NotFound):
        LocalDirectory(fake_root).lock_account("alice")


def test_argv_create_skips_uids_only_nss_knows(fake_root, recorder):
    answers = iter([4, 4, 0])

    def useradd():
        code = next(answers)
        recorder.codes[("useradd",)] = code
        if code == 0:
            pretend_useradd(fake_root, 10002)()

    recorder.effects["useradd"] = useradd
    assert LocalDirectory(fake_root).create_account("alice", home="/home/alice").uid == 10002
    assert [c[-2] for c in recorder.calls] == ["10000", "10001", "10002"]


def test_argv_create_goes_above_the_mark_and_the_highest_uid(fake_root, recorder):
    append_line(fake_root, "passwd", "old:x:10040:10040::/home/old:/bin/bash")
    os.makedirs(os.path.join(fake_root, "var", "lib", "cloud-controller"))
    with open(os.path.join(fake_root, "var", "lib", "cloud-controller", "uid-mark"), "w") as f:
        f.write("10100\n")
    recorder.effects["useradd"] = pretend_useradd(fake_root, 10101)
    LocalDirectory(fake_root).create_account("alice", home="/home/alice")
    assert recorder.calls[0][-3:] == ["-u", "10101", "alice"]


def test_a_used_up_range_is_a_host_error(fake_root, no_commands):
    os.makedirs(os.path.join(fake_root, "var", "lib", "cloud-controller"))
    with open(os.path.join(fake_root, "var", "lib", "cloud-controller", "uid-mark"), "w") as f:
        f.write("59999\n")  # UID_MAX of the scratch root
    with pytest.raises(HostError, match="no uid left above the highest ever given out in 10000-59999"):
        LocalDirectory(fake_root).create_account("alice", home="/home/alice")


def test_a_garbled_mark_is_a_host_error_not_a_guess(fake_root, no_commands):
    os.makedirs(os.path.join(fake_root, "var", "lib", "cloud-controller"))
    with open(os.path.join(fake_root, "var", "lib", "cloud-controller", "uid-mark"), "w") as f:
        f.write("lots\n")
    with pytest.raises(HostError, match="not a number"):
        LocalDirectory(fake_root).create_account("alice", home="/home/alice")


def test_argv_delete(mode, fake_root, recorder):
    directory, r = mode
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    append_line(fake_root, "group", "alice:x:10000:")
    directory.delete_account("alice")
    # The recorder removes nothing, so the group is still there after userdel.
    assert recorder.calls == [["userdel", *r, "alice"], ["groupdel", *r, "alice"]]


def test_delete_skips_groupdel_when_userdel_removed_the_group(fake_root, recorder):
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    with open(os.path.join(fake_root, "etc", "passwd"), encoding="utf-8") as f:
        kept = f.read().replace("alice:x:10000:10000::/home/alice:/bin/bash\n", "")

    def userdel():
        with open(os.path.join(fake_root, "etc", "passwd"), "w", encoding="utf-8") as f:
            f.write(kept)

    recorder.effects["userdel"] = userdel
    LocalDirectory(fake_root).delete_account("alice")
    assert [c[0] for c in recorder.calls] == ["userdel"]


@pytest.mark.parametrize("code", [4, 9])
def test_useradd_conflict_codes(fake_root, recorder, code):
    # Taken only in NSS (e.g. LDAP), so the file pre-check passed.
    recorder.codes[("useradd",)] = code
    with pytest.raises(Conflict):
        LocalDirectory(fake_root).create_account("alice", home="/home/alice", uid=20000)
    assert [c[0] for c in recorder.calls] == ["useradd"]


def test_failed_useradd_leaves_nothing(fake_root, recorder):
    recorder.effects["useradd"] = pretend_useradd(fake_root)
    recorder.codes[("useradd",)] = 10  # wrote passwd, then could not update group
    with pytest.raises(CommandError):
        LocalDirectory(fake_root).create_account("alice", home="/home/alice")
    assert recorder.calls[1:] == [
        ["userdel", "-R", fake_root, "alice"],
        ["groupdel", "-R", fake_root, "alice"],
    ]


@pytest.mark.parametrize("code, error", [(6, None), (8, Conflict), (10, CommandError)])
def test_userdel_exit_codes(fake_root, recorder, code, error):
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    recorder.codes[("userdel",)] = code
    directory = LocalDirectory(fake_root)
    if error is None:
        directory.delete_account("alice")
    else:
        with pytest.raises(error):
            directory.delete_account("alice")


def test_conflicts_found_before_any_command(fake_root, no_commands):
    append_line(fake_root, "passwd", "alice:x:10000:10000::/home/alice:/bin/bash")
    append_line(fake_root, "group", "devs:x:10001:")
    directory = LocalDirectory(fake_root)
    for username, uid in (("alice", None), ("devs", None), ("bob", 10000)):
        with pytest.raises(Conflict):
            directory.create_account(username, home="/home/x", uid=uid)


@pytest.mark.parametrize("shell", ["bash", "/bin/a:b", ""])
def test_bad_shell_refused(shell):
    with pytest.raises(InvalidInput):
        LocalDirectory(None, shell=shell)


def test_missing_passwd_is_unavailable(tmp_path, no_commands):
    with pytest.raises(HostUnavailable):
        LocalDirectory(str(tmp_path)).get_account("alice")


def test_system_account_is_a_name_held_below_uid_min(mode, fake_root, recorder):
    """Below login.defs' UID_MIN (10000 in a scratch root) is the system's; on the host, a name
    only NSS knows counts too. Nothing is run or written."""
    directory, _ = mode
    append_line(fake_root, "passwd", "svc:x:9999:9999::/nonexistent:/usr/sbin/nologin")
    append_line(fake_root, "passwd", "carol:x:10000:10000::/home/carol:/bin/bash")
    before = {name: etc_lines(fake_root, name) for name in ("passwd", "group")}
    assert directory.system_account("root") and directory.system_account("svc")
    assert not directory.system_account("carol") and not directory.system_account("nosuchname")
    # daemon is in the host's own passwd (uid 1), not in the fake root's files.
    assert directory.system_account("daemon") == (directory.root is None)
    with pytest.raises(InvalidInput):
        directory.system_account("Bad")
    assert recorder.calls == [] and {name: etc_lines(fake_root, name) for name in ("passwd", "group")} == before


def test_fake_directory_system_account():
    directory = FakeDirectory()
    directory.accounts["svc"] = PosixAccount("svc", 500, 500, "/nonexistent", "/usr/sbin/nologin")
    directory.create_account("alice", home="/home/alice")
    assert directory.system_account("svc") and not directory.system_account("alice")
    assert not directory.system_account("nobody")


# The fake and the real class must offer exactly the interface.


@pytest.mark.parametrize("cls", [LocalDirectory, FakeDirectory])
def test_signatures_match_the_interface(cls):
    assert_offers_the_interface(cls, Directory)
