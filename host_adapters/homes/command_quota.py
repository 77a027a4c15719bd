"""`quota_backend = command`: a site program sets, reads and removes each home's quota.

For filesystems the controller has no backend of its own for (Lustre `lfs
setquota`, GPFS `mmsetquota`, BeeGFS, ZFS `userquota@`, a NAS's tool). The
controller makes and removes the home directory itself; the program only
acts on the quota. It is run as an argument list (never through a shell),
with `[volumes] quota_command_timeout_seconds` as its bound:

    PROGRAM set    HOME_PATH UID BYTES   set or change the hard limit
    PROGRAM get    HOME_PATH UID         print the limit (below)
    PROGRAM remove HOME_PATH UID         drop the quota of a home being removed
    PROGRAM check  HOME_ROOT             exit 0 if quotas can be set for homes there

HOME_PATH is `<home_root>/<username>`, or for a deleted volume's home the
path it was moved aside to (`<home_root>/.retired-<id>.<uid>`); `remove` runs
while the tree is still there, and the tree is removed after it either way.
UID is the uid the volume's quota is kept under (the one recorded for it),
a decimal number; BYTES a whole number of GiB in bytes. `get` prints one
line on stdout: the hard limit in bytes, or `none` (or 0) when there is
none; more whitespace-separated fields after it (the usage, say) are
allowed and ignored. Exit status 0 is success; anything else a failure, whose
first lines of stderr become the error's message (HTTP 503). A program that
does not finish in time is killed (only it: a child it started may live on,
so a wrapper should `exec` a tool that can hang, or bound it itself).
"""

import re

from common.errors import CommandError, HostError, HostUnavailable, InvalidInput
from host_adapters import subp
from host_adapters.homes.program_path import program_problem
from host_adapters.homes.quota import GIB, QuotaBackend, check_id, check_size_gb, make_plain_home, remove_tree

# How much of the program's stderr reaches a message: its first lines, each bounded.
MESSAGE_LINES = 3
MESSAGE_CHARS = 300
_GET_LINE = re.compile(r"^\s*(none|[0-9]{1,20})(?:\s.*)?$")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")


def program_message(stderr: str) -> str:
    """The first non-empty lines of a program's stderr, unprintable characters replaced, bounded."""
    lines = [_UNPRINTABLE.sub("?", line.strip()) for line in stderr.splitlines() if line.strip()]
    text = " / ".join(lines[:MESSAGE_LINES])
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 3] + "..."
    return text or "no message"


def parse_get(stdout: str) -> int | None:
    """`get`'s answer -> the limit in bytes, None for none; HostError for anything else."""
    first = stdout.splitlines()[0] if stdout.strip() else ""
    m = _GET_LINE.match(first)
    if m is None:
        raise HostError(f"quota command get printed {program_message(first or '(nothing)')!r}, "
                        "not a limit in bytes or 'none'")
    return None if m.group(1) == "none" else int(m.group(1)) or None


class CommandQuota(QuotaBackend):
    """Homes are plain directories; their quotas are the site program's (see the module)."""

    name = "command"
    # The program's limits are the site's to choose, per uid (lfs -u, zfs userquota@) or
    # per directory; the controller cannot tell which, so it assumes the one guest root
    # escapes, and [guest] sudo = owner is refused with this backend (docs/decisions.md).
    binds_every_writer = False

    def __init__(self, *, program: str, timeout: float = 60):
        if not program.startswith("/"):
            raise InvalidInput(f"quota_command must be an absolute path, got {program!r}")
        self.program = program
        self.timeout = timeout

    def _run(self, verb: str, *args: str) -> str:
        argv = [self.program, verb, *args]
        try:
            return subp.run(argv, timeout=self.timeout).stdout
        except CommandError as e:
            if e.returncode == -1 and e.stderr.startswith("timed out"):
                raise HostError(f"quota command {verb} did not finish within {self.timeout:g} s") from None
            raise HostError(f"quota command {verb} failed (exit {e.returncode}): "
                            f"{program_message(e.stderr)}") from None
        except HostUnavailable as e:
            raise HostUnavailable(f"quota command {self.program} cannot be run: {e.message}") from None
        except UnicodeDecodeError:
            raise HostError(f"quota command {verb} printed output that is not text") from None
        except OSError as e:  # there but not executable any more
            raise HostUnavailable(f"quota command {self.program} cannot be run: {e.strerror or e}") from None

    def check(self, home_root: str) -> None:
        # The program and its directories as at start: one changed since (a directory made
        # writable by others) is refused before it runs as root.
        problem = program_problem(self.program)
        if problem is not None:
            raise HostUnavailable(f"quota command {self.program} cannot be run: {problem}")
        try:
            self._run("check", home_root)
        except HostUnavailable:
            raise
        except HostError as e:
            raise HostUnavailable(e.message) from None

    def make_home(self, path: str, *, uid: int) -> None:
        check_id("uid", uid)
        make_plain_home(path)

    def set_limit(self, path: str, *, uid: int, size_gb: int) -> None:
        uid = check_id("uid", uid)
        self._run("set", path, str(uid), str(check_size_gb(size_gb) * GIB))

    def get_limit(self, path: str, *, uid: int) -> int | None:
        return parse_get(self._run("get", path, str(check_id("uid", uid))))

    def remove(self, path: str, *, uid: int | None) -> None:
        if uid is None:  # no uid recorded: the tree goes, no quota is named
            remove_tree(path)
            return
        check_id("uid", uid)
        try:
            self._run("remove", path, str(uid))
        finally:
            # Also when the program failed: a half-made home must not stay (its error is
            # the one reported); a failed remove leaves only the program's own entry.
            remove_tree(path)
