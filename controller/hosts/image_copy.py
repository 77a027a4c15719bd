"""Base images copied between hypervisor hosts: a host gets an image on first use there."""

import logging
import os
import tempfile

from controller.context import Context
from controller.errors import Conflict, ControllerError, HostError, HostUnavailable
from controller.hosts.host_routing import ensure_config_host, hypervisor_of_host, spec_of
from controller.locks import CrossProcessMark, across_processes
from host_adapters.factory import config_host
from host_adapters.images.image_source import base_file_limit

log = logging.getLogger(__name__)


def ensure_image_on_host(ctx: Context, image: dict, host_name: str, *, progress=None) -> None:
    """The image's base volume is in the host's storage pool afterwards.

    A host that lacks it gets it over its libvirt connection: the content is read
    over a stream from a host that has it (the config's own host first), spooled
    to a private temporary file beside the database, and uploaded like `image add
    --source` (under a temporary name, checked, then published: a failure leaves no
    volume there, a crash only a temporary one reconcile reports).

    Copies of one image to one host look and copy one at a time, in every process of the
    deployment (the server's creates, the agent's drains and evacuations): the others
    wait (at most [hosts] image_copy_wait_seconds, then 503) for the one copy and use it,
    never a copy in progress and never a second upload. The lock is an flock
    (locks.across_processes) whose file says "copying" from just before the upload until
    the base is published: a holder that died in between (its host publishes by a copy
    within the pool, so the final name may hold half a base) leaves that word, and the
    next holder removes the volume of that name and copies again before anyone uses it.
    """
    wait = ctx.config.hosts.image_copy_wait_seconds
    busy = HostUnavailable(f"image {image['id']} is still being copied to host {host_name} after {wait} s; "
                           "try again later")
    with across_processes(ctx, "image-copy", f"{host_name}/{image['id']}", wait_seconds=wait, busy=busy) as mark:
        if mark is not None and mark.read() == _COPYING:
            log.warning("image %s: a copy to host %s was cut short; its volume there is removed and copied again",
                        image["id"], host_name)
            hypervisor_of_host(ctx, host_name).delete_base_image(image["id"])
            mark.write("")
        _copy_image_to_host(ctx, image, host_name, progress=progress, mark=mark)


_COPYING = "copying"


def _copy_image_to_host(ctx: Context, image: dict, host_name: str, *, progress=None,
                        mark: CrossProcessMark | None = None) -> None:
    target = hypervisor_of_host(ctx, host_name)
    if image["id"] in target.list_base_images():
        return
    ensure_config_host(ctx)
    own = config_host(ctx.config).name
    pool = ctx.adapters.hosts
    sources = sorted((r for r in ctx.store.list_hosts() if r["name"] != host_name and pool.reachable(r["name"])),
                     key=lambda r: (r["name"] != own, r["name"]))
    spool_dir = os.path.dirname(os.path.abspath(ctx.store.path)) if ctx.store.path != ":memory:" else None
    errors = []
    for row in sources:
        source = pool.hypervisor(spec_of(row))
        fd, path = tempfile.mkstemp(prefix=".image-", suffix=".qcow2", dir=spool_dir)
        try:
            try:
                if image["id"] not in source.list_base_images():
                    continue
                log.info("copying image %s from host %s to host %s", image["id"], row["name"], host_name)
                kept = source.read_base_image(image["id"], fd, max_bytes=base_file_limit(image["min_disk"]))
            except ControllerError as e:
                errors.append(f"{row['name']}: {e.message}")
                continue
            # A host without content (the test driver) has a blank stand-in: so does the target.
            if mark is not None:
                mark.write(_COPYING)  # cleared once published; left by a process that dies meanwhile
            target.create_base_image(image["id"], size_gb=image["min_disk"], source=path if kept else None,
                                     progress=progress)
            if mark is not None:
                mark.write("")
            return
        except Conflict:
            # Published by another (an older controller, or by hand): not ours, kept.
            if mark is not None:
                mark.write("")
            return
        finally:
            os.close(fd)
            os.unlink(path)
    raise HostError(f"image {image['id']} is on no reachable host to copy to host {host_name} from"
                    + (f" ({'; '.join(errors)})" if errors else ""))
