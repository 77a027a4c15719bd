"""The cluster of this process (it serves the controller interface): the portal's pages read
through controller/portal/views.py and act through the JSON resources' own service
functions, as a single node's portal always has. The same methods as RemoteCluster, so a
page does not ask which one it shows."""

from controller.context import Context
from controller.instances import instances, leases
from controller.permissions import Requester
from controller.portal import views
from controller.storage import volumes
from controller.users import groups


class LocalCluster:
    remote = False

    def __init__(self, ctx: Context, entry: dict, *, base: str = "/portal"):
        self.ctx, self.id, self.name, self.url = ctx, entry["id"], entry["name"], entry.get("url", "")
        self.base = base

    def overview(self, requester: Requester) -> dict:
        return views.overview(self.ctx, requester)

    def servers(self, requester: Requester) -> dict:
        return views.servers(self.ctx, requester)

    def create_form(self, requester: Requester) -> dict:
        return views.create_form(self.ctx, requester)

    def create_server(self, requester: Requester, body: dict) -> str:
        return instances.create_instance(self.ctx, requester, body)["id"]

    def server_summary(self, requester: Requester, instance_id: str) -> dict:
        return views.server_summary(self.ctx, requester, instance_id)

    def server_detail(self, requester: Requester, instance_id: str) -> dict:
        return views.server_detail(self.ctx, requester, instance_id)

    def run_task(self, requester: Requester, instance_id: str, task: dict) -> None:
        instances.run_task(self.ctx, requester, instance_id, task)

    def delete_server(self, requester: Requester, instance_id: str) -> None:
        instances.delete_instance(self.ctx, requester, instance_id)

    def renew_lease(self, requester: Requester, instance_id: str, hours: float | None) -> dict:
        """The lease to end `hours` from now (None: the flavor's or the site's default)."""
        return leases.renew(self.ctx, requester, instance_id, hours)

    def volume_page(self, requester: Requester) -> dict:
        return views.volume_page(self.ctx, requester)

    def create_volume(self, requester: Requester, body: dict) -> None:
        volumes.create_volume(self.ctx, requester, body)

    def delete_volume(self, requester: Requester, volume_id: str) -> None:
        volumes.delete_volume(self.ctx, requester, volume_id)

    def groups_page(self, requester: Requester) -> dict:
        return views.groups_page(self.ctx, requester)

    def create_group(self, requester: Requester, body: dict) -> None:
        groups.create_group(self.ctx, requester, body)

    def update_group(self, requester: Requester, group_id: str, body: dict) -> None:
        groups.update_group(self.ctx, requester, group_id, body)

    def delete_group(self, requester: Requester, group_id: str) -> None:
        groups.delete_group(self.ctx, requester, group_id)
