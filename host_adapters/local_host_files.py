"""HostFiles on this machine: direct file access, no parser, nothing that can block.

Each file is opened relative to its folder (itself opened without following a symbolic
link) with O_NOFOLLOW and O_NONBLOCK (a FIFO put there opens at once, and is refused as
one), and is read by pread of the bytes asked only.
"""

import errno
import os
import stat
from collections.abc import Sequence

from common.errors import HostError
from host_adapters.host_files import HostFiles, check_file_name, check_folder, check_read, not_regular

_KIND = {stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def _kind(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


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
                raise HostError(f"{folder} on {self.where} is not a folder (a symbolic link or a file): refused")
            raise HostError(f"cannot open {folder} on {self.where}: {e.strerror}") from e

    def ensure_folder(self, folder: str) -> None:
        check_folder(folder)
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)  # the umask may have taken bits; never more than 0700
        except FileExistsError:
            pass
        except OSError as e:
            raise HostError(f"cannot make the folder {folder} on {self.where}: {e.strerror}") from e
        fd = self._open_folder(folder)
        if fd is None:
            raise HostError(f"the folder {folder} on {self.where} went away while it was made")
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
                if not stat.S_ISREG(st.st_mode):
                    raise not_regular(self.where, folder, name, _kind(st.st_mode))
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
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise not_regular(self.where, folder, name, _kind(st.st_mode))
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
