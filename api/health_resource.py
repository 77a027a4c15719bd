"""GET /healthz and GET /v1/openapi.json, both without authentication."""

import falcon

from api.openapi import openapi_document
from controller.monitoring.health import monitor_of
from controller.context import Context


class Health:
    """Answers from the last result of the checks (controller.monitoring.health.HealthMonitor): the
    endpoint needs no login and the checks do real host work (libvirt, LDAP, quota
    commands), so a probe neither runs a check nor waits on one in progress."""

    public = True

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req, resp):
        checks = monitor_of(self.ctx).current()
        if checks is None:
            resp.status = falcon.HTTP_503
            # No round of checks has finished yet (only before the first, a few seconds).
            resp.media = {"status": "starting", "failed": [{"check": "health"}]}
            return
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
