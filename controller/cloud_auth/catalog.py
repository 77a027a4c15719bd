"""`GET /v1/auth/catalog`: the clusters a user can reach with one login. The controllers
registered here, and this service itself when it serves the controller interface (a single
node lists itself)."""

from controller.cloud_auth.registry import list_controllers
from controller.context import Context


def own_entry(ctx: Context) -> dict:
    config = ctx.config.controller
    return {"id": config.id, "name": config.name or f"cluster-{config.id}", "url": config.url, "enabled": True}


def catalog(ctx: Context) -> dict:
    entries = []
    if "controller" in ctx.config.server.interfaces:
        entries.append(own_entry(ctx))
    entries += [{k: c[k] for k in ("id", "name", "url", "enabled")} for c in list_controllers(ctx)]
    entries.sort(key=lambda c: c["id"])
    enabled = [c["id"] for c in entries if c["enabled"]]
    if "controller" in ctx.config.server.interfaces:
        default = ctx.config.controller.id
    else:
        default = enabled[0] if enabled else None
    return {"controllers": entries, "default": default}
