"""The power tasks of an instance (reboot, power-off, power-on): clean first, forced after a bound.

A reboot or power-off asks the guest to shut down (the hypervisor's shut_down: the
ACPI power button, or the guest agent where one answers) and gives it `[guest]
shutdown_timeout_seconds` before powering it off hard; a reboot then starts it
again (a new guest with its definition's devices). A reset or an immediate
power-off is a pulled plug: writes the guest had not yet put on its disk are
lost (even SSH host keys cloud-init had just made, issue 25). The drain shuts
guests down through the same adapter call. What happened goes into the task's
history entry: "obeyed: ..." or "forced: ...".

The request waits for the task (it is host work: the host gate bounds how many
run at once, api/admission.py); a second power task on the same instance while
one runs is refused at once (409, the instance's claim: instance_claims.py) rather than waiting it out.
"""

import time

from controller.instances import console
from controller.context import Context
from controller.errors import Conflict
from controller.hosts.host_routing import hypervisor_of_instance

POWER_TASKS = ("reboot", "power-on", "power-off")
# A status in a refusal, in words (a status not here is said as it is).
STATE_WORDS = {"shutoff": "stopped", "building": "still being created", "paused": "paused", "crashed": "crashed",
               "error": "in error"}
# Statuses in which a guest runs (QEMU is there): a power-off shuts it down.
_ACTIVE = ("running", "paused", "building")


def run(ctx: Context, row: dict, what: str) -> str:
    """Carry out one power task on the instance of `row`; the history's message for it."""
    hypervisor = hypervisor_of_instance(ctx, row)
    instance_id = row["id"]
    if what == "power-on":
        hypervisor.power_on(instance_id)
        return ""
    wait = ctx.config.guest.shutdown_timeout_seconds
    status = hypervisor.status(instance_id)
    if what == "power-off":
        if status not in _ACTIVE:
            hypervisor.power_off(instance_id)  # NotFound for a lost domain, as before
            return f"it was already {status}; nothing to shut down"
        started = time.monotonic()
        clean = hypervisor.shut_down(instance_id, wait_seconds=wait)
        return outcome(clean, status=status, wait=wait, took=time.monotonic() - started)
    if status != "running":
        raise Conflict(f"reboot needs a running server (this one is {STATE_WORDS.get(status, status)})")
    # Where the console ended: a hypervisor whose reboot kept the run would answer what follows.
    mark = hypervisor.console(instance_id, max_bytes=0).mark
    started = time.monotonic()
    clean = hypervisor.reboot(instance_id, wait_seconds=wait)
    ctx.store.set_console_since(instance_id, console.mark_text(mark))
    return outcome(clean, status=status, wait=wait, took=time.monotonic() - started, then=", then started again")


def outcome(clean: bool, *, status: str, wait: float, took: float, then: str = "") -> str:
    """The history's words for a shutdown: whether the guest obeyed or was forced, and why."""
    if clean:
        return f"obeyed: the guest shut down when asked (ACPI power button) within {took:.0f} s{then}"
    if wait <= 0:
        why = "[guest] shutdown_timeout_seconds is 0, so it was not asked"
    elif status != "running":
        why = f"it was {status} and could not hear the power button"
    else:
        why = (f"the guest did not shut down within {wait:g} s of being asked "
               "([guest] shutdown_timeout_seconds)")
    return f"forced: {why}; it was powered off hard{then}"
