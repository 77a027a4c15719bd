"""Typed results of the client library.

Each object keeps the API's own document in `raw` (the API's field names and
values), which is what `cloud --json` prints; the typed fields are for scripts.
Each field names the API field it is read from (`_api`), so one `from_api`
serves every type.
"""

from dataclasses import dataclass, field, fields


def _api(key: str, convert=None):
    """A field read from the API document's `key` (through `convert` when given)."""
    return field(metadata={"api": key, "convert": convert})


def _optional(key: str, default=None):
    """A field the API may leave out (or send as null): `default` then (an older service's
    objects lack the fields added since)."""
    return field(default=default, metadata={"api": key, "convert": None, "optional": True, "default": default})


@dataclass(frozen=True, kw_only=True)
class _Model:
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict):
        values = {}
        for f in fields(cls):
            if f.name == "raw":
                continue
            key, convert = f.metadata["api"], f.metadata["convert"]
            value = d.get(key) if f.metadata.get("optional") else d[key]
            if value is None:
                value = f.metadata.get("default")
            values[f.name] = convert(value) if convert is not None and value is not None else value
        return cls(**values, raw=d)


def _os_text(o: dict) -> str:
    return f"{o['name']} {o['major_version']}.{o['minor_version']}"


@dataclass(frozen=True, kw_only=True)
class Token(_Model):
    token: str = _api("token")
    userid: str = _api("userid")
    expires_at: str = _api("expires_at")


@dataclass(frozen=True, kw_only=True)
class Server(_Model):
    id: str = _api("id")
    owner: str = _api("cloudauth-id")
    users: tuple[str, ...] = _api("users", tuple)
    image: str = _api("server-image")
    flavor: str = _api("server-flavor")
    created: str = _api("creation-date")
    status: str = _api("status")
    hostname: str | None = _optional("hostname")
    private_ip: str | None = _optional("private-ip")
    public_ip: str | None = _optional("public-ip")
    # The lease (docs/client.md): its end, RFC 3339 UTC, None for no lease; and its state:
    # "none", "active", "expiring" (within the first warning before the end) or "expired".
    expires_at: str | None = _optional("expires-at")
    lease: str = _optional("lease", "none")


@dataclass(frozen=True, kw_only=True)
class Image(_Model):
    id: str = _api("id")
    name: str = _api("name")
    public: bool = _api("public")
    os: str = _api("operating-system", _os_text)  # "debian 12.7"
    min_disk: int = _api("min-disk")
    min_ram: int = _api("min-ram")
    active: bool = _api("active")
    created: str = _api("creation-date")


@dataclass(frozen=True, kw_only=True)
class Flavor(_Model):
    id: str = _api("id", str)  # an integer in the spec's object description, a string in answers
    name: str = _api("name")
    memory: int = _api("memory")  # MB
    disk: int = _api("disk")  # GB
    vcpu: int = _api("vcpu")


@dataclass(frozen=True, kw_only=True)
class Volume(_Model):
    id: str = _api("volume-id")
    owner: str = _api("cloudauth-id")
    size: int = _api("volume-size")  # GB
    name: str | None = _optional("volume-name")
    mount_point: str = _api("volume-type", lambda t: t.get("mount-point", ""))
    created: str = _api("creation-date")


@dataclass(frozen=True, kw_only=True)
class Group(_Model):
    id: str = _api("group-id")
    owner: str = _api("cloudauth-id")
    name: str = _api("group-name")
    members: tuple[str, ...] = _api("group-members", tuple)


def _accounts(key: str):
    return lambda accounts: tuple(a[key] for a in accounts or ())


@dataclass(frozen=True, kw_only=True)
class User(_Model):
    id: str = _api("id")
    email: str = _api("email")
    name: str | None = _optional("name")
    active: bool = _api("active", bool)  # an integer in the API: above 0 is active
    owner: str | None = _optional("owner_userid")
    usernames: tuple[str, ...] = _api("system_accounts", _accounts("username"))
    account_ids: tuple[str, ...] = _api("system_accounts", _accounts("uuid"))  # the controller's user ids


@dataclass(frozen=True)
class Limit:
    limit: int  # -1: no limit
    used: int

    @property
    def unlimited(self) -> bool:
        return self.limit == -1


def _limit(d: dict) -> Limit:
    return Limit(d["limit"], d["used"])


@dataclass(frozen=True, kw_only=True)
class Limits(_Model):
    KINDS = ("instances", "vcpus", "memory_mb", "groups", "managed_users")

    userid: str = _api("cloudauth-id")
    instances: Limit = _api("instances", _limit)
    vcpus: Limit = _api("vcpus", _limit)
    memory_mb: Limit = _api("memory_mb", _limit)
    groups: Limit = _api("groups", _limit)
    managed_users: Limit = _api("managed_users", _limit)


@dataclass(frozen=True, kw_only=True)
class Console(_Model):
    text: str = _api("console")
    ready: bool = _api("ready", bool)


@dataclass(frozen=True, kw_only=True)
class Action(_Model):
    """One entry of a server's history (GET /v1/server-instance/<id>/actions)."""

    action: str = _api("action")
    requester: str | None = _api("requester")  # None: an administrator's command
    request_id: str = _api("request-id")
    result: str = _api("result")
    message: str = _api("message")
    time: str = _api("time")


@dataclass(frozen=True)
class ActionPage:
    """One page of a server's history: its entries oldest first, and the cursor of the page of
    older ones (the answer's `Link: rel=next`; None when none remain)."""

    actions: list[Action]
    next_cursor: str | None
