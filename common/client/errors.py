"""What a call of the client library raises."""


class ClientError(Exception):
    """Any failure of a call; `message` is one line for a person."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ApiError(ClientError):
    """The service answered with an error: its HTTP status and its message (the envelope's
    `msg` or `message`), and the request id it gave the call, for the operator's logs."""

    def __init__(self, status: int, message: str, *, request_id: str | None = None):
        super().__init__(message)
        self.status = status
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status})"


class Unreachable(ClientError):
    """No answer: the service's URL is wrong, or it is down, or the call timed out."""


class LoginEnded(ApiError):
    """The login's token expired or was revoked and cannot be renewed here; the message says
    when it ended and which `cloud login` renews it."""

    def __init__(self, message: str):
        super().__init__(401, message)


class NotTheApi(ApiError):
    """What answered is a web page (the portal, a web site), not the API: the URL is wrong."""
