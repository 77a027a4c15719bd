"""HostFiles in memory: the fake for tests, and the files of libvirt's test driver (the
sandbox), whose host is this process's memory too."""

import threading
from collections.abc import Sequence

from host_adapters.files.host_files import (HostFiles, check_file_name, check_folder, check_read, folder_refused,
                                            hard_linked, not_regular)


class FakeHostFiles(HostFiles):
    """Folders and files in a dict. `special` marks a path as a non-regular file (a FIFO,
    say; at a folder's path, a symbolic link) that every call refuses as the real ones do;
    `linked` marks a file's path as having more than one name (a hard link), refused too;
    `loose` holds the folders that are there but not root's with mode 0700, which
    ensure_folder makes safe; `fail` makes every call raise it."""

    where = "the test host"

    def __init__(self):
        self.folders: set[str] = set()
        self.loose: set[str] = set()
        self.files: dict[str, bytes] = {}
        self.special: dict[str, str] = {}
        self.linked: set[str] = set()
        self.fail: Exception | None = None
        self._lock = threading.Lock()

    def _check(self, folder: str) -> None:
        check_folder(folder)
        if self.fail is not None:
            raise self.fail

    def ensure_folder(self, folder: str) -> None:
        self._check(folder)
        with self._lock:
            if folder in self.files or folder in self.special:
                raise folder_refused(self.where, folder)
            self.folders.add(folder)
            self.loose.discard(folder)  # made root's, mode 0700, as the real channels do

    def write(self, folder: str, name: str, data: bytes) -> None:
        """What the hypervisor would write (tests)."""
        with self._lock:
            self.folders.add(folder)
            self.files[f"{folder}/{check_file_name(name)}"] = bytes(data)

    def _regular(self, folder: str, name: str) -> bytes | None:
        path = f"{folder}/{check_file_name(name)}"
        if path in self.special:
            raise not_regular(self.where, folder, name, self.special[path])
        if path in self.linked and path in self.files:
            raise hard_linked(self.where, folder, name)
        return self.files.get(path)

    def sizes(self, folder: str, names: Sequence[str]) -> list[int | None]:
        self._check(folder)
        with self._lock:
            return [None if (data := self._regular(folder, n)) is None else len(data) for n in names]

    def read(self, folder: str, name: str, offset: int, length: int) -> bytes:
        self._check(folder)
        check_read(offset, length)
        with self._lock:
            data = self._regular(folder, name)
        return b"" if data is None else data[offset:offset + length]

    def remove(self, folder: str, names: Sequence[str]) -> None:
        self._check(folder)
        with self._lock:
            for name in names:
                path = f"{folder}/{check_file_name(name)}"
                self.files.pop(path, None)
                self.special.pop(path, None)
                self.linked.discard(path)
