"""A cluster the portal at cloud auth shows from its controller's API (as Horizon renders
Nova): every page is read and every form sent with the signed-in user's own token (the
portal session's), so the controller decides what the user sees and may do, as for any
client. Each page's calls share one deadline of `[cloud_auth] timeout_seconds`: a
controller that does not answer costs a page no more, and the page says the cluster is
unreachable.

What only cloud auth knows is read here: the accounts registered for the cluster (the
usernames behind the account ids of a server's users, and the user's own account) and
the users the requester manages (whom it may grant a server to)."""

import time
from urllib.parse import quote

import requests

from controller.context import Context
from controller.errors import Conflict, ControllerError, Forbidden, InvalidInput, NotFound, ServerBusy
from controller.permissions import Requester
from controller.portal import views

# The statuses a controller answers, as the errors the portal shows with the same status.
_ERRORS = {400: InvalidInput, 403: Forbidden, 404: NotFound, 409: Conflict}


class ClusterUnreachable(ServerBusy):
    """The cluster's controller did not answer within the deadline, or not as an API does (503)."""


class RemoteCluster:
    remote = True

    def __init__(self, ctx: Context, entry: dict, *, token: str, requester: Requester, session=None):
        self.ctx, self.id, self.name, self.url = ctx, entry["id"], entry["name"], entry["url"].rstrip("/")
        self.base = f"/portal/c/{self.id}"
        self.timeout = ctx.config.cloud_auth.timeout_seconds
        self.verify = ctx.config.cloud_auth.ca_file or True
        self._headers = {"X-Auth-Token": token, "X-Auth-Cloudauth-Id": requester.id, "Accept": "application/json"}
        self.session = session or requests.Session()
        self.deadline = time.monotonic() + self.timeout

    # -- the calls ---------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, params: dict | None = None, body: dict | None = None) -> list:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._unreachable("did not answer")
        try:
            r = self.session.request(method, self.url + path, params=params, json=body, headers=self._headers,
                                     timeout=left, verify=self.verify, allow_redirects=False)
        except requests.RequestException as e:
            raise self._unreachable("did not answer", f" ({type(e).__name__})") from None
        try:
            answer = r.json()
        except ValueError:
            answer = None
        message = answer.get("msg") if isinstance(answer, dict) else None
        if 200 <= r.status_code < 300 and isinstance(answer, dict) and isinstance(answer.get("data"), list):
            return answer["data"]
        if r.status_code in _ERRORS and isinstance(message, str):
            raise _ERRORS[r.status_code](message)
        if r.status_code == 401:
            # This session's token refused: the cluster has not heard of it yet, or it ended.
            raise ClusterUnreachable(f"cluster {self.name} did not accept this session: log in again "
                                     "if it persists", retry_after=2)
        if r.status_code == 429 and isinstance(message, str):
            raise ServerBusy(message, retry_after=int(r.headers.get("Retry-After", "2") or 2))
        raise ClusterUnreachable(f"cluster {self.name} ({self.url}) answered {r.status_code}"
                                 + (f": {message}" if isinstance(message, str) else ""), retry_after=2)

    def _unreachable(self, what: str, why: str = "") -> ClusterUnreachable:
        return ClusterUnreachable(f"cluster {self.name} ({self.url}) {what} within {self.timeout:g} s{why}",
                                  retry_after=max(1, round(self.timeout)))

    # -- what cloud auth knows of this cluster ------------------------------------------------
    def _usernames(self, uuids) -> dict[str, str]:
        return self.ctx.store.registered_usernames(self.id, sorted(set(uuids)))

    def account(self, requester: Requester) -> dict | None:
        held = self.ctx.store.registered_accounts_of_users([requester.id]).get(requester.id, [])
        mine = [a for a in held if a["cloud_controller_id"] == self.id]
        if not mine:
            return None
        return {"username": mine[0]["username"], "uid": mine[0]["uid"], "home": "", "uuid": mine[0]["uuid"]}

    def grantable(self, requester: Requester) -> list[dict]:
        return views.grantable(self.ctx, requester, controller_id=self.id)

    # -- pages -----------------------------------------------------------------------------------
    def _own_volume(self, requester: Requester) -> dict | None:
        found = [v for v in self._call("GET", "/v1/storage-volume", params={"cloudauth-id": requester.id})
                 if v.get("cloudauth-id") == requester.id]
        return found[0] if found else None

    def overview(self, requester: Requester) -> dict:
        mine = [s for s in self._call("GET", "/v1/server-instance", params={"cloudauth-id": requester.id})
                if s.get("cloudauth-id") == requester.id]
        counts: dict[str, int] = {}
        for s in mine:
            counts[s["status"]] = counts.get(s["status"], 0) + 1
        usage = self._call("GET", "/v1/limits", params={"cloudauth-id": requester.id})
        ending = [{"id": s["id"], "hostname": s.get("hostname") or "", "expires_at": s.get("expires-at") or "",
                   "lease": _lease(s)} for s in mine]
        return {
            "cluster": self.id, "cluster_name": self.name, "is_admin": requester.is_superuser,
            "account": self.account(requester), "volume": self._own_volume(requester),
            "by_status": sorted(counts.items()), "total": len(mine),
            "limits": views.limit_rows(usage[0] if usage else {}),
            **views.ending_leases(ending),
        }

    def _names(self) -> tuple[dict, dict]:
        images = {i["id"]: i["name"] for i in self._call("GET", "/v1/server-image")}
        flavors = {str(f["id"]): f["name"] for f in self._call("GET", "/v1/server-flavor")}
        return images, flavors

    def _server(self, s: dict, names: dict, images: dict, flavors: dict) -> dict:
        return {
            "id": s["id"], "status": s["status"], "hostname": s.get("hostname") or "",
            "private_ip": s.get("private-ip") or "", "public_ip": s.get("public-ip") or "",
            "image": images.get(s["server-image"], s["server-image"]),
            "flavor": flavors.get(str(s["server-flavor"]), str(s["server-flavor"])),
            "owner_id": s["cloudauth-id"], "created": s["creation-date"],
            "users": [{"uuid": u, "username": names.get(u, u)} for u in s["users"]],
            # A controller from before leases answers neither: no lease.
            "expires_at": s.get("expires-at"), "lease": _lease(s),
        }

    def servers(self, requester: Requester) -> dict:
        rows = self._call("GET", "/v1/server-instance")
        images, flavors = self._names()
        names = self._usernames(u for r in rows for u in r["users"])
        shown = [self._server(r, names, images, flavors) for r in rows]
        return {"servers": shown, **views.with_owners(self.ctx, requester, shown, key="owner_id")}

    def create_form(self, requester: Requester) -> dict:
        return {"images": [i for i in self._call("GET", "/v1/server-image") if i.get("active", True)],
                "flavors": self._call("GET", "/v1/server-flavor"), "grantable": self.grantable(requester)}

    def create_server(self, requester: Requester, body: dict) -> str:
        return self._call("POST", "/v1/server-instance", body=body)[0]["id"]

    def _one(self, instance_id: str) -> dict:
        return self._call("GET", f"/v1/server-instance/{quote(instance_id, safe='')}")[0]

    def server_summary(self, requester: Requester, instance_id: str) -> dict:
        row = self._one(instance_id)
        images, flavors = self._names()
        return {"server": self._server(row, self._usernames(row["users"]), images, flavors)}

    def server_detail(self, requester: Requester, instance_id: str) -> dict:
        row = self._one(instance_id)
        path = f"/v1/server-instance/{quote(row['id'], safe='')}"
        try:
            tail = self._call("GET", path + "/console", params={"bytes": str(views.CONSOLE_BYTES)})[0]
            console_error = ""
        except (ServerBusy, NotFound) as e:
            tail, console_error = {"console": "", "ready": False}, e.message
        history = self._call("GET", path + "/actions")
        images, flavors = self._names()
        mine = self.account(requester)
        granted = set(row["users"])
        return {
            "server": self._server(row, self._usernames(row["users"]), images, flavors),
            "console": tail["console"], "ready": tail["ready"], "console_error": console_error,
            "ssh": f"ssh {mine['username']}@{row['private-ip']}" if mine and row.get("private-ip") else "",
            "history": views.with_requesters(self.ctx, list(reversed(history))),
            "grantable": [a for a in self.grantable(requester) if a["uuid"] not in granted],
        }

    def run_task(self, requester: Requester, instance_id: str, task: dict) -> None:
        self._call("PUT", f"/v1/server-instance/{quote(instance_id, safe='')}", body={"task": task})

    def delete_server(self, requester: Requester, instance_id: str) -> None:
        self._call("DELETE", f"/v1/server-instance/{quote(instance_id, safe='')}")

    def renew_lease(self, requester: Requester, instance_id: str, hours: float | None) -> dict:
        """POST .../lease: the lease to end `hours` from now (None, an empty body: the default)."""
        body = {} if hours is None else {"hours": hours}
        return self._call("POST", f"/v1/server-instance/{quote(instance_id, safe='')}/lease", body=body)[0]

    def volume_page(self, requester: Requester) -> dict:
        return {"account": self.account(requester), "volume": self._own_volume(requester), "max_size_gb": None,
                "used_bytes": None}

    def create_volume(self, requester: Requester, body: dict) -> None:
        self._call("POST", "/v1/storage-volume", body=body)

    def delete_volume(self, requester: Requester, volume_id: str) -> None:
        self._call("DELETE", f"/v1/storage-volume/{quote(volume_id, safe='')}")

    def groups_page(self, requester: Requester) -> dict:
        found = self._call("GET", "/v1/group")
        for g in found:
            g["gid"] = None  # the controller's API does not give it
        return {"groups": found, "account": self.account(requester),
                **views.with_owners(self.ctx, requester, found, key="cloudauth-id")}

    def create_group(self, requester: Requester, body: dict) -> None:
        self._call("POST", "/v1/group", body=body)

    def update_group(self, requester: Requester, group_id: str, body: dict) -> None:
        self._call("PUT", f"/v1/group/{quote(group_id, safe='')}", body=body)

    def delete_group(self, requester: Requester, group_id: str) -> None:
        self._call("DELETE", f"/v1/group/{quote(group_id, safe='')}")


def _lease(s: dict) -> str:
    """A server-instance object's `lease`, one of the four the portal shows ("none" otherwise)."""
    lease = s.get("lease")
    return lease if lease in ("active", "expiring", "expired") and s.get("expires-at") else "none"


def unreachable_card(cluster, error: ControllerError) -> dict:
    return {"id": cluster.id, "name": cluster.name, "base": cluster.base, "ok": False, "error": error.message}
