"""Which cluster a portal page shows. A single node, or a cloud auth no controller is
registered at, shows its own cluster under /portal/... as always. A cloud auth serving
several clusters also shows each registered (enabled) controller's pages under
/portal/c/ID/..., read from that controller's API with the session's token
(controller/portal/remote_cluster.py), and an overview of every cluster side by side, read
in parallel: a cluster that does not answer within `[cloud_auth] timeout_seconds` shows as
unreachable while the others render."""

import threading
from concurrent.futures import ThreadPoolExecutor, wait

from controller.cloud_auth.catalog import own_entry
from controller.cloud_auth.registry import list_controllers
from controller.context import Context
from controller.errors import ControllerError, NotFound
from controller.portal.local_cluster import LocalCluster
from controller.portal.remote_cluster import ClusterUnreachable, RemoteCluster, unreachable_card

# Clusters read at once for the overviews of the whole process; more wait for a free reader
# (and show as unreachable if none frees in time). The readers live as long as the process,
# so each keeps its database connection.
_READERS = 16
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="portal-cluster")
        return _pool


def _serves_a_cluster(ctx: Context) -> bool:
    return "controller" in ctx.config.server.interfaces


def remote_entries(ctx: Context) -> list[dict]:
    """The enabled controllers registered here, other than this process's own cluster."""
    own = ctx.config.controller.id if _serves_a_cluster(ctx) else None
    return [c for c in list_controllers(ctx) if c["enabled"] and c["id"] != own]


def navigation(ctx: Context) -> list[dict]:
    """Every cluster the portal shows, by id, when it shows more than its own (else empty):
    the navigation's list."""
    remote = remote_entries(ctx)
    if not remote:
        return []
    shown = ([own_entry(ctx)] if _serves_a_cluster(ctx) else []) + remote
    return sorted(({"id": c["id"], "name": c["name"], "base": f"/portal/c/{c['id']}"} for c in shown),
                  key=lambda c: c["id"])


def local(ctx: Context) -> LocalCluster:
    return LocalCluster(ctx, own_entry(ctx))


def default(ctx: Context, session) -> "LocalCluster | RemoteCluster":
    """The cluster of the pages under /portal/...: this one, or at a cloud auth that serves no
    cluster itself the registered cluster with the lowest id."""
    if _serves_a_cluster(ctx):
        return local(ctx)
    remote = remote_entries(ctx)
    if not remote:
        return local(ctx)
    return RemoteCluster(ctx, remote[0], token=session.api_token, requester=session.requester)


def cluster(ctx: Context, session, cluster_id: str) -> "LocalCluster | RemoteCluster":
    """The cluster of /portal/c/ID/...; 404 when no enabled cluster has that id."""
    if _serves_a_cluster(ctx) and cluster_id == str(ctx.config.controller.id):
        return LocalCluster(ctx, own_entry(ctx), base=f"/portal/c/{cluster_id}")
    for entry in remote_entries(ctx):
        if str(entry["id"]) == cluster_id:
            return RemoteCluster(ctx, entry, token=session.api_token, requester=session.requester)
    raise NotFound(f"no cluster {cluster_id[:20]} here")


def several(ctx: Context) -> bool:
    """Whether the portal shows clusters besides its own (the side-by-side overview)."""
    return bool(remote_entries(ctx))


def overview_cards(ctx: Context, session) -> list[dict]:
    """Each cluster's overview (account, home volume, servers by status, limits), read at once;
    one that fails or does not answer within the timeout is a card saying so."""
    shown = [local(ctx)] if _serves_a_cluster(ctx) else []
    shown += [RemoteCluster(ctx, e, token=session.api_token, requester=session.requester)
              for e in remote_entries(ctx)]
    timeout = ctx.config.cloud_auth.timeout_seconds
    futures = [_readers().submit(c.overview, session.requester) for c in shown]
    # Each call ends by its own deadline; this bounds the page even if one does not.
    wait(futures, timeout=timeout + 1)
    for future in futures:
        future.cancel()  # one still waiting for a reader does not start late
    cards = []
    for c, future in zip(shown, futures):
        if not future.done():
            cards.append(unreachable_card(c, ClusterUnreachable(f"cluster {c.name} did not answer within "
                                                                f"{timeout:g} s")))
            continue
        try:
            cards.append({"id": c.id, "name": c.name, "base": c.base, "ok": True, "error": "", **future.result()})
        except ControllerError as e:
            cards.append(unreachable_card(c, e))
    return cards
