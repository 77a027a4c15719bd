"""GET /healthz and GET /v1/openapi.json, both without authentication."""

import sqlite3

import falcon

from api.openapi import openapi_document
from controller.context import Context
from controller.errors import ControllerError


def run_checks(ctx: Context) -> list[dict]:
    """Every check the service depends on, each {"name", "ok", "detail"}."""
    results = []

    def record(name, fn):
        try:
            fn()
            results.append({"name": name, "ok": True, "detail": ""})
        except (ControllerError, sqlite3.Error, OSError) as e:
            results.append({"name": name, "ok": False, "detail": getattr(e, "message", None) or str(e)})

    record("database", ctx.store.ping)
    record("secret_key", lambda: ctx.secret_box)
    if ctx.adapters is not None:
        for name, check in ctx.adapters.checks():
            record(name, check)
    return results


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
