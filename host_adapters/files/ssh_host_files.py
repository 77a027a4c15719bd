"""HostFiles on another machine: fixed commands over ssh, as the host's root (or the user of
its `qemu+ssh://` URI), in batch mode (a key, never a password prompt).

libvirt has no call that reads or removes a file outside its storage pools, and a pool
probes its files as disk images; so the controller reaches a remote host's console files
the way an admin would. Each command is one of four fixed shell texts; the folder (from the
host's pool definition) and the file names (the controller's own) are checked
(host_files.py) and quoted with shlex.quote. A file that is not a regular one is refused
before it is opened (`stat`, `test -f` and `! test -L`), and what was opened is checked
again (a regular file with one name: a hard link is refused) before a byte is read; what
the host sends is taken up to the bytes asked for plus one (more is refused), and every
command is bounded in time. The folder is made root's with mode 0700 from inside it, once
it is known to be the folder at the path and not one a symbolic link leads to; the same
checks as on this machine (local_host_files.py), so the two channels agree.
"""

import re
import shlex
import stat
from collections.abc import Sequence

from common.errors import CommandError, HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.files.host_files import (FOLDER_MODE, FOLDER_OWNER, HostFiles, check_file_name, check_folder,
                                            check_read, folder_refused, hard_linked, not_regular)

_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%-]{0,252}")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
CONNECT_TIMEOUT = 10  # seconds, ssh's own ConnectTimeout
COMMAND_TIMEOUT = 60.0  # seconds for a whole command: a read of 1 MiB included
_SSH_FAILED = 255  # ssh's exit code when it could not run the command (connection, key, host key)
_NOT_REGULAR = 4  # the read command's exit code for a file that is not a regular one
_NOT_FOLDER = 3
_LINKED = 5  # the read command's exit code for a file with more than one name
_NOT_SAFE = 6  # ensure_folder's exit code for a folder it could not make root's with mode 0700
_SAFE = "{}:{}:{:o}".format(*FOLDER_OWNER, FOLDER_MODE)  # `stat -c %u:%g:%a` of a safe folder


class SshHostFiles(HostFiles):
    def __init__(self, host: str, *, user: str | None = None, port: int | None = None,
                 timeout: float = COMMAND_TIMEOUT, connect_timeout: int = CONNECT_TIMEOUT):
        if not isinstance(host, str) or not _HOST.fullmatch(host):
            raise InvalidInput(f"not a host name for ssh: {host!r}")
        if user is not None and not _USER.fullmatch(user):
            raise InvalidInput(f"not a user name for ssh: {user!r}")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise InvalidInput(f"not a port for ssh: {port!r}")
        self.host, self.user, self.port = host, user, port
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.where = f"{user}@{host}" if user else host

    def argv(self, command: str) -> list[str]:
        """The ssh command line that runs `command` (one argument: ssh hands it to the remote
        user's shell) on the host."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.user is not None:
            argv += ["-l", self.user]
        return [*argv, "--", self.host, command]

    def _run(self, what: str, command: str, *, max_bytes: int, refusals: dict[int, HostError] | None = None):
        """The command's completed process; `refusals` maps the command's own exit codes to
        the errors they mean."""
        try:
            return subp.run_bounded(self.argv(command), max_bytes=max_bytes, timeout=self.timeout)
        except CommandError as e:
            if refusals and e.returncode in refusals:
                raise refusals[e.returncode] from None
            detail = (e.stderr or "").strip().splitlines()[-1:] or [f"exit code {e.returncode}"]
            if e.returncode == _SSH_FAILED:
                raise HostUnavailable(
                    f"cannot {what} on {self.where} over ssh ({detail[0]}): the console files of a host are read "
                    f"over ssh as {self.user or 'root'}; accept the head node's root ssh key there (batch mode, "
                    "no passphrase prompt) and put the host's key in root's known_hosts") from None
            if e.returncode == -1:
                raise HostUnavailable(f"cannot {what} on {self.where} over ssh: {detail[0]}") from None
            raise HostError(f"cannot {what} on {self.where}: {detail[0]}") from None
        except HostError as e:
            raise HostError(f"cannot {what} on {self.where}: {e.message}") from None

    def ensure_folder(self, folder: str) -> None:
        f = shlex.quote(check_folder(folder))
        # Fix or refuse, as on this machine (LocalHostFiles.ensure_folder says why): a real
        # folder with another owner or looser modes is made root's with mode 0700; a symbolic
        # link or a file there is refused. The change is made from inside the folder (`.`),
        # after checking that `.` is the very folder at the path (same device and inode as the
        # path's own `stat`, which follows no link): a link swapped in between the test and
        # the `cd` is refused, never changed. Owner first, so a former owner cannot change
        # the modes back; five digits to chmod, so GNU chmod clears a set-group-ID bit (a
        # folder made in a set-group-ID parent inherits it) instead of keeping it.
        command = (f"if ! test -e {f} && ! test -L {f}; then mkdir -m {FOLDER_MODE:04o} -- {f} || exit 1; fi; "
                   f"test -d {f} && ! test -L {f} || exit {_NOT_FOLDER}; "
                   f"cd -- {f} || exit 1; "
                   f"test \"$(stat -c %d:%i .)\" = \"$(stat -c %d:%i -- {f})\" || exit {_NOT_FOLDER}; "
                   f"test \"$(stat -c %u:%g:%a .)\" = {_SAFE} && exit 0; "
                   f"chown {FOLDER_OWNER[0]}:{FOLDER_OWNER[1]} . && chmod {FOLDER_MODE:05o} . || exit {_NOT_SAFE}")
        refusals = {
            _NOT_FOLDER: folder_refused(self.where, folder),
            _NOT_SAFE: HostError(
                f"{folder} on {self.where} is not root's with mode {FOLDER_MODE:04o} and could not be made so over "
                f"ssh as {self.user or 'root'}: connect as root, or run `chown root:root {shlex.quote(folder)} && "
                f"chmod {FOLDER_MODE:04o} {shlex.quote(folder)}` there"),
        }
        self._run(f"make the folder {folder}", command, max_bytes=4096, refusals=refusals)

    def sizes(self, folder: str, names: Sequence[str]) -> list[int | None]:
        names = [check_file_name(n) for n in names]
        f = shlex.quote(check_folder(folder))
        # %f: the raw mode in hex (no locale), %h: the number of names; nothing is opened. A
        # missing folder lists nothing.
        command = (f"test -L {f} && exit 0; cd -- {f} 2>/dev/null || exit 0; for n in "
                   + " ".join(shlex.quote(n) for n in names)
                   + "; do stat -c '%f %h %s' -- \"$n\" 2>/dev/null || echo -; done")
        out = self._run(f"list the files of {folder}", command, max_bytes=64 * (len(names) + 1)).stdout
        lines = out.decode("ascii", errors="replace").splitlines()
        if not lines:
            return [None for _ in names]
        if len(lines) != len(names):
            raise HostError(f"{self.where} answered {len(lines)} lines for {len(names)} files of {folder}")
        sizes: list[int | None] = []
        for name, line in zip(names, lines):
            if line == "-":
                sizes.append(None)
                continue
            try:
                mode_hex, links, size = line.split(" ")
                mode, nlink, length = int(mode_hex, 16), int(links), int(size)
            except ValueError:
                raise HostError(f"{self.where} answered {line!r} for the size of {folder}/{name}") from None
            if not stat.S_ISREG(mode) or length < 0:
                raise not_regular(self.where, folder, name, "a FIFO" if stat.S_ISFIFO(mode)
                                  else "a symbolic link" if stat.S_ISLNK(mode) else "another kind of file")
            if nlink != 1:  # the owner is not checked: local_host_files.check_file says why
                raise hard_linked(self.where, folder, name)
            sizes.append(length)
        return sizes

    def read(self, folder: str, name: str, offset: int, length: int) -> bytes:
        f, n = shlex.quote(check_folder(folder)), shlex.quote(check_file_name(name))
        check_read(offset, length)
        if length == 0:
            return b""
        # The file is opened once, as the group's standard input, after the tests that keep a
        # FIFO from being opened. What was opened (`stat -L /dev/stdin`: the open file, not
        # the path) must be the file at the path itself (device and inode of the path's own
        # `stat`, which follows no link: a link swapped in after the test is refused) and a
        # regular file (8???: S_IFREG in hex) with one name; `tail` reads that same open
        # file. The owner is not checked: local_host_files.check_file says why.
        command = (f"test -L {f} && exit {_NOT_REGULAR}; cd -- {f} 2>/dev/null || exit 0; "
                   f"test -e {n} || test -L {n} || exit 0; "
                   f"test -f {n} && ! test -L {n} || exit {_NOT_REGULAR}; "
                   "{ s=$(stat -L -c %f:%h:%d:%i /dev/stdin) && p=$(stat -c %d:%i -- " + n + ") "
                   f"&& test \"${{s#*:*:}}\" = \"$p\" || exit {_NOT_REGULAR}; "
                   f"case $s in 8???:1:*) ;; 8???:*) exit {_LINKED};; *) exit {_NOT_REGULAR};; esac; "
                   f"tail -c +{offset + 1} | head -c {length}; }} < {n}")
        refusals = {_NOT_REGULAR: not_regular(self.where, folder, name, "a FIFO, a device or a symbolic link"),
                    _LINKED: hard_linked(self.where, folder, name)}
        return self._run(f"read {folder}/{name}", command, max_bytes=length, refusals=refusals).stdout

    def remove(self, folder: str, names: Sequence[str]) -> None:
        names = [check_file_name(n) for n in names]
        f = shlex.quote(check_folder(folder))
        command = (f"test -L {f} && exit 0; cd -- {f} 2>/dev/null || exit 0; rm -f -- "
                   + " ".join(shlex.quote(n) for n in names))
        self._run(f"remove files of {folder}", command, max_bytes=4096)
