"""A base image copied to a host once, across processes (issue 27, item 6).

The server's creates and the agent's drains and evacuations copy images to hosts from
different processes: the copy lock is an flock every process of the deployment takes,
and a copy whose process died between upload and publish (the final name may then hold
half a base) is removed and copied again by the next holder, never used. On fake hosts
(tests/hosts/test_hosts.py's cluster); another process holds the lock for real.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.hosts import image_copy
from controller.errors import HostError, HostUnavailable
from tests.hosts.test_hosts import cluster  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]

# Another process of the deployment (a `cloud-agent host drain`) holding the copy lock of
# one image on one host until its stdin closes.
HOLDER = """
import sys, types
from controller import locks
from controller.errors import Conflict
ctx = types.SimpleNamespace(store=types.SimpleNamespace(path=sys.argv[1]))
with locks.across_processes(ctx, "image-copy", sys.argv[2], wait_seconds=5, busy=Conflict("busy")):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_copy_waits_for_the_copy_another_process_makes(cctx, cluster, catalog):
    image = cctx.store.get_image(catalog["public"]["id"])
    cctx.config = cctx.config.with_values({"hosts": {"image_copy_wait_seconds": "1"}})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, cctx.store.path, f"node-a/{image['id']}"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(HostUnavailable, match=f"image {image['id']} is still being copied to host node-a"):
            image_copy.ensure_image_on_host(cctx, image, "node-a")
        assert 0.9 < time.monotonic() - started < 5
        assert image["id"] not in cluster["node-a"].list_base_images()  # nothing uploaded beside it
    finally:
        holder.stdin.close()
        assert holder.wait(10) == 0
    image_copy.ensure_image_on_host(cctx, image, "node-a")  # the lock is free again
    assert image["id"] in cluster["node-a"].list_base_images()


def test_a_copy_cut_short_after_its_upload_is_made_again_not_used(cctx, cluster, catalog, monkeypatch):
    image = cctx.store.get_image(catalog["public"]["id"])
    node_a = cluster["node-a"]
    name = node_a._names.base(image["id"])
    real = type(node_a).create_base_image

    def dies_while_publishing(self, image_id, **kw):
        # The host's in-pool copy had begun (the final name exists, half made) when the
        # connection was lost: the adapter could not remove it.
        self.base_images[name] = 1
        raise HostError("connection lost while publishing; volume not removed")

    monkeypatch.setattr(type(node_a), "create_base_image", dies_while_publishing)
    with pytest.raises(HostError, match="connection lost"):
        image_copy.ensure_image_on_host(cctx, image, "node-a")
    assert node_a.base_images[name] == 1  # half a base under the final name
    monkeypatch.setattr(type(node_a), "create_base_image", real)
    image_copy.ensure_image_on_host(cctx, image, "node-a")
    assert node_a.base_images[name] == image["min_disk"]  # removed and copied again
    assert node_a.calls["delete_base_image"] == 1
    # Once published, the next copy finds it and leaves it.
    image_copy.ensure_image_on_host(cctx, image, "node-a")
    assert node_a.calls["delete_base_image"] == 1 and node_a.calls["create_base_image"] == 1
