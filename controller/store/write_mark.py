"""A mark that every committed write to the database changes, in every process.

What a process remembers of the database (the owner of a token) stays true only
while nobody writes. The service and `cloud-agent` both commit through
Store.write(), which changes this mark right after each COMMIT; a reader keeps a
remembered answer only while the mark is the one it saw before reading the answer.

The mark is 8 bytes in a file beside the database (`<database>-mark`), mapped into
memory: reading it is a memory access, with no system call and no SQLite statement.
That matters because it is read on every authenticated request, and each statement
(or system call) hands Python's GIL to another thread (PERF: docs/performance.md).
Each change writes 8 random bytes, not a count: two processes changing it at once
cannot leave it at a value a reader already saw. A torn read (a change half written)
is a value no reader saw either, so it only costs a fresh read.

Writes made by other programs (the sqlite3 shell) do not change the mark: the
remembered answers also expire (see Store.token_owner) to bound what they miss.
"""

import logging
import mmap
import os
import stat

log = logging.getLogger(__name__)

SIZE = 8


class WriteMark:
    def __init__(self, database_path: str):
        """The mark of the database at database_path: in this process only for ":memory:".
        Where the file cannot be opened for writing, `usable` is False: remember nothing."""
        self._map: mmap.mmap | bytearray = bytearray(SIZE)
        self.usable = database_path == ":memory:"
        if self.usable:
            return
        path = f"{database_path}-mark"
        try:
            database = os.stat(database_path)
        except OSError:
            database = None
        # Whoever may write the database may change the mark, as with SQLite's -wal and -shm.
        mode = stat.S_IMODE(database.st_mode) & 0o666 if database else 0o600
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as e:
            log.warning("write mark %s cannot be opened (%s): tokens are checked in the database each time", path, e)
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                log.warning("write mark %s is not a regular file: tokens are checked in the database each time", path)
                return
            if database and os.geteuid() == 0 and (info.st_uid, info.st_gid) != (database.st_uid, database.st_gid):
                os.fchown(fd, database.st_uid, database.st_gid)
            # The database's mode exactly, as SQLite gives its -wal and -shm: open() narrowed it
            # by the umask, and a mark made before the database was made private (or by an
            # older version) kept 0644. Only the database's writers may change the mark: one
            # who could set it back to a value a reader saw would keep a revoked token alive.
            if stat.S_IMODE(info.st_mode) != mode:
                try:
                    os.fchmod(fd, mode)
                except OSError as e:
                    if stat.S_IMODE(info.st_mode) & ~mode:
                        log.warning("write mark %s is mode %o, wider than its database's %o, and cannot be "
                                    "narrowed (%s): tokens are checked in the database each time",
                                    path, stat.S_IMODE(info.st_mode), mode, e.strerror)
                        return
            if info.st_size < SIZE:
                # Grown, never shrunk: a mapping past the end of a file kills the process (SIGBUS).
                os.pwrite(fd, os.urandom(SIZE), 0)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.usable = True
        finally:
            os.close(fd)

    def read(self) -> bytes:
        return bytes(self._map[:SIZE])

    def change(self) -> None:
        self._map[:SIZE] = os.urandom(SIZE)
