"""Health checks shared by GET /healthz and `cloud-agent check`."""

import sqlite3

from controller.context import Context
from controller.errors import ControllerError
from controller.security import SecretBox


def run_checks(ctx: Context, *, thorough: bool = False) -> list[dict]:
    """Every check the service depends on, each {"name", "ok", "detail"}.

    thorough (the agent's `check`) adds what costs a real guest start: whether
    QEMU starts a guest with the configured virt_type and cpu_mode.
    """
    results = []

    def record(name, fn):
        try:
            fn()
            results.append({"name": name, "ok": True, "detail": ""})
        except (ControllerError, sqlite3.Error, OSError) as e:
            results.append({"name": name, "ok": False, "detail": getattr(e, "message", None) or str(e)})

    record("database", ctx.store.ping)
    # Read the key file anew: a key deleted under a running service must show here,
    # not only at the next restart.
    record("secret_key", lambda: SecretBox(ctx.config.get("auth", "secret_key_file")))
    if ctx.adapters is not None:
        for name, check in ctx.adapters.checks():
            record(name, check)
        if thorough:
            record("guest_start", ctx.adapters.hypervisor.probe_guest)
    return results
