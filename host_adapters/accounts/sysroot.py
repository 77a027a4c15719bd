"""The system root that user and group commands act in, and its account files.

`[unix] root` empty means the host itself; a directory means a scratch system
root: `useradd -R DIR`, `groupadd -R DIR`, `gpasswd -Q DIR`, `groupdel -R DIR`
and `userdel -R DIR` chroot into it, and reads go to DIR/etc/passwd and
DIR/etc/group. `make_sysroot` builds the smallest such root those commands
accept (the sandbox and the tests use it).
"""

import os
import pwd
import shutil
import threading
from dataclasses import dataclass

from common.errors import HostError, HostUnavailable

# Reads in host mode start here; tests point it at a scratch directory.
HOST_ROOT = "/"

# Ids far above the host's own accounts, so sandbox homes made on the host
# under these ids are never mistaken for a real user's files.
_LOGIN_DEFS = """\
# Scratch system root of a cloud controller sandbox.
UID_MIN 10000
UID_MAX 59999
GID_MIN 10000
GID_MAX 59999
USERGROUPS_ENAB yes
"""

# name, content, mode: the shadow files must not be world-readable.
_SKELETON = (
    ("passwd", "root:x:0:0:root:/root:/bin/bash\n", 0o644),
    ("group", "root:x:0:\n", 0o644),
    ("shadow", "root:*::0:99999:7:::\n", 0o640),
    ("gshadow", "root:*::\n", 0o640),
    ("login.defs", _LOGIN_DEFS, 0o644),
)


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int
    home: str
    shell: str


@dataclass(frozen=True)
class GroupEntry:
    name: str
    gid: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class ShadowEntry:
    name: str
    password: str
    expire: int | None  # days since 1970-01-01; None when the field is empty


def normalize_root(root: "str | os.PathLike[str] | None") -> str | None:
    """None for the host itself, else the absolute path (the commands refuse relative roots)."""
    if root is None:
        return None
    text = os.fspath(root)
    if not text.strip():
        return None
    return os.path.abspath(text)


def root_args(flag: str, root: str | None) -> list[str]:
    """`[flag, root]` when acting inside a system root, `[]` on the host."""
    return [flag, root] if root else []


def etc_file(root: str | None, name: str) -> str:
    return os.path.join(root or HOST_ROOT, "etc", name)


def _read_lines(root: str | None, name: str) -> list[tuple[int, str]]:
    path = etc_file(root, name)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise HostUnavailable(f"{path} is missing") from None
    except OSError as e:
        raise HostUnavailable(f"cannot read {path}: {e.strerror}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        # Blank lines, comments and NIS compat entries name no local account.
        if not line.strip() or line[0] in "#+-":
            continue
        rows.append((number, line))
    return rows


# Account files, indexed by name and kept while the file is the same one: the shadow
# tools and append_entries replace a file by renaming a new one over it (a new inode),
# so (inode, size, mtime) changes with every change. Reconcile and guest specs look up
# thousands of names; parsing 10,000 lines for each look-up made a sandbox start with
# 10,000 accounts take minutes. A new version is split once (one thread does it, the
# others wait for it) and a line becomes an entry only when it is asked for: building
# 11,000 entries for every group made through the API was most of its cost. Lines are
# kept whole and split when asked for: split into fields, the three files of 10,000
# accounts were 186,000 strings, 12 MB of a 150 MB server.
_FIELDS = {"passwd": 7, "group": 4, "shadow": 9}
_indexed: dict[str, tuple[tuple, list, dict]] = {}  # path -> (identity, rows, rows by name)
_index_locks: dict[str, threading.Lock] = {}
_indexed_guard = threading.Lock()


def _index(root: str | None, name: str) -> tuple[list, dict]:
    """(rows, rows by entry name) of an account file; a row is (line number, line). A line
    with the wrong number of fields is a HostError for every read of the file."""
    path = etc_file(root, name)
    with _indexed_guard:
        path_lock = _index_locks.setdefault(path, threading.Lock())
    with path_lock:
        try:
            st = os.stat(path)
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            identity = None
        hit = _indexed.get(path)
        if hit is not None and identity is not None and hit[0] == identity:
            return hit[1], hit[2]
        rows = _read_lines(root, name)
        by_name: dict[str, tuple[int, str]] = {}
        separators = _FIELDS[name] - 1
        for row in rows:
            line = row[1]
            if line.count(":") != separators:
                raise _malformed(root, name, row[0])
            by_name.setdefault(line[:line.index(":")], row)  # the first line wins, as for getpwnam
        if identity is not None:
            _indexed[path] = (identity, rows, by_name)
        return rows, by_name


def _malformed(root: str | None, name: str, number: int) -> HostError:
    return HostError(f"malformed line {number} in {etc_file(root, name)}")


def _passwd_entry(root: str | None, number: int, line: str) -> PasswdEntry:
    fields = line.split(":")
    try:
        return PasswdEntry(name=fields[0], uid=int(fields[2]), gid=int(fields[3]), home=fields[5], shell=fields[6])
    except ValueError:
        raise _malformed(root, "passwd", number) from None


def _group_entry(root: str | None, number: int, line: str) -> GroupEntry:
    fields = line.split(":")
    try:
        return GroupEntry(name=fields[0], gid=int(fields[2]), members=tuple(m for m in fields[3].split(",") if m))
    except ValueError:
        raise _malformed(root, "group", number) from None


def _shadow_entry(root: str | None, number: int, line: str) -> ShadowEntry:
    fields = line.split(":")
    try:
        return ShadowEntry(name=fields[0], password=fields[1], expire=int(fields[7]) if fields[7] else None)
    except ValueError:
        raise _malformed(root, "shadow", number) from None


def _shadow_index(root: str | None) -> tuple[list, dict]:
    # A root without a shadow file has no shadow entries.
    if not os.path.exists(etc_file(root, "shadow")):
        return [], {}
    return _index(root, "shadow")


def read_passwd(root: str | None) -> list[PasswdEntry]:
    return [_passwd_entry(root, n, f) for n, f in _index(root, "passwd")[0]]


def read_group(root: str | None) -> list[GroupEntry]:
    return [_group_entry(root, n, f) for n, f in _index(root, "group")[0]]


def read_shadow(root: str | None) -> list[ShadowEntry]:
    """etc/shadow's entries (root reads it; a root without the file has none)."""
    return [_shadow_entry(root, n, f) for n, f in _shadow_index(root)[0]]


def find_shadow(root: str | None, name: str) -> ShadowEntry | None:
    row = _shadow_index(root)[1].get(name)
    return None if row is None else _shadow_entry(root, *row)


def login_defs(root: str | None) -> dict[str, str]:
    """The settings of etc/login.defs (what useradd and groupadd read), {} without the file."""
    path = etc_file(root, "login.defs")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise HostUnavailable(f"cannot read {path}: {e.strerror}") from None
    settings = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#"):
            settings[fields[0]] = fields[1]
    return settings


def state_file(root: str | None, name: str) -> str:
    """A file of the controller's own about this system root's accounts (e.g. the uid mark),
    kept inside that root: /var/lib/cloud-controller/NAME on the host."""
    return os.path.join(root or HOST_ROOT, "var", "lib", "cloud-controller", name)


def find_group(root: str | None, name: str) -> GroupEntry | None:
    row = _index(root, "group")[1].get(name)
    return None if row is None else _group_entry(root, *row)


def find_user(root: str | None, name: str) -> PasswdEntry | None:
    row = _index(root, "passwd")[1].get(name)
    return None if row is None else _passwd_entry(root, *row)


def user_names(root: str | None) -> set[str]:
    """The names in etc/passwd (without building an entry per line)."""
    return set(_index(root, "passwd")[1])


def unknown_users(root: str | None, names: list[str]) -> list[str]:
    """The names that are not accounts the membership commands will accept."""
    local = user_names(root)
    missing = [n for n in names if n not in local]
    if root is None:
        # On the host gpasswd asks NSS, so directory (LDAP) accounts count too.
        missing = [n for n in missing if not nss_knows(pwd.getpwnam, n)]
    return missing


def nss_knows(lookup, key) -> bool:
    """Whether NSS (local files, LDAP, ...) answers `lookup(key)`: pwd.getpwnam, pwd.getpwuid."""
    try:
        lookup(key)
    except KeyError:
        return False
    return True


def check_root(root: str | None, *, binaries: tuple[str, ...], files: tuple[str, ...]) -> None:
    """Raise HostUnavailable naming the first missing binary, root or account file."""
    for binary in binaries:
        if shutil.which(binary) is None:
            raise HostUnavailable(f"{binary} not found on PATH")
    if root is not None and not os.path.isdir(root):
        raise HostUnavailable(f"system root {root} is not a directory")
    for name in files:
        path = etc_file(root, name)
        if not os.path.isfile(path):
            raise HostUnavailable(f"{path} is missing")


_locks: dict[str | None, threading.RLock] = {}
_locks_guard = threading.Lock()


def lock(root: str | None) -> threading.RLock:
    """One lock per system root, so a check-then-run sequence is not interleaved
    with another thread's change to the same account files (the commands' own
    lock files would make the loser fail instead of wait)."""
    with _locks_guard:
        return _locks.setdefault(root, threading.RLock())


def make_sysroot(path: "str | os.PathLike[str]") -> str:
    """Create (or complete) a scratch system root at path and return its absolute path.

    Writes only the files that are missing, so running it on an existing root
    keeps the accounts already there.
    """
    root = os.path.abspath(os.fspath(path))
    etc = os.path.join(root, "etc")
    os.makedirs(etc, mode=0o755, exist_ok=True)
    for name, content, mode in _SKELETON:
        target = os.path.join(etc, name)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)  # the umask may have narrowed it
            f.write(content)
    return root


# -- bulk writes (loading a sandbox at cluster scale) ----------------------------------
# Lines as useradd -U -M and groupadd + gpasswd -M write them (Debian 12's shadow
# tools): no password ("!"), the last change day, no ageing fields.
def passwd_line(name: str, uid: int, gid: int, home: str, shell: str) -> str:
    return f"{name}:x:{uid}:{gid}::{home}:{shell}"


def group_line(name: str, gid: int, members: tuple[str, ...] = ()) -> str:
    return f"{name}:x:{gid}:{','.join(members)}"


def shadow_line(name: str, last_change_day: int) -> str:
    return f"{name}:!:{last_change_day}::::::"


def gshadow_line(name: str, members: tuple[str, ...] = ()) -> str:
    return f"{name}:!::{','.join(members)}"


def append_entries(root: str, lines: dict[str, list[str]]) -> None:
    """Append lines to account files of a scratch system root (`lines`: file name, e.g.
    "passwd", -> lines without newline), each file replaced whole by a rename.

    For loading thousands of accounts and groups at once, where one useradd or
    groupadd each would take minutes. Only inside a scratch root: on the host, the
    tools (and nscd, and auditing) must see every change. The caller checks names
    and numbers; this refuses a name already in the file, and holds the lock the
    shadow tools take (lckpwdf: a write lock on etc/.pwd.lock), so a useradd in
    another process waits instead of losing lines.
    """
    if root is None:
        raise HostError("bulk account writes are only for a scratch system root ([unix] root)")
    import fcntl

    etc = os.path.join(root, "etc")
    with lock(root):
        fd = os.open(os.path.join(etc, ".pwd.lock"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            # All files checked before any is written: a clash leaves every file unchanged.
            staged = []
            for name, new in lines.items():
                if not new:
                    continue
                path = os.path.join(etc, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                have = {line.split(":", 1)[0] for line in text.splitlines() if line and line[0] not in "#+-"}
                names = [line.split(":", 1)[0] for line in new]
                clash = have & set(names)
                if clash:
                    raise HostError(f"{path} already has {sorted(clash)[0]}")
                if len(set(names)) != len(names):
                    raise HostError(f"the lines for {path} name an entry twice")
                if text and not text.endswith("\n"):
                    text += "\n"
                staged.append((path, text + "\n".join(new) + "\n", os.stat(path)))
            for path, text, st in staged:
                tmp = f"{path}+"
                out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                              st.st_mode & 0o777)
                with os.fdopen(out, "w", encoding="utf-8") as f:
                    os.fchmod(f.fileno(), st.st_mode & 0o777)
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
        except OSError as e:
            raise HostError(f"cannot write the account files of {root}: {e.strerror}") from None
        finally:
            os.close(fd)
