"""An instance's serial console since its last start, and whether its guest is ready.

The host keeps the output of the guest's last run (host_adapters/guests/console.py); a
reboot through the API records where the output ended then (`console_since`, for a
hypervisor whose reboot kept the run) and the answer starts after it. A power cycle,
and the API's reboot (a shutdown, then a start), starts a new run: the mark is of
another run and counts no more.
"""

import json
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass

from controller.context import Context
from controller.errors import InvalidInput, TooManyRequests
from controller.hosts.host_routing import hypervisor_of_instance
from controller.lookups import instance_row
from controller.permissions import Requester
from host_adapters.guests.console import MAX_BYTES, ConsoleMark, ConsoleOutput
from host_adapters.guests.seed import ready_marker

DEFAULT_BYTES = 64 * 1024
# Console reads one user may have in flight in this process; more are 429 (Retry-After 1):
# each holds a server thread and a stream from the host.
READS_PER_USER = 2
# Instances whose scan for the ready marker is remembered (the least recently read go first).
SCANS_KEPT = 10_000

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
    decoded as UTF-8 with replacement; "ready": whether the guest runs and printed its seed's
    ready marker in that output}. 404 unless the requester sees the instance; 429 while the
    requester has READS_PER_USER console reads in flight."""
    row = instance_row(ctx, requester, instance_id)
    if ctx.adapters.hypervisor_in_process:
        return {"console": SANDBOX_CONSOLE.encode()[-max_bytes:].decode("utf-8", errors="replace"), "ready": False}
    since = _mark_of(row.get("console_since"))
    with _reading(requester.id):
        hypervisor = hypervisor_of_instance(ctx, row)
        # Only what is answered is read; the output the marker may be in is read once (_scan).
        out = hypervisor.console(row["id"], max_bytes=max_bytes, since=since)
        ready = out.running and _scan(hypervisor, row["id"], out, since)
    return {"console": out.data.decode("utf-8", errors="replace"), "ready": ready}


_in_flight: dict[str, int] = {}
_in_flight_lock = threading.Lock()


@contextmanager
def _reading(user_id: str):
    with _in_flight_lock:
        if _in_flight.get(user_id, 0) >= READS_PER_USER:
            raise TooManyRequests(f"at most {READS_PER_USER} console reads of one user at once; try again",
                                  retry_after=1)
        _in_flight[user_id] = _in_flight.get(user_id, 0) + 1
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight[user_id] -= 1
            if not _in_flight[user_id]:
                del _in_flight[user_id]


@dataclass(frozen=True)
class _Scan:
    """How far one run's output (from `start`, the reboot mark or 0) was looked through for
    the ready marker: to `size`; `found` it; `carry`, its last bytes (a marker cut in two)."""

    run: str
    start: int
    size: int
    found: bool
    carry: bytes


_scans: OrderedDict[str, _Scan] = OrderedDict()
_scans_lock = threading.Lock()


def _scan(hypervisor, instance_id: str, out: ConsoleOutput, since: ConsoleMark | None) -> bool:
    """Whether the ready marker is in the output of the running guest's run since `since`.
    Each byte is read for it once per run (remembered in this process), the last MAX_BYTES
    at most of what came since the last look: a read of a few bytes streams a few bytes
    once the marker is found, and what is new otherwise."""
    marker = ready_marker(instance_id).encode()
    run, size = out.mark.run, out.mark.size
    start = min(since.size, size) if since is not None and since.run == run else 0
    with _scans_lock:
        seen = _scans.get(instance_id)
    if seen is None or (seen.run, seen.start) != (run, start) or seen.size > size:
        seen = _Scan(run=run, start=start, size=start, found=False, carry=b"")
    if not seen.found and seen.size < size:
        new = size - seen.size
        carry = seen.carry
        if new <= len(out.data):
            chunk = out.data[len(out.data) - new:]
        else:
            more = hypervisor.console(instance_id, max_bytes=min(new, MAX_BYTES), since=ConsoleMark(run, seen.size))
            if more.mark is None or more.mark.run != run:
                return False  # stopped or started again meanwhile: not ready now
            chunk, size = more.data, more.mark.size
            if size - seen.size > len(chunk):
                carry = b""  # more than MAX_BYTES came: the marker is looked for in the last MAX_BYTES
        found = marker in carry + chunk
        seen = _Scan(run=run, start=start, size=size, found=found, carry=(carry + chunk)[-len(marker):])
    with _scans_lock:
        _scans[instance_id] = seen
        _scans.move_to_end(instance_id)
        while len(_scans) > SCANS_KEPT:
            _scans.popitem(last=False)
    return seen.found
