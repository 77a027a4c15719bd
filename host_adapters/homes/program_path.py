"""Whether a program root runs can be changed by anyone but root: the file and every
directory on its path.

A root-owned program in a directory others can write is not safe: whoever writes that
directory renames the program away and puts their own under its name, and the next
quota change runs it as root. So the program (after following symlinks) must be a
regular executable file, and it and every directory on its path, as written and as
resolved, must be owned by root (or the user this process runs as) and writable by no
group or other user. The one exception is a directory with the sticky bit owned by
root (/tmp): there only an entry's owner may rename or remove it.
"""

import os
import stat


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _directory_problem(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot check directory {path}: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    sticky_root = st.st_mode & stat.S_ISVTX and st.st_uid == 0
    if not _trusted_owner(st) or (st.st_mode & 0o022 and not sticky_root):
        return (f"directory {path} on its path must be owned by root and not writable by group or others "
                "(whoever can write it can replace the program)")
    return None


def _directories(path: str) -> list[str]:
    """`/a/b/prog` -> ["/", "/a", "/a/b"]."""
    parts = [p for p in os.path.dirname(path).split("/") if p]
    return ["/"] + ["/" + "/".join(parts[:n]) for n in range(1, len(parts) + 1)]


def program_problem(path: str) -> str | None:
    """Why `path` is not a program root may run (None: it is). `path` is absolute."""
    if not path.startswith("/"):
        return f"must be an absolute path, got {path!r}"
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot use {path}: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    if not _trusted_owner(st) or st.st_mode & 0o022:
        return f"{path} must be owned by root and not writable by group or others (it runs as root)"
    resolved = os.path.realpath(path)
    seen = set()
    for directory in _directories(os.path.normpath(path)) + _directories(resolved):
        if directory in seen:
            continue
        seen.add(directory)
        problem = _directory_problem(directory)
        if problem is not None:
            return problem
    return None
