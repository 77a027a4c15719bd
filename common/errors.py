"""The few exception types the project raises.

The service layer and the host adapters raise these; the API maps each type to
an HTTP status in one place (api/error_responses.py) and the agent turns them into a
clean message and a non-zero exit.
"""


class ControllerError(Exception):
    """Base of every error the project means to report to a client or admin."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(ControllerError):
    """The request is malformed or a value breaks a rule (HTTP 400)."""


class Unauthenticated(ControllerError):
    """Missing, wrong, expired or revoked credentials (HTTP 401)."""


class Forbidden(ControllerError):
    """The requester is known but may not do this (HTTP 403)."""


class NotFound(ControllerError):
    """The target does not exist or is not visible to the requester (HTTP 404)."""


class Conflict(ControllerError):
    """The request clashes with the current state (HTTP 409)."""


class TooManyRequests(ControllerError):
    """Too many failed attempts; try again later (HTTP 429)."""

    def __init__(self, message: str, retry_after: int = 60):
        super().__init__(message)
        self.retry_after = retry_after


class HostError(ControllerError):
    """A host effect failed (a command, libvirt, LDAP, the filesystem) (HTTP 503)."""


class HostUnavailable(HostError):
    """A host adapter cannot be reached at all (HTTP 503)."""


class HostUnreachable(HostUnavailable):
    """A hypervisor host does not answer at all (no connection, or it was lost) (HTTP 503).
    Unlike other HostUnavailable causes (a missing pool), this marks the host unreachable
    for a back-off (host_adapters/host_pool.py)."""


class CleanupFailed(HostError):
    """A failed create could not remove what it had already made on a host (the host stopped
    answering mid-way), so that may remain there (HTTP 503). The caller keeps its record of
    the operation, for reconcile to remove the rest once the host answers."""


class ServerBusy(HostError):
    """The server has no room for this request now: it is refused at once, not queued (HTTP 503,
    with Retry-After)."""

    def __init__(self, message: str, retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after


class CommandError(HostError):
    """A host command exited with a code the caller did not allow."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        name = argv[0] if argv else "?"
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
        super().__init__(f"{name} failed with exit code {returncode}: {detail}")
