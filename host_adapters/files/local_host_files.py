"""HostFiles on this machine: direct file access, no parser, nothing that can block.

Each file is opened relative to its folder (itself opened without following a symbolic
link) with O_NOFOLLOW and O_NONBLOCK (a FIFO put there opens at once, and is refused as
one), checked on the opened descriptor (a regular file with one name) and read by pread of
the bytes asked only. The folder is made safe (root's, mode 0700) on its descriptor too, so
nothing swapped in at its path between the check and the change is ever changed.
"""

import errno
import os
import stat
from collections.abc import Sequence

from common.errors import HostError
from host_adapters.files.host_files import (FOLDER_MODE, FOLDER_OWNER, HostFiles, check_file_name, check_folder,
                                            check_read, folder_refused, hard_linked, not_regular)

_KIND = {stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def _kind(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


def check_file(where: str, folder: str, name: str, st: os.stat_result) -> None:
    """Refuse what no console writer makes: anything but a regular file with one name.

    The owner is not checked: virtlogd (qemu.conf's default `stdio_handler = "logd"`) writes
    as root, but where QEMU writes its own log (`stdio_handler = "file"`) the file may be
    QEMU's user's (`user` in qemu.conf), which differs between sites and is not known here
    for a remote host. An owner test would break the console on such a host and buy little:
    a file a user made holds only bytes that user wrote, and the folder (root's, 0700) admits
    no new file from anyone but root. The link count is what stops a hard link to a file
    the guest's owner must not read."""
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(where, folder, name, _kind(st.st_mode))
    if st.st_nlink != 1:
        raise hard_linked(where, folder, name)


class LocalHostFiles(HostFiles):
    where = "this machine"

    def _open_folder(self, folder: str) -> int | None:
        """A descriptor of the folder, None when it is not there."""
        check_folder(folder)
        try:
            return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise folder_refused(self.where, folder) from None
            raise HostError(f"cannot open {folder} on {self.where}: {e.strerror}") from e

    def ensure_folder(self, folder: str) -> None:
        check_folder(folder)
        try:
            os.mkdir(folder, FOLDER_MODE)  # the umask may take bits: the mode is set below
        except FileExistsError:
            pass
        except OSError as e:
            raise HostError(f"cannot make the folder {folder} on {self.where}: {e.strerror}") from e
        fd = self._open_folder(folder)  # a symbolic link or a file there is refused
        if fd is None:
            raise HostError(f"the folder {folder} on {self.where} went away while it was made")
        try:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != FOLDER_OWNER or stat.S_IMODE(st.st_mode) != FOLDER_MODE:
                # A real folder found with another owner or looser modes (made by hand, by an
                # earlier tool, inherited from a pool folder's modes) is the controller's own
                # folder by its name: made safe rather than refused, so a site needs no manual
                # step. Owner first, so its former owner cannot change the modes back; on the
                # descriptor, so a symbolic link swapped in at the path is never followed.
                # Once it is safe no one but root can add a file; a file put there before is
                # checked at every read (check_file).
                # A symbolic link or a file in its place is refused instead (_open_folder):
                # making one safe would change whatever it points to, or lose what it holds.
                os.fchown(fd, *FOLDER_OWNER)
                os.fchmod(fd, FOLDER_MODE)
        except OSError as e:
            raise HostError(f"cannot make the folder {folder} on {self.where} root's with mode "
                            f"{FOLDER_MODE:04o}: {e.strerror}; the controller must run as root") from e
        finally:
            os.close(fd)

    def sizes(self, folder: str, names: Sequence[str]) -> list[int | None]:
        names = [check_file_name(n) for n in names]
        fd = self._open_folder(folder)
        if fd is None:
            return [None for _ in names]
        try:
            out = []
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    out.append(None)
                    continue
                check_file(self.where, folder, name, st)
                out.append(st.st_size)
            return out
        finally:
            os.close(fd)

    def read(self, folder: str, name: str, offset: int, length: int) -> bytes:
        check_file_name(name)
        check_read(offset, length)
        dir_fd = self._open_folder(folder)
        if dir_fd is None:
            return b""
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                return b""
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise not_regular(self.where, folder, name, "a symbolic link") from e
                raise HostError(f"cannot open {folder}/{name} on {self.where}: {e.strerror}") from e
        finally:
            os.close(dir_fd)
        try:
            check_file(self.where, folder, name, os.fstat(fd))
            data = bytearray()
            while len(data) < length:
                piece = os.pread(fd, min(length - len(data), 1 << 20), offset + len(data))
                if not piece:
                    break
                data += piece
            return bytes(data)
        finally:
            os.close(fd)

    def remove(self, folder: str, names: Sequence[str]) -> None:
        names = [check_file_name(n) for n in names]
        fd = self._open_folder(folder)
        if fd is None:
            return
        try:
            for name in names:
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise HostError(f"cannot remove {folder}/{name} on {self.where}: {e.strerror}") from e
        finally:
            os.close(fd)
