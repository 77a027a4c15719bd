"""The project's exception types, for the service layer (they live in common/errors.py,
which host_adapters/ imports too without importing controller/)."""

from common.errors import *  # noqa: F401,F403
from common.errors import (  # noqa: F401
    CleanupFailed,
    CommandError,
    Conflict,
    ControllerError,
    Forbidden,
    HostError,
    HostUnavailable,
    HostUnreachable,
    InvalidInput,
    NotFound,
    ServerBusy,
    TooManyRequests,
    Unauthenticated,
)
