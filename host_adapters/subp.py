"""The one way the project runs a host command.

Argument lists only (never a shell), a timeout, stdin closed unless input is
given, a log line with secrets redacted, and one typed error that carries the
command, its exit code and stderr.
"""

import logging
import subprocess
from collections.abc import Iterable, Sequence

from common.errors import CommandError, HostUnavailable

log = logging.getLogger(__name__)

# Tests replace this to forbid real commands unless a test opts in.
_run = subprocess.run


def run(
    argv: Sequence[str],
    *,
    ok_codes: Iterable[int] = (0,),
    timeout: float = 120,
    input: str | None = None,
    secrets: Iterable[str] = (),
) -> subprocess.CompletedProcess:
    """Run argv and return the completed process; raise CommandError on a bad exit code."""
    argv = [str(a) for a in argv]
    hidden = [s for s in secrets if s]
    shown = ["<redacted>" if a in hidden else a for a in argv]
    log.info("running %s", " ".join(shown))
    try:
        proc = _run(
            argv,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise HostUnavailable(f"command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise CommandError(shown, -1, f"timed out after {timeout} s") from None
    if proc.returncode not in set(ok_codes):
        stderr = proc.stderr or ""
        for s in hidden:
            stderr = stderr.replace(s, "<redacted>")
        raise CommandError(shown, proc.returncode, stderr)
    return proc
