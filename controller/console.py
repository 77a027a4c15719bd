"""An instance's serial console since its last start, and whether its guest is ready.

The host keeps the output of the guest's last run (host_adapters/console.py); a
reboot through the API is a reset of the same run, so run_task records where the
output ended then (`console_since`) and the answer starts after it. A power cycle
starts a new run: the mark is of another run and counts no more.
"""

import json
import re

from controller.context import Context
from controller.errors import InvalidInput
from controller.host_routing import hypervisor_of_instance
from controller.lookups import instance_row
from controller.permissions import Requester
from host_adapters.console import MAX_BYTES, ConsoleMark
from host_adapters.seed import ready_marker

DEFAULT_BYTES = 64 * 1024

# What the console of a guest on libvirt's test driver (the sandbox) says: the driver
# records domains and runs nothing, so no guest ever boots, prints or takes SSH logins.
# `cloud server create --wait` stops at `running` when it reads this first line.
SANDBOX_CONSOLE = ("cloud-controller sandbox: libvirt's test driver runs no guest; this server is recorded as "
                   "running but does not boot, print a console or take SSH logins (guests boot on a head "
                   "node with QEMU/KVM)\n")


def parse_bytes(value: str | None) -> int:
    """The `bytes` query parameter: 1 to MAX_BYTES, DEFAULT_BYTES when absent."""
    if value is None:
        return DEFAULT_BYTES
    if not re.fullmatch(r"[0-9]{1,8}", value) or not 1 <= int(value) <= MAX_BYTES:
        raise InvalidInput(f"bytes must be an integer from 1 to {MAX_BYTES}")
    return int(value)


def _mark_of(text: str | None) -> ConsoleMark | None:
    if not text:
        return None
    try:
        found = json.loads(text)
        return ConsoleMark(run=str(found["run"]), size=int(found["size"]))
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: the whole run is answered, as without a reboot


def mark_text(mark: ConsoleMark | None) -> str | None:
    return None if mark is None else json.dumps({"run": mark.run, "size": mark.size})


def get_console(ctx: Context, requester: Requester, instance_id: str, *, max_bytes: int) -> dict:
    """{"console": the last max_bytes of the output since the last start (or API reboot),
    decoded as UTF-8 with replacement; "ready": whether the guest printed its seed's ready
    marker in that output and runs}. 404 unless the requester sees the instance."""
    row = instance_row(ctx, requester, instance_id)
    if ctx.adapters.hypervisor_in_process:
        return {"console": SANDBOX_CONSOLE.encode()[-max_bytes:].decode("utf-8", errors="replace"), "ready": False}
    # The marker is looked for in the last MAX_BYTES of the output, whatever is answered.
    out = hypervisor_of_instance(ctx, row).console(row["id"], max_bytes=MAX_BYTES, since=_mark_of(row.get("console_since")))
    ready = out.running and ready_marker(row["id"]).encode() in out.data
    tail = out.data[len(out.data) - max_bytes:] if len(out.data) > max_bytes else out.data
    return {"console": tail.decode("utf-8", errors="replace"), "ready": ready}
