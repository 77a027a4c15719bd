"""GET /healthz and GET /v1/openapi.json, both without authentication."""

import logging
import threading
import time

import falcon

from api.openapi import openapi_document
from controller.context import Context
from controller.health import run_checks

log = logging.getLogger(__name__)


class Health:
    """Runs every check at most once per CACHE_SECONDS: the endpoint needs no login, and
    the checks do real host work (libvirt, LDAP, quota commands)."""

    public = True
    CACHE_SECONDS = 2.0

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._lock = threading.Lock()
        self._cached: tuple[float, list[dict]] | None = None

    def _checks(self) -> list[dict]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.CACHE_SECONDS:
                checks = run_checks(self.ctx)
                self._log_changes(checks)
                self._cached = (now, checks)
            return self._cached[1]

    def _log_changes(self, checks: list[dict]) -> None:
        """The details go to the service log, once per change, for the operator."""
        before = {c["name"]: c["detail"] for c in (self._cached[1] if self._cached else []) if not c["ok"]}
        for c in checks:
            if not c["ok"] and before.get(c["name"]) != c["detail"]:
                log.warning("health check %s failed: %s", c["name"], c["detail"])

    def on_get(self, req, resp):
        checks = self._checks()
        failed = [c for c in checks if not c["ok"]]
        if failed:
            resp.status = falcon.HTTP_503
            # The caller is anonymous: the names of the failed checks only. Their
            # details (paths, LDAP and libvirt errors) map the host for an attacker;
            # `cloud-agent check` and the service log carry them.
            resp.media = {"status": "unavailable", "failed": [{"check": c["name"]} for c in failed]}
        else:
            resp.media = {"status": "ok"}


class OpenApi:
    public = True

    def __init__(self, ctx: Context):
        self.document = openapi_document(controller=ctx.adapters is not None)

    def on_get(self, req, resp):
        resp.media = self.document
