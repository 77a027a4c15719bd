"""A host's files channel (host_adapters/files/host_files.py): one contract, run against direct file
access on this machine, against ssh to another (a stand-in `ssh` first on PATH that checks
its arguments and runs the remote command with `sh -c` here, so the real commands, their
quoting and their bounds meet real files, a FIFO and a symbolic link), and against the
in-memory fake; and which channel each libvirt URI gets.
"""

import os
import stat
import time

import pytest

from common.errors import HostError, HostUnavailable, InvalidInput
from host_adapters.files.fake_host_files import FakeHostFiles
from host_adapters.files.host_files_choice import host_files_for
from host_adapters.files.local_host_files import LocalHostFiles
from host_adapters.files.ssh_host_files import SshHostFiles

# Checks its arguments as the channel must give them, records them, runs the remote command.
FAKE_SSH = r"""#!/bin/sh
printf '%s\0' "$@" > "$SSH_ARGV_LOG"
[ "$1" = -o ] && [ "$2" = BatchMode=yes ] || { echo "no batch mode" >&2; exit 255; }
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do shift; done
[ "$#" -eq 3 ] || { echo "want: -- HOST COMMAND, got $#" >&2; exit 255; }
[ -n "$SSH_FAIL" ] && { echo "ssh: connect to host $2 port 22: Connection refused" >&2; exit 255; }
[ -n "$SSH_EXTRA" ] && { sh -c "$3"; printf 'more than asked'; exit 0; }
[ -n "$SSH_AS_NOBODY" ] && exec setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "$3"
exec sh -c "$3"
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh-argv"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SSH_ARGV_LOG", str(log))
    return log


def last_argv(log) -> list[str]:
    return [a.decode() for a in log.read_bytes().split(b"\0")[:-1]]


class Real:
    """The local and ssh channels on a real folder."""

    def __init__(self, files, root):
        self.files, self.root = files, root

    def put(self, folder, name, data: bytes):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)

    def fifo(self, folder, name):
        os.mkfifo(os.path.join(folder, name))

    def symlink(self, folder, name, target):
        os.symlink(target, os.path.join(folder, name))

    def exists(self, folder, name):
        return os.path.lexists(os.path.join(folder, name))


class Memory(Real):
    def put(self, folder, name, data):
        self.files.write(folder, name, data)

    def fifo(self, folder, name):
        self.files.special[f"{folder}/{name}"] = "a FIFO"

    def symlink(self, folder, name, target):
        self.files.special[f"{folder}/{name}"] = "a symbolic link"

    def exists(self, folder, name):
        return f"{folder}/{name}" in self.files.files or f"{folder}/{name}" in self.files.special


@pytest.fixture(params=["local", "ssh", "fake"])
def channel(request, tmp_path):
    # A folder whose path needs quoting in a shell: a space, a quote, a `$`.
    root = tmp_path / "pool 'x' $HOME"
    root.mkdir()
    if request.param != "fake" and os.geteuid() != 0:
        pytest.fail("a console folder is made root's: the real channels need root (run the tests as root)")
    if request.param == "local":
        return Real(LocalHostFiles(), str(root))
    if request.param == "ssh":
        request.getfixturevalue("fake_ssh")
        return Real(SshHostFiles("node01", user="admin", port=2222, timeout=10), str(root))
    return Memory(FakeHostFiles(), str(root))


pytestmark = pytest.mark.real_commands  # the ssh stand-in runs `sh`; no daemon, no lock


def test_a_folder_is_made_0700_once_and_a_symbolic_link_in_its_place_is_refused(channel, tmp_path):
    folder = f"{channel.root}-console"
    channel.files.ensure_folder(folder)
    channel.files.ensure_folder(folder)  # already there: nothing to do
    if isinstance(channel, Memory):
        assert folder in channel.files.folders
        return
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700 and os.path.isdir(folder)
    os.symlink(tmp_path, f"{channel.root}-link")
    with pytest.raises(HostError, match="not a folder"):
        channel.files.ensure_folder(f"{channel.root}-link")


NOBODY = 65534  # an owner that is not root's, as a folder made by hand or another tool may have


@pytest.mark.parametrize("mode", [0o777, 0o2775, 0o755])
def test_an_existing_folder_others_could_write_or_own_is_made_root_s_with_mode_0700(channel, mode):
    """A console folder made before the controller (by hand, by a tool, with the pool folder's
    loose modes) let any local user plant a file in it: it is taken over, its files kept."""
    folder = f"{channel.root}-console"
    if isinstance(channel, Memory):
        channel.files.folders.add(folder)
        channel.files.loose.add(folder)
        channel.files.write(folder, "c.log", b"kept")
        channel.files.ensure_folder(folder)
        assert folder in channel.files.folders and folder not in channel.files.loose
        assert channel.files.read(folder, "c.log", 0, 10) == b"kept"
        return
    os.mkdir(folder)
    channel.put(folder, "c.log", b"kept")
    os.chown(folder, NOBODY, NOBODY)
    os.chmod(folder, mode)
    channel.files.ensure_folder(folder)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (0, 0)
    assert stat.S_IMODE(st.st_mode) == 0o700  # no set-group-ID bit kept either
    assert channel.files.read(folder, "c.log", 0, 10) == b"kept"


def test_a_symbolic_link_or_a_file_in_the_folder_s_place_is_refused_and_what_it_names_left_alone(channel, tmp_path):
    folder = f"{channel.root}-console"
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chown(target, NOBODY, NOBODY)
    target.chmod(0o777)
    if isinstance(channel, Memory):
        channel.files.special[folder] = "a symbolic link"
    else:
        os.symlink(target, folder)
    with pytest.raises(HostError, match="is not a folder .*refused; move it away"):
        channel.files.ensure_folder(folder)
    st = os.stat(target)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o777)
    if isinstance(channel, Memory):
        assert folder not in channel.files.folders
        return
    assert os.path.islink(folder)
    os.unlink(folder)
    with open(folder, "wb") as f:
        f.write(b"a file")
    with pytest.raises(HostError, match="is not a folder"):
        channel.files.ensure_folder(folder)
    with open(folder, "rb") as f:
        assert f.read() == b"a file"


def test_a_hard_linked_log_is_refused_and_the_file_it_names_is_never_read(channel, tmp_path):
    """A local user who could write in the folder planted `<prefix>console-<id>.log` as a hard
    link to a file root can read: the instance's owner would have read it as the console."""
    folder = f"{channel.root}-console"
    channel.files.ensure_folder(folder)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's secret")
    secret.chmod(0o600)
    if isinstance(channel, Memory):
        channel.put(folder, "c.log", secret.read_bytes())
        channel.files.linked.add(f"{folder}/c.log")
    else:
        os.link(secret, os.path.join(folder, "c.log"))
    with pytest.raises(HostError, match="is a hard link"):
        channel.files.sizes(folder, ["c.log"])
    with pytest.raises(HostError, match="is a hard link"):
        channel.files.read(folder, "c.log", 0, 100)
    channel.files.remove(folder, ["c.log"])  # only the name goes
    assert not channel.exists(folder, "c.log") and secret.read_bytes() == b"root's secret"
    # A file with one name again (the hypervisor's own) is read as before.
    channel.put(folder, "c.log", b"guest output")
    assert channel.files.read(folder, "c.log", 0, 100) == b"guest output"


def test_sizes_reads_and_removes_of_regular_files(channel):
    folder = f"{channel.root}-console"
    channel.files.ensure_folder(folder)
    channel.put(folder, "c.log", b"0123456789")
    channel.put(folder, "c.log.0", b"")
    assert channel.files.sizes(folder, ["c.log.1", "c.log.0", "c.log"]) == [None, 0, 10]
    assert channel.files.read(folder, "c.log", 3, 4) == b"3456"
    assert channel.files.read(folder, "c.log", 8, 100) == b"89"  # it ends first
    assert channel.files.read(folder, "c.log", 0, 0) == b""
    assert channel.files.read(folder, "c.log.2", 0, 10) == b""  # not there
    assert channel.files.sizes(f"{folder}-missing", ["c.log"]) == [None]
    assert channel.files.read(f"{folder}-missing", "c.log", 0, 1) == b""
    channel.files.remove(folder, ["c.log", "c.log.0", "c.log.2"])
    assert not channel.exists(folder, "c.log") and not channel.exists(folder, "c.log.0")
    channel.files.remove(f"{folder}-missing", ["c.log"])  # nothing there: done


def test_a_fifo_or_a_symbolic_link_is_refused_and_nothing_blocks(channel, tmp_path):
    folder = f"{channel.root}-console"
    channel.files.ensure_folder(folder)
    channel.fifo(folder, "fifo.log")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the guest's")
    channel.symlink(folder, "link.log", str(secret))
    began = time.monotonic()
    for name in ("fifo.log", "link.log"):
        with pytest.raises(HostError, match="not a regular file"):
            channel.files.sizes(folder, [name])
        with pytest.raises(HostError, match="not a regular file"):
            channel.files.read(folder, name, 0, 10)
    assert time.monotonic() - began < 5
    channel.files.remove(folder, ["fifo.log", "link.log"])  # removed, never opened
    assert not channel.exists(folder, "fifo.log") and not channel.exists(folder, "link.log")
    assert secret.read_bytes() == b"not the guest's"


def test_names_and_folders_are_checked_before_the_host_is_asked(channel):
    for bad in ("../x", "a/b", "", ".hidden", "x\n", "-rf"):
        with pytest.raises(InvalidInput):
            channel.files.read(channel.root, bad, 0, 1)
    for bad in ("relative", "/a/../b", "/a/./b", "/a//b", "/a\nb", None):
        with pytest.raises(InvalidInput):
            channel.files.sizes(bad, ["c.log"])
    with pytest.raises(InvalidInput):
        channel.files.read(channel.root, "c.log", -1, 1)


# -- ssh alone ---------------------------------------------------------------------------------------
def test_ssh_runs_one_fixed_command_in_batch_mode_with_the_folder_quoted(fake_ssh, tmp_path):
    folder = tmp_path / "a b; touch PWNED"
    folder.mkdir()
    (folder / "c.log").write_bytes(b"hello")
    files = SshHostFiles("node01", user="admin", port=2222, timeout=10)
    assert files.read(str(folder), "c.log", 1, 3) == b"ell"
    argv = last_argv(fake_ssh)
    assert argv[:9] == ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-l", "admin", "--"]
    assert argv[9] == "node01" and len(argv) == 11
    assert "'" + str(folder) + "'" in argv[10] and "head -c 3" in argv[10]
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")
    root = SshHostFiles("node02")
    assert root.argv("true") == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", "node02", "true"]


def test_a_folder_the_ssh_user_cannot_make_root_s_is_refused_saying_what_to_do(fake_ssh, monkeypatch):
    import shutil
    import tempfile

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.fail("needs root and setpriv (the stand-in ssh runs the command as nobody): run the tests as "
                    "root; scripts/setup-host.sh installs util-linux")
    top = tempfile.mkdtemp()  # tmp_path's parents are root's 0700: the ssh user here is nobody
    try:
        os.chmod(top, 0o755)
        folder = os.path.join(top, "pool-console")
        os.mkdir(folder)
        os.chown(folder, NOBODY, NOBODY)
        os.chmod(folder, 0o777)
        monkeypatch.setenv("SSH_AS_NOBODY", "1")
        with pytest.raises(HostError, match=r"not root's with mode 0700 .* over ssh as admin: connect as root, "
                                            r"or run `chown root:root .*pool-console && chmod 0700"):
            SshHostFiles("node01", user="admin", timeout=10).ensure_folder(folder)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o777  # left as found: nothing half done
    finally:
        shutil.rmtree(top)


def test_a_host_that_sends_more_than_asked_is_refused(fake_ssh, tmp_path, monkeypatch):
    (tmp_path / "c.log").write_bytes(b"0123456789")
    monkeypatch.setenv("SSH_EXTRA", "1")
    with pytest.raises(HostError, match="more than the 4 bytes"):
        SshHostFiles("node01", timeout=10).read(str(tmp_path), "c.log", 0, 4)


def test_a_host_ssh_cannot_reach_is_503_naming_the_host_and_what_to_set_up(fake_ssh, tmp_path, monkeypatch):
    monkeypatch.setenv("SSH_FAIL", "1")
    with pytest.raises(HostUnavailable, match=r"node07 over ssh \(ssh: connect to host node07.*root's known_hosts"):
        SshHostFiles("node07", user="root", timeout=10).sizes(str(tmp_path), ["c.log"])


def test_a_command_that_does_not_end_is_stopped_at_its_timeout(fake_ssh, tmp_path):
    fifo = tmp_path / "hang"
    os.mkfifo(fifo)
    files = SshHostFiles("node01", timeout=1)
    began = time.monotonic()
    # Past the regular-file check (a race on the host): the read blocks; the bound ends it.
    with pytest.raises(HostUnavailable, match="timed out"):
        files._run("read", f"cat {fifo}; cat {fifo}", max_bytes=10)
    assert time.monotonic() - began < 5
    # Nothing it started is left waiting on the FIFO: no writer finds a reader.
    time.sleep(0.2)
    with pytest.raises(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("host, user, port", [("-oProxyCommand=x", None, None), ("node01", "-x", None),
                                              ("node01", None, 0), ("a b", None, None)])
def test_ssh_refuses_hosts_users_and_ports_that_could_be_options(host, user, port):
    with pytest.raises(InvalidInput):
        SshHostFiles(host, user=user, port=port)


# -- which channel -----------------------------------------------------------------------------------
@pytest.mark.parametrize("uri, kind, where", [
    ("qemu:///system", LocalHostFiles, None),
    ("qemu+unix:///system?socket=/run/x.sock", LocalHostFiles, None),
    ("qemu+tcp://127.0.0.1:16509/system", LocalHostFiles, None),
    ("qemu+tls://localhost/system", LocalHostFiles, None),
    ("qemu+ssh://[::1]/system", LocalHostFiles, None),
    ("qemu+ssh://admin@node01:2222/system?keyfile=/k", SshHostFiles, ("node01", "admin", 2222)),
    ("qemu+ssh://node01/system", SshHostFiles, ("node01", None, None)),
    ("qemu+libssh2://root@node01/system", SshHostFiles, ("node01", "root", None)),
    ("qemu+tls://node02/system", SshHostFiles, ("node02", "root", None)),
    ("qemu+tcp://node03:16509/system", SshHostFiles, ("node03", "root", None)),
    ("qemu://node04/system", SshHostFiles, ("node04", "root", None)),
    ("test:///default", FakeHostFiles, None),
    ("test+unix:///default?socket=/tmp/s", FakeHostFiles, None),
])
def test_each_uri_gets_the_channel_that_reaches_its_host(uri, kind, where):
    files = host_files_for(uri)
    assert type(files) is kind
    if where:
        assert (files.host, files.user, files.port) == where


def test_a_uri_naming_this_machine_by_its_host_name_or_an_interface_s_address_is_read_directly():
    import socket

    assert type(host_files_for(f"qemu+tcp://{socket.gethostname()}:16509/system")) is LocalHostFiles
    # An address of this machine's that is not loopback, where it has one (the route out).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is chosen
            own = s.getsockname()[0]
        except OSError:
            own = None
    if own and not own.startswith("127."):
        assert type(host_files_for(f"qemu+tls://{own}/system")) is LocalHostFiles
    assert type(host_files_for("qemu+tls://192.0.2.7/system")) is SshHostFiles  # TEST-NET-1: no one's


def test_the_channels_have_the_interface_s_methods():
    import inspect

    from host_adapters.files.host_files import HostFiles

    public = {n for n, v in vars(HostFiles).items() if callable(v) and not n.startswith("_")}
    for cls in (LocalHostFiles, SshHostFiles, FakeHostFiles):
        for name in public:
            assert inspect.signature(getattr(cls, name)) == inspect.signature(getattr(HostFiles, name)), (cls, name)
