"""A controller's calls to its cloud auth, each bounded by `[cloud_auth] timeout_seconds`:
introspection, the changes feed, and registering its accounts. The secret is read from
`[cloud_auth] secret_file` (mode 0600, refused otherwise) and sent only to cloud auth."""

import os
import stat
import threading

import requests

from controller.config import Config
from controller.errors import Conflict, InvalidInput, NotFound, ServerBusy

SECRET_FILE_MODE_MASK = stat.S_IRWXG | stat.S_IRWXO


class CloudAuthDown(ServerBusy):
    """Cloud auth did not answer in time, or answered with an error of its own (HTTP 503 with
    Retry-After: never a 401 for a token that could not be checked)."""


def read_secret(path: str) -> str:
    """The controller's secret, from a file only its owner may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise InvalidInput(f"[cloud_auth] secret_file {path}: {e.strerror}") from None
    with os.fdopen(fd) as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & SECRET_FILE_MODE_MASK:
            raise InvalidInput(f"[cloud_auth] secret_file {path} is readable by others (mode {mode & 0o777:o}): "
                               "chmod 600 it")
        secret = f.read().strip()
    if not secret:
        raise InvalidInput(f"[cloud_auth] secret_file {path} is empty")
    return secret


class CloudAuthClient:
    """One requests session per thread (a Session is not thread-safe), every call bounded."""

    def __init__(self, config: Config, secret: str):
        self.url = config.cloud_auth.url
        self.timeout = config.cloud_auth.timeout_seconds
        self.verify = config.cloud_auth.ca_file or True
        self._auth = f"Controller {config.controller.id}:{secret}"
        self.controller_id = config.controller.id
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["Authorization"] = self._auth
            self._local.session = session
        return session

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            r = self._session().request(method, self.url + path, timeout=self.timeout, verify=self.verify,
                                        allow_redirects=False, **kwargs)
        except requests.RequestException as e:
            raise CloudAuthDown(f"cloud auth at {self.url} did not answer: {type(e).__name__}", retry_after=2) from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        message = body.get("message") if isinstance(body, dict) else None
        if r.status_code == 200 and isinstance(body, dict) and isinstance(body.get("data"), dict):
            return body["data"]
        if r.status_code == 409:
            raise Conflict(message or "refused by cloud auth")
        if r.status_code == 404:
            raise NotFound(message or "not found at cloud auth")
        if r.status_code == 400:
            raise InvalidInput(message or "refused by cloud auth")
        if r.status_code in (401, 403):
            # This controller's own credential: an admin must act (rotate-secret, enable).
            raise CloudAuthDown(f"cloud auth refused this controller's credential ({r.status_code}: "
                                f"{message or 'no message'})", retry_after=5)
        raise CloudAuthDown(f"cloud auth answered {r.status_code}", retry_after=2)

    def introspect(self, token: str, userid: str) -> dict:
        return self._call("POST", "/v1/auth/introspect", json={"token": token, "userid": userid})

    def changes(self, *, since: int, epoch: str | None, after: str | None = None) -> dict:
        params = {"since": str(since)}
        if epoch:
            params["epoch"] = epoch
        if after is not None:
            params["after"] = after
        return self._call("GET", "/v1/auth/changes", params=params)

    def register(self, username: str, *, user_id: str, uuid: str, uid: int) -> dict:
        return self._call("PUT", f"/v1/auth/accounts/{self.controller_id}/{username}",
                          json={"user_id": user_id, "uuid": uuid, "uid": uid})

    def unregister(self, username: str) -> dict:
        return self._call("DELETE", f"/v1/auth/accounts/{self.controller_id}/{username}")
