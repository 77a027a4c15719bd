"""Typed results of the client library.

Each object keeps the API's own document in `raw` (the API's field names and
values), which is what `cloud --json` prints; the typed fields are for scripts.
"""

from dataclasses import dataclass, field


def _raw():
    return field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Token:
    token: str
    userid: str
    expires_at: str

    @classmethod
    def from_api(cls, d: dict) -> "Token":
        return cls(token=d["token"], userid=d["userid"], expires_at=d["expires_at"])


@dataclass(frozen=True)
class Server:
    id: str
    owner: str
    users: tuple[str, ...]
    image: str
    flavor: str
    created: str
    status: str
    hostname: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Server":
        return cls(id=d["id"], owner=d["cloudauth-id"], users=tuple(d.get("users", ())), image=d["server-image"],
                   flavor=d["server-flavor"], created=d["creation-date"], status=d["status"],
                   hostname=d.get("hostname"), private_ip=d.get("private-ip"), public_ip=d.get("public-ip"), raw=d)


@dataclass(frozen=True)
class Image:
    id: str
    name: str
    public: bool
    os: str
    min_disk: int
    min_ram: int
    active: bool
    created: str
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Image":
        o = d["operating-system"]
        return cls(id=d["id"], name=d["name"], public=d["public"],
                   os=f"{o['name']} {o['major_version']}.{o['minor_version']}", min_disk=d["min-disk"],
                   min_ram=d["min-ram"], active=d["active"], created=d["creation-date"], raw=d)


@dataclass(frozen=True)
class Flavor:
    id: str
    name: str
    memory: int
    disk: int
    vcpu: int
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Flavor":
        return cls(id=str(d["id"]), name=d["name"], memory=d["memory"], disk=d["disk"], vcpu=d["vcpu"], raw=d)


@dataclass(frozen=True)
class Volume:
    id: str
    owner: str
    size: int
    mount_point: str
    created: str
    name: str | None = None
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Volume":
        return cls(id=d["volume-id"], owner=d["cloudauth-id"], size=d["volume-size"],
                   mount_point=d["volume-type"].get("mount-point", ""), created=d["creation-date"],
                   name=d.get("volume-name"), raw=d)


@dataclass(frozen=True)
class Group:
    id: str
    owner: str
    name: str
    members: tuple[str, ...]
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Group":
        return cls(id=d["group-id"], owner=d["cloudauth-id"], name=d["group-name"],
                   members=tuple(d["group-members"]), raw=d)


@dataclass(frozen=True)
class User:
    id: str
    email: str
    name: str
    active: bool
    owner: str | None
    usernames: tuple[str, ...]
    account_ids: tuple[str, ...]
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "User":
        accounts = d.get("system_accounts") or []
        return cls(id=d["id"], email=d["email"], name=d.get("name") or "", active=bool(d.get("active")),
                   owner=d.get("owner_userid"), usernames=tuple(a["username"] for a in accounts),
                   account_ids=tuple(a["uuid"] for a in accounts), raw=d)


@dataclass(frozen=True)
class Limit:
    limit: int  # -1: no limit
    used: int

    @property
    def unlimited(self) -> bool:
        return self.limit == -1


@dataclass(frozen=True)
class Limits:
    userid: str
    instances: Limit
    vcpus: Limit
    memory_mb: Limit
    groups: Limit
    managed_users: Limit
    raw: dict = _raw()

    KINDS = ("instances", "vcpus", "memory_mb", "groups", "managed_users")

    @classmethod
    def from_api(cls, d: dict) -> "Limits":
        return cls(userid=d["cloudauth-id"], **{k: Limit(d[k]["limit"], d[k]["used"]) for k in cls.KINDS}, raw=d)


@dataclass(frozen=True)
class Console:
    text: str
    ready: bool
    raw: dict = _raw()

    @classmethod
    def from_api(cls, d: dict) -> "Console":
        return cls(text=d["console"], ready=bool(d["ready"]), raw=d)
