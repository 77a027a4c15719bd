"""The one way the project runs a host command.

Argument lists only (never a shell), a timeout, stdin closed unless input is
given, a log line with secrets redacted, and one typed error that carries the
command, its exit code and stderr.
"""

import logging
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence

from common.errors import CommandError, HostError, HostUnavailable

log = logging.getLogger(__name__)

# Tests replace these to forbid real commands unless a test opts in.
_run = subprocess.run
_popen = subprocess.Popen

# What run_bounded keeps of a command's stderr (its end): a message, not a stream.
STDERR_KEPT = 64 * 1024


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


def run_bounded(argv: Sequence[str], *, max_bytes: int, timeout: float,
                ok_codes: Iterable[int] = (0,)) -> subprocess.CompletedProcess:
    """Run argv and return its exit code, stdout (bytes, at most max_bytes) and the end of its
    stderr (text), for a command whose output is not trusted to end where asked (another
    host's): HostError, and the command killed, as soon as it sends more than max_bytes;
    CommandError when it has not ended within `timeout` seconds or exits with a code not in
    ok_codes."""
    argv = [str(a) for a in argv]
    log.info("running %s", " ".join(argv))
    try:
        # A session of its own: what it started ends with it (killpg below).
        proc = _popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      start_new_session=True)
    except FileNotFoundError:
        raise HostUnavailable(f"command not found: {argv[0]}") from None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    try:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandError(argv, -1, f"timed out after {timeout} s")
            for key, _events in selector.select(left):
                piece = os.read(key.fd, 65536)
                if not piece:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(piece)
                if key.data is out and len(out) > max_bytes:
                    raise HostError(f"{argv[0]} sent more than the {max_bytes} bytes asked for; stopped")
                if key.data is err and len(err) > STDERR_KEPT:
                    del err[:-STDERR_KEPT]
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CommandError(argv, -1, f"timed out after {timeout} s") from None
    finally:
        selector.close()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    stderr = err.decode(errors="replace")
    if code not in set(ok_codes):
        raise CommandError(argv, code, stderr)
    return subprocess.CompletedProcess(argv, code, bytes(out), stderr)


def run_hook(argv: Sequence[str], *, input: bytes, timeout: float) -> None:
    """Run a site's hook program with `input` on its stdin and nothing else: its output is
    not read (only the end of its stderr, for the error). CommandError when it fails or has
    not ended within `timeout` seconds; then it is killed with everything it started (a
    session of its own), so a hook that hangs, or leaves a child holding a pipe, costs at most
    `timeout`."""
    argv = [str(a) for a in argv]
    log.info("running %s", " ".join(argv))

    with tempfile.TemporaryFile() as err:
        try:
            proc = _popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                          start_new_session=True)
        except FileNotFoundError:
            raise HostUnavailable(f"command not found: {argv[0]}") from None
        deadline = time.monotonic() + timeout
        try:
            try:
                # stdin is small (one JSON object): a hook that never reads it still gets it
                # whole in the pipe's buffer; one that closes it early is no failure.
                proc.stdin.write(input)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CommandError(argv, -1, f"timed out after {timeout:g} s") from None
        finally:
            # Past its time (or on any error here) the hook goes with everything it started;
            # one that ended leaves what it started in the background (a mailer) alone.
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        if code != 0:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - STDERR_KEPT))
            raise CommandError(argv, code, err.read().decode(errors="replace"))
