"""GET /healthz and GET /v1/openapi.json, both without authentication."""

import falcon

from api.openapi import openapi_document
from controller.context import Context
from controller.health import run_checks


class Health:
    public = True

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def on_get(self, req, resp):
        checks = run_checks(self.ctx)
        failed = [c for c in checks if not c["ok"]]
        if failed:
            resp.status = falcon.HTTP_503
            resp.media = {
                "status": "unavailable",
                "failed": [{"check": c["name"], "detail": c["detail"]} for c in failed],
            }
        else:
            resp.media = {"status": "ok"}


class OpenApi:
    public = True

    def __init__(self, ctx: Context):
        self.document = openapi_document(controller=ctx.adapters is not None)

    def on_get(self, req, resp):
        resp.media = self.document
