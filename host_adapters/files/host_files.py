"""Files of a hypervisor host that the controller reads and removes as bytes: the kept
serial consoles (host_adapters/libvirt/console_log.py).

Every byte of these files is a guest's, so no parser may see them: not libvirt's storage
pools (which probe each file of a pool as a disk image), not a shell's expansion. A
HostFiles reaches one host's files by a channel chosen from the host's libvirt URI
(host_files_choice.py): direct file access on this machine (local_host_files.py), ssh to
another (ssh_host_files.py), memory for libvirt's test driver (fake_host_files.py).

Each call names a folder (an absolute path, checked here) and file names of the
controller's making (checked here): nothing else reaches a path or a command.
"""

import re
from collections.abc import Sequence

from common.errors import HostError, InvalidInput

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_folder(folder: object) -> str:
    """An absolute folder path without control characters or `.`/`..` parts (it comes from a
    host's pool definition: not trusted to be well-formed)."""
    if not isinstance(folder, str) or not folder.startswith("/") or _CONTROL.search(folder) or len(folder) > 4000:
        raise InvalidInput(f"not an absolute folder path: {folder!r}")
    parts = folder.split("/")[1:]
    if folder != "/" and any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"folder path {folder!r} is not in its plain form")
    return folder


def check_file_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(f"not a file name of the controller's: {name!r}")
    return name


def not_regular(where: str, folder: str, name: str, what: str) -> HostError:
    return HostError(f"{folder}/{name} on {where} is {what}, not a regular file: refused (the controller reads "
                     "only the files the hypervisor writes)")


# What the controller's mkdir makes, and so what an existing folder is made into: root's, no
# one else may list, enter or write it.
FOLDER_OWNER = (0, 0)
FOLDER_MODE = 0o700


def folder_refused(where: str, folder: str) -> HostError:
    return HostError(f"{folder} on {where} is not a folder (a symbolic link or a file): refused; move it away "
                     f"and retry (the controller makes the console folder itself, owned by root, mode "
                     f"{FOLDER_MODE:04o})")


def hard_linked(where: str, folder: str, name: str) -> HostError:
    """A file with more than one name: the hypervisor writes each console file under one name
    only, so another name is a hard link someone made, maybe to a file root can read and the
    guest's owner must not."""
    return HostError(f"{folder}/{name} on {where} is a hard link (it has more than one name): refused (the "
                     "hypervisor writes each console file under one name only; remove it)")


class HostFiles:
    """One host's files, read and removed without parsing. `where` names the host in messages.

    A file that is not there counts as absent (None, b"", removed); a file that is there but
    is not a regular file (a FIFO, a device, a symbolic link) is refused with HostError, before
    anything is opened that could block; a file with more than one name (a hard link) too. Every call is bounded in time and in the bytes it
    takes from the host."""

    where: str = "the host"

    def ensure_folder(self, folder: str) -> None:
        """The folder exists afterwards, a real folder (no symbolic link), owned by root with
        mode 0700: made so when missing (its parent must exist) or found with another owner or
        looser modes. HostError for a symbolic link or a file there, or when it cannot be made
        root's."""
        raise NotImplementedError

    def sizes(self, folder: str, names: Sequence[str]) -> list[int | None]:
        """The length of each named file of the folder, None for one that is not there (nor
        the folder)."""
        raise NotImplementedError

    def read(self, folder: str, name: str, offset: int, length: int) -> bytes:
        """At most `length` bytes of the file from `offset`: fewer when it ends first, b""
        when it is not there. HostError when the host sends more than asked."""
        raise NotImplementedError

    def remove(self, folder: str, names: Sequence[str]) -> None:
        """The named files of the folder are gone (also when they, or the folder, were not there)."""
        raise NotImplementedError


def check_read(offset: int, length: int) -> None:
    for value in (offset, length):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"offsets and lengths are integers from 0, not {value!r}")
