"""Client: one service URL and one user's credentials, a method per operation.

The token is renewed when it has expired or the service refuses it (401),
from the API key and secret (or email and password) the client was given;
`on_token` is called with each new token so that a caller can keep it. A
token that has ended and cannot be renewed is not sent: LoginEnded says when
it ended and how to log in again (`renew_hint`). A 429 or 503 with
`Retry-After` is sent again after that wait, within `retry_seconds` in all.
"""

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qs, quote, urlsplit

import requests

from common.client.errors import ApiError, ClientError, LoginEnded, NotTheApi, Unreachable
from common.client.models import (Action, ActionPage, Console, Flavor, Group, Image, Limits, Server, Token, User,
                                  Volume)
from common.client.urls import check_url, describe, origin_of, plain_http_host

DEFAULT_TIMEOUT = 60.0
# A power task's answer waits for the guest's clean shutdown: the service's [guest]
# shutdown_timeout_seconds (at most 600) and a start. Its call waits this long at least.
TASK_TIMEOUT = 660.0
# How long in all a call waits out 429 and 503 answers that say when to come back (Retry-After).
DEFAULT_RETRY_SECONDS = 30.0
# A Retry-After of 0 (or one in the past) still waits this long, so retries never spin.
_MIN_RETRY_WAIT = 0.5
# A token this close to its end is renewed before the call rather than refused during it.
_RENEW_MARGIN_SECONDS = 30


def _expired(expires_at: str | None, *, margin: float = _RENEW_MARGIN_SECONDS) -> bool:
    if not expires_at:
        return False
    try:
        end = datetime.strptime(expires_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return False  # unknown form: let the service decide
    return end.timestamp() - margin <= time.time()


def _seg(value: str) -> str:
    """One path segment: whatever a caller passes never changes the path."""
    return quote(str(value), safe="")


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def _next_cursor(resp: requests.Response) -> str | None:
    """The `before` of the answer's `Link: <...>; rel=next`, if any."""
    link = resp.links.get("next", {}).get("url", "")
    found = parse_qs(urlsplit(link).query).get("before")
    return found[0] if found else None


# Served by cloud auth; every other path by a cluster's controller.
_AUTH_PATHS = ("/v1/auth/", "/v1/user/")
# The fields of a request body that hold a secret (a login, a rotation, a password change,
# a new user's password).
_SECRET_FIELDS = ("password", "new_password", "api_secret")


def _carries_secret(headers: dict | None, body) -> bool:
    return bool((headers or {}).get("X-Auth-Token")) or (
        isinstance(body, dict) and any(body.get(k) for k in _SECRET_FIELDS))


def _web_page(resp: requests.Response) -> bool:
    """An answer for a web browser (the portal's pages, a web site), never the API's JSON."""
    return resp.headers.get("Content-Type", "").split(";")[0].strip().lower() in ("text/html",
                                                                                   "application/xhtml+xml")


def _web_page_message(base: str) -> str:
    origin = origin_of(base)
    if origin != base:
        return (f"{base} answers with a web page, not the API: that is the portal or another web site; "
                f"is the API at {origin}?")
    return (f"{base} answers with a web page, not the API: that is the portal or another web site; give "
            "the API's URL (the portal's Credentials page shows the `cloud login` line)")


class Client:
    def __init__(self, url: str, *, token: str | None = None, userid: str | None = None,
                 expires_at: str | None = None, api_key: str | None = None, api_secret: str | None = None,
                 email: str | None = None, password: str | None = None,
                 on_token: Callable[[Token], None] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 session: requests.Session | None = None, token_source: str | None = None,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS, renew_hint: str | None = None,
                 cluster: str | None = None, controller_url: str | None = None,
                 on_plain_http: Callable[[str], None] | None = None):
        self.url = check_url(url)
        # A cloud auth serving several clusters: logins and users there (self.url); servers,
        # volumes and groups at a cluster's controller: `controller_url` (the default cluster
        # `cloud login` kept), or `cluster` (a name or id) looked up in the catalog at the
        # first such call (controller_base), else this service itself.
        self.cluster = cluster
        self._controller_url: str | None = None if cluster else (check_url(controller_url) if controller_url
                                                                  else self.url)
        self.token, self.userid, self.expires_at = token, userid, expires_at
        # How the token was issued: "api_key" or "password" (which of the user's changes end it).
        self.source = token_source
        self._key, self._secret = api_key, api_secret
        self._email, self._password = email, password
        self.on_token = on_token
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.renew_hint = renew_hint or f"cloud login --url {self.url}"
        self.http = session or requests.Session()
        self._lock = threading.Lock()
        # Called with the host before each request that carries a token, a secret or a password
        # over plain http:// to a host that is not loopback (the command warns; see urls.py).
        self.on_plain_http = on_plain_http

    @property
    def can_renew(self) -> bool:
        return bool((self._key and self._secret) or (self._email and self._password))

    # -- transport ------------------------------------------------------------
    def _send_once(self, method: str, path: str, *, params=None, json=None, headers=None,
                   timeout: float | None = None) -> requests.Response:
        timeout = timeout or self.timeout
        base = self.url if path.startswith(_AUTH_PATHS) else self.controller_base()
        if self.on_plain_http is not None and _carries_secret(headers, json):
            host = plain_http_host(base)
            if host:
                self.on_plain_http(host)
        try:
            resp = self.http.request(method, base + path, params=params, json=json, headers=headers,
                                     timeout=timeout, allow_redirects=False)
        except requests.Timeout:
            raise Unreachable(f"{base} did not answer within {timeout:g} s") from None
        except requests.RequestException as e:
            raise Unreachable(f"cannot reach {base}: {describe(e)}") from None
        if _web_page(resp):
            raise NotTheApi(resp.status_code, _web_page_message(base), request_id=resp.headers.get("X-Request-Id"))
        return resp

    def _send(self, method: str, path: str, **kw) -> requests.Response:
        """One request; a 429 or 503 that says when to come back is sent again then, while that
        stays within retry_seconds of the first try (the service did not act on it: a busy
        gate, a full hash pool, a throttle). The last answer is returned as it is."""
        deadline = time.monotonic() + self.retry_seconds
        while True:
            resp = self._send_once(method, path, **kw)
            if resp.status_code not in (429, 503):
                return resp
            wait = _retry_after(resp.headers.get("Retry-After"))
            if wait is None:
                return resp
            wait = max(wait, _MIN_RETRY_WAIT)
            if time.monotonic() + wait > deadline:
                return resp
            time.sleep(wait)

    @staticmethod
    def _body(resp: requests.Response) -> dict:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = resp.text.strip().splitlines()[0][:200] if resp.text.strip() else resp.reason
            raise ApiError(resp.status_code, f"unexpected answer: {text}",
                           request_id=resp.headers.get("X-Request-Id"))
        return body

    def _checked(self, resp: requests.Response) -> dict:
        body = self._body(resp)
        if resp.status_code >= 400 or body.get("success") is False:
            message = body.get("msg") or body.get("message") or resp.reason or "error"
            retry = _retry_after(resp.headers.get("Retry-After")) if resp.status_code in (429, 503) else None
            if retry is not None:
                message = f"{message} (the service asks to retry in {retry:.0f} s)"
            raise ApiError(resp.status_code, message, request_id=resp.headers.get("X-Request-Id"))
        return body

    def _token_from(self, creds: dict, source: str) -> Token:
        token = Token.from_api(self._checked(self._send("POST", "/v1/auth/token", json=creds))["data"])
        self.token, self.userid, self.expires_at = token.token, token.userid, token.expires_at
        self.source = source
        if self.on_token is not None:
            self.on_token(token)
        return token

    def login(self) -> Token:
        """A new token from the kept API key and secret, or email and password."""
        if self._key and self._secret:
            return self._token_from({"api_key": self._key, "api_secret": self._secret}, "api_key")
        if self._email and self._password:
            return self._token_from({"email": self._email, "password": self._password}, "password")
        raise ClientError(f"no credentials to get a token with: run `{self.renew_hint}`")

    def _renew(self) -> None:
        """login() again for a login that had a token: a refusal says the kept credentials no longer
        work. A first login's refusal is the service's own answer ("invalid credentials")."""
        first = self.token is None
        try:
            self.login()
        except ApiError as e:
            if e.status != 401 or first:
                raise
            raise LoginEnded(f"your login to {self.url} could not be renewed: the service refused the kept "
                             f"credentials ({e.message}); a new API secret, a changed password or a "
                             f"deactivated account ends them: run `{self.renew_hint}`") from None

    def _ended(self, how: str) -> LoginEnded:
        end = f" at {self.expires_at}" if self.expires_at else ""
        if how == "expired":
            what = f"your login to {self.url} ended{end} (its token expired)"
        else:
            what = (f"your login to {self.url} was refused before its end{end} (revoked: a new API secret, "
                    f"a changed password or a deactivated account ends it)")
        return LoginEnded(f"{what}: run `{self.renew_hint}`")

    def _ensure_token(self) -> None:
        with self._lock:
            if (not self.token or _expired(self.expires_at)) and self.can_renew:
                self._renew()
        if not self.token or not self.userid:
            raise ClientError(f"not logged in: run `{self.renew_hint}`")
        if _expired(self.expires_at, margin=0):
            raise self._ended("expired")  # never sent: the service would refuse it

    def call(self, method: str, path: str, *, params=None, json=None, renew: bool = True,
             timeout: float | None = None) -> dict:
        """One authenticated call; the answer's envelope (ApiError on an error). With renew=False
        a 401 is the call's own answer (a wrong proof), never a reason to log in again.
        `timeout`: this call's wait for the answer, if not the client's."""
        return self._checked(self._answer(method, path, params=params, json=json, renew=renew, timeout=timeout))

    def _answer(self, method: str, path: str, *, params=None, json=None, renew: bool = True,
                timeout: float | None = None) -> requests.Response:
        """call()'s answer itself, unchecked (for its headers)."""
        self._ensure_token()
        sent = self.token
        resp = self._send(method, path, params=params, json=json, headers=self._auth(), timeout=timeout)
        if resp.status_code == 401 and renew:
            if not self.can_renew:
                raise self._ended("revoked")
            with self._lock:
                if self.token == sent:  # another thread may have renewed it already
                    self._renew()
            resp = self._send(method, path, params=params, json=json, headers=self._auth(), timeout=timeout)
        return resp

    def _auth(self) -> dict:
        return {"X-Auth-Token": self.token, "X-Auth-Cloudauth-Id": self.userid}

    def _items(self, method: str, path: str, cls, **kw) -> list:
        return [cls.from_api(d) for d in self.call(method, path, **kw)["data"]]

    def _one(self, method: str, path: str, cls, **kw):
        items = self._items(method, path, cls, **kw)
        if not items:
            raise ApiError(404, f"{path} answered nothing")
        return items[0]

    # -- server-instances ---------------------------------------------------------
    def list_servers(self, *, owner: str | None = None) -> list[Server]:
        return self._items("GET", "/v1/server-instance", Server, params={"cloudauth-id": owner} if owner else None)

    def get_server(self, server_id: str) -> Server:
        return self._one("GET", f"/v1/server-instance/{_seg(server_id)}", Server)

    def server_hosts(self) -> dict[str, str]:
        """Server id -> the hypervisor host it is on, for every server: a superuser's only (403
        for anyone else; the server objects themselves carry no host)."""
        return {d["id"]: d["host"] for d in self.call("GET", "/v1/server-host")["data"]}

    def create_server(self, *, image: str, flavor: str, users: Iterable[str] = ()) -> Server:
        body = {"server-image": image, "server-flavor": flavor}
        users = list(users)
        if users:
            body["users"] = users
        return self._one("POST", "/v1/server-instance", Server, json=body)

    def delete_server(self, server_id: str) -> None:
        self.call("DELETE", f"/v1/server-instance/{_seg(server_id)}")

    def _task(self, server_id: str, task: dict) -> Server:
        return self._one("PUT", f"/v1/server-instance/{_seg(server_id)}", Server, json={"task": task},
                         timeout=max(self.timeout, TASK_TIMEOUT))

    def reboot_server(self, server_id: str) -> Server:
        return self._task(server_id, {"what": "reboot"})

    def start_server(self, server_id: str) -> Server:
        return self._task(server_id, {"what": "power-on"})

    def stop_server(self, server_id: str) -> Server:
        return self._task(server_id, {"what": "power-off"})

    def renew_server(self, server_id: str, *, hours: float | None = None) -> Server:
        """The server's lease renewed: it ends `hours` from now, or without hours after the
        flavor's or the site's default lease. 400 beyond the longest lease allowed (the message
        names it), 409 when leases are off on the cluster."""
        body = {} if hours is None else {"hours": hours}
        return self._one("POST", f"/v1/server-instance/{_seg(server_id)}/lease", Server, json=body)

    def modify_server_users(self, server_id: str, how: str, users: Iterable[str]) -> Server:
        """how: add, delete or replace; users: controller user ids (system account uuids)."""
        return self._task(server_id, {"what": "modify-users", "how": how, "users": list(users)})

    def console(self, server_id: str, *, size: int | None = None) -> Console:
        """The last `size` bytes (default the service's, 64 KiB) of the guest's serial console
        since its last start, and whether its boot setup has finished (cloud-init's final stage)."""
        params = {"bytes": size} if size is not None else None
        return self._one("GET", f"/v1/server-instance/{_seg(server_id)}/console", Console, params=params)

    def server_actions(self, server_id: str, *, limit: int | None = None, before: str | None = None,
                       all_pages: bool = False) -> list[Action]:
        """What was done to a server, oldest first: by whom, under which request id, with what
        result; also for a deleted server, for the audit retention.
        The most recent `limit` entries (the service's default page: 1,000) older than the
        cursor `before` (None: of all), or with all_pages every kept entry from there on back,
        the cursor of each page followed (server_actions_page)."""
        page = self.server_actions_page(server_id, limit=limit, before=before)
        pages, seen = [page.actions], set()
        # A page that is empty or a cursor given twice ends it too: never a loop on an odd answer.
        while all_pages and page.next_cursor is not None and page.actions and page.next_cursor not in seen:
            seen.add(page.next_cursor)
            page = self.server_actions_page(server_id, limit=limit, before=page.next_cursor)
            pages.append(page.actions)
        return [a for p in reversed(pages) for a in p]

    def server_actions_page(self, server_id: str, *, limit: int | None = None,
                            before: str | None = None) -> ActionPage:
        """One page of a server's history: its `limit` most recent entries older than the cursor
        `before` (None: the most recent of all), oldest first, and the cursor of the next page
        of older ones, read from the answer's `Link: rel=next`. Only the cursor is taken from
        the link: the request goes to this client's URL, whatever host the link might name."""
        params = {k: v for k, v in (("limit", limit), ("before", before)) if v is not None}
        resp = self._answer("GET", f"/v1/server-instance/{_seg(server_id)}/actions", params=params or None)
        actions = [Action.from_api(d) for d in self._checked(resp)["data"]]
        return ActionPage(actions, _next_cursor(resp))

    # -- images and flavors ----------------------------------------------------------
    def list_images(self) -> list[Image]:
        return self._items("GET", "/v1/server-image", Image)

    def get_image(self, image_id: str) -> Image:
        return self._one("GET", f"/v1/server-image/{_seg(image_id)}", Image)

    def list_flavors(self) -> list[Flavor]:
        return self._items("GET", "/v1/server-flavor", Flavor)

    def get_flavor(self, flavor_id: str) -> Flavor:
        return self._one("GET", f"/v1/server-flavor/{_seg(flavor_id)}", Flavor)

    # -- volumes -----------------------------------------------------------------
    def list_volumes(self, *, owner: str | None = None) -> list[Volume]:
        return self._items("GET", "/v1/storage-volume", Volume, params={"cloudauth-id": owner} if owner else None)

    def get_volume(self, volume_id: str) -> Volume:
        return self._one("GET", f"/v1/storage-volume/{_seg(volume_id)}", Volume)

    def create_volume(self, *, size: int, name: str | None = None) -> Volume:
        body = {"volume-size": size, "volume-type": {"visibility": "cluster"}}
        if name is not None:
            body["volume-name"] = name
        return self._one("POST", "/v1/storage-volume", Volume, json=body)

    def delete_volume(self, volume_id: str) -> None:
        self.call("DELETE", f"/v1/storage-volume/{_seg(volume_id)}")

    # -- groups --------------------------------------------------------------------
    def list_groups(self, *, name: str | None = None, owner: str | None = None) -> list[Group]:
        params = {k: v for k, v in (("group-name", name), ("cloudauth-id", owner)) if v is not None}
        return self._items("GET", "/v1/group", Group, params=params or None)

    def get_group(self, group_id: str) -> Group:
        return self._one("GET", f"/v1/group/{_seg(group_id)}", Group)

    def create_group(self, name: str, members: Iterable[str] = ()) -> Group:
        body = {"group-name": name}
        members = list(members)
        if members:
            body["group-members"] = members
        return self._one("POST", "/v1/group", Group, json=body)

    def update_group(self, group_id: str, action: str, members: Iterable[str]) -> Group:
        """action: add, delete or replace; members: UNIX user names."""
        return self._one("PUT", f"/v1/group/{_seg(group_id)}", Group,
                         json={"action": action, "group-members": list(members)})

    def delete_group(self, group_id: str) -> None:
        self.call("DELETE", f"/v1/group/{_seg(group_id)}")

    # -- users (the cloud auth user interface) ---------------------------------------------
    def list_users(self) -> list[User]:
        return [User.from_api(u) for u in self.call("GET", "/v1/user/list")["data"]["users"]]

    def get_user(self, userid: str) -> User:
        return User.from_api(self.call("GET", f"/v1/user/view/{_seg(userid)}")["data"]["user"])

    def search_users(self, *, email: str | None = None, username: str | None = None) -> list[User]:
        params = {k: v for k, v in (("email", email), ("username", username)) if v is not None}
        return [User.from_api(u) for u in self.call("GET", "/v1/user/search", params=params)["data"]["users"]]

    def create_user(self, *, email: str, password: str, name: str | None = None) -> User:
        """A user owned by the caller (it needs the create_user permission)."""
        # The owner is named even though the service makes a non-superuser the owner by itself:
        # a superuser's new user would otherwise have no owner at all.
        self._ensure_token()
        body = {"email": email, "password": password, "owner_userid": self.userid,
                **({"name": name} if name is not None else {})}
        return self.get_user(self.call("POST", "/v1/user/create", json=body)["data"]["userid"])

    def update_user(self, userid: str, *, email: str | None = None, name: str | None = None,
                    active: bool | None = None) -> User:
        body = {k: v for k, v in (("email", email), ("name", name)) if v is not None}
        if active is not None:
            body["active"] = int(active)
        self.call("POST", f"/v1/user/update/{_seg(userid)}", json=body)
        return self.get_user(userid)

    def controller_base(self) -> str:
        """The base URL of the chosen cluster's controller (see __init__)."""
        if self._controller_url is None:
            self._controller_url = self._choose_cluster()
        return self._controller_url

    def default_cluster_url(self) -> str | None:
        """The URL of the catalog's default cluster (else the only one) when it is not this
        service's own; None for a single node or a service with no catalog."""
        try:
            self.cluster = None
            url = self._choose_cluster()
        except (ApiError, ClientError):
            return None
        return None if url == self.url else url

    def _choose_cluster(self) -> str:
        """--cluster's controller (by name or id), else the catalog's default, else the only
        one; this service itself when it lists no clusters or names no URL for the one chosen."""
        try:
            catalog = self.catalog()
        except ApiError as e:
            if e.status != 404 or self.cluster:
                raise
            return self.url
        clusters = catalog.get("controllers") or []
        if self.cluster:
            wanted = [c for c in clusters if str(c["id"]) == self.cluster or c["name"] == self.cluster]
            if not wanted:
                known = ", ".join(f"{c['name']} ({c['id']})" for c in clusters) or "none"
                raise ClientError(f"no cluster {self.cluster!r} at {self.url}; the clusters: {known}")
        else:
            wanted = [c for c in clusters if c["id"] == catalog.get("default")] or \
                (clusters if len(clusters) == 1 else [])
            if not wanted:
                if not clusters:
                    return self.url
                raise ClientError("several clusters: choose one with --cluster NAME or CC_CLUSTER "
                                  "(`cloud cluster list` shows them)")
        chosen = wanted[0]
        if not chosen["enabled"]:
            raise ClientError(f"cluster {chosen['name']} ({chosen['id']}) is disabled at {self.url}")
        return check_url(chosen["url"]) if chosen["url"] else self.url

    def catalog(self) -> dict:
        """The clusters this login reaches: {"controllers": [{"id", "name", "url", "enabled"}], "default"}."""
        return self.call("GET", "/v1/auth/catalog")["data"]

    def my_accounts(self) -> list[dict]:
        """Your system accounts on every cluster, as the user view lists them
        ({"id", "username", "uuid", "cloud_controller_id"})."""
        self._ensure_token()
        return self.call("GET", f"/v1/user/view/{_seg(self.userid)}")["data"]["user"].get("system_accounts", [])

    def me(self) -> User:
        self._ensure_token()
        return self.get_user(self.userid)

    # -- your own credentials (self-service) ---------------------------------------------
    @property
    def api_key(self) -> str | None:
        return self._key

    @property
    def api_secret(self) -> str | None:
        """The secret this client was given (to prove a rotation with it), or None."""
        return self._secret

    def credentials(self) -> dict:
        """{"userid", "api_key", "api_secret_set"}: never the secret."""
        return self.call("GET", "/v1/user/credentials")["data"]

    def rotate_api_secret(self, *, password: str | None = None, api_secret: str | None = None) -> dict:
        """A new API secret for yourself, proven by your password or current secret; returns
        {"api_key", "api_secret"} (the secret is shown this once). Your key-issued tokens end:
        when this client's token was one, it takes a new one with the new secret."""
        self.credentials()  # a live token first: a 401 of the rotation itself is then a wrong proof
        proof = {"password": password} if password is not None else {"api_secret": api_secret}
        data = self.call("POST", "/v1/user/rotate_api_secret", json=proof, renew=False)["data"]
        if self._key:
            self._secret = data["api_secret"]
        if self.source == "api_key":
            self._token_from({"api_key": data["api_key"], "api_secret": data["api_secret"]}, "api_key")
        return data

    def change_password(self, *, password: str, new_password: str) -> None:
        """Your password changed (old and new). Your password-issued tokens end: when this client's
        token was one, it takes a new one with the new password."""
        email = self._email or self.me().email  # also a live token first, as for a rotation
        self.call("POST", "/v1/user/change_password", json={"password": password, "new_password": new_password},
                  renew=False)
        if self._email:
            self._password = new_password
        if self.source == "password":
            self._token_from({"email": email, "password": new_password}, "password")

    # -- limits -----------------------------------------------------------------
    def limits(self, *, owner: str | None = None) -> Limits:
        return self._one("GET", "/v1/limits", Limits, params={"cloudauth-id": owner} if owner else None)
