"""Naming things on the command line: a server by id, unique id prefix or hostname; a group,
image or flavor by id or name; a user by id, email or name; a system account by username.

An ambiguous name is an error that lists the candidates (by id), never a guess.
"""

import re
from collections.abc import Callable

from common.client import ApiError, Client, ClientError, Flavor, Group, Image, Server, User, image_names

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")

# Who may be given access to a server (the service's rule, said when a name is refused).
OWNERSHIP_RULE = ("you may name only yourself and the users you own (that hold no role you lack); "
                  "a superuser may name anyone")

# A prefix shorter than this is more likely a typo than a choice.
MIN_PREFIX = 4


def _pick(kind: str, given: str, found: list, describe: Callable[[object], str]):
    if len(found) == 1:
        return found[0]
    if not found:
        raise ClientError(f"no {kind} named {given!r} that you can see")
    listed = "; ".join(describe(x) for x in found)
    raise ClientError(f"{kind} name {given!r} is ambiguous, use an id: {listed}")


def is_uuid(given: str) -> bool:
    return bool(_UUID.fullmatch(given))


def server(client: Client, given: str) -> Server:
    servers = client.list_servers()
    exact = [s for s in servers if s.id == given.lower() or s.hostname == given]
    if not exact and len(given) >= MIN_PREFIX:
        exact = [s for s in servers if s.id.startswith(given.lower())]
    return _pick("server", given, exact, lambda s: f"{s.id} ({s.hostname or '-'})")


def _by_id_or_name(kind: str, items: list, given: str):
    exact = [x for x in items if x.id == given]
    return _pick(kind, given, exact or [x for x in items if x.name == given], lambda x: f"{x.id} ({x.name})")


def image(client: Client, given: str) -> Image:
    """By id or name, by the service's one rule (common.client.image_names): the one active
    image of a name wins over inactive namesakes."""
    found = {i.id: i for i in client.list_images()}
    try:
        return found[image_names.pick([i.raw for i in found.values()], given)["id"]]
    except image_names.ImageNameError as e:
        raise ClientError(e.message) from None


def flavor(client: Client, given: str) -> Flavor:
    return _by_id_or_name("flavor", client.list_flavors(), given)


def group(client: Client, given: str) -> Group:
    return _by_id_or_name("group", client.list_groups(), given)


def user(client: Client, given: str) -> User:
    """By id, email, system username or name (in that order), among the users the caller may
    view (itself included): every command that names a user takes the same four."""
    users = {u.id: u for u in client.list_users()}
    me = client.me()
    users.setdefault(me.id, me)
    found = [u for u in users.values() if u.id == given.lower()]
    found = found or [u for u in users.values() if u.email.lower() == given.lower()]
    found = found or [u for u in users.values() if given in u.usernames]
    found = found or [u for u in users.values() if u.name and u.name == given]
    return _pick("user", given, found, lambda u: f"{u.id} ({u.email})")


def account_ids(client: Client, given: tuple[str, ...]) -> list[str]:
    """Controller user ids (system account uuids) for usernames, emails or ids of the users
    the caller may name: a server's `users` are these, not cloud auth ids."""
    out = []
    for name in given:
        try:
            matches = [] if _UUID.match(name) or "@" in name else client.search_users(username=name)
        except ApiError as e:
            if e.status != 400:  # not a username at all: try it as an id, email or name
                raise
            matches = []
        if matches:
            ids = [a for u in matches for a, n in zip(u.account_ids, u.usernames) if n == name]
            out.append(_pick("user", name, ids, str))
            continue
        try:
            who = user(client, name)
        except ClientError as e:
            if _UUID.match(name):  # an account id itself; the service checks the caller may name it
                out.append(name.lower())
                continue
            if "ambiguous" in e.message:
                raise
            raise ClientError(f"{e.message}; {OWNERSHIP_RULE}") from None
        if not who.account_ids:
            raise ClientError(f"user {who.email} has no system account yet")
        out.append(who.account_ids[0])
    return out


def usernames_by_account(client: Client) -> dict[str, str]:
    """Account uuid -> username, for the users the caller sees (to show a server's users)."""
    users = {u.id: u for u in client.list_users()}
    me = client.me()
    users.setdefault(me.id, me)
    return {a: n for u in users.values() for a, n in zip(u.account_ids, u.usernames)}


class Labels:
    """Names for the ids an API document carries (owner, image, flavor, requester), fetched
    once per command and only for human output: a table shows what people know things by;
    an id the caller cannot see stays an id. For a superuser, also the host each server is
    on (GET /v1/server-host: the server objects carry no host, and nobody else is shown one)."""

    def __init__(self, client: Client):
        self._client = client
        self._maps: dict[str, dict[str, str]] = {}
        self._me: User | None = None

    def _myself(self) -> User:
        if self._me is None:
            self._me = self._client.me()
        return self._me

    def _map(self, kind: str) -> dict[str, str]:
        if kind not in self._maps:
            try:
                if kind == "user":
                    people = {u.id: u for u in self._client.list_users()}
                    me = self._myself()
                    people.setdefault(me.id, me)
                    found = {i: u.email for i, u in people.items()}
                elif kind == "image":
                    found = {i.id: i.name for i in self._client.list_images()}
                elif kind == "host":
                    found = self._client.server_hosts()
                else:
                    found = {f.id: f.name for f in self._client.list_flavors()}
            except ApiError:
                found = {}  # a list the caller may not read: ids it is
            self._maps[kind] = found
        return self._maps[kind]

    @property
    def superuser(self) -> bool:
        """Whether the caller is a superuser: its own user object carries `roles` only then."""
        try:
            return "superuser" in (self._myself().raw.get("roles") or ())
        except ApiError:
            return False

    def user(self, user_id: str | None) -> str | None:
        return None if user_id is None else self._map("user").get(user_id, user_id)

    def image(self, image_id: str) -> str:
        return self._map("image").get(image_id, image_id)

    def flavor(self, flavor_id: str) -> str:
        return self._map("flavor").get(str(flavor_id), flavor_id)

    def host(self, server_id: str) -> str | None:
        """The host a server is on; ask only for a superuser (anyone else is refused)."""
        return self._map("host").get(server_id)
