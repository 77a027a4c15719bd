"""Whether the virtiofsd that shares homes into guests on this host can confine a share
to its home's owner: the interface, `LocalShareConfinement` and `FakeShareConfinement`.

libvirt starts one virtiofsd per `<filesystem>` of a guest, as root, and finds the
binary through QEMU's vhost-user descriptors (JSON files of `"type": "fs"`). In its
passthrough mode virtiofsd performs each request with the guest caller's uid and gid,
so root in a guest acts as any uid in every home shared into it. A virtiofsd that can
map ids (Rust virtiofsd's `--translate-uid`/`--translate-gid`, or `--uid-map`/
`--gid-map` in its namespace sandbox) could make a share write only as the home's
owner; QEMU's own C virtiofsd has neither. `cloud-agent check` reports which holds
here; docs/guests.md says what holds either way.
"""

import json
import os
import re
from dataclasses import dataclass

from common.errors import HostError, HostUnavailable
from host_adapters import subp

# Where QEMU's vhost-user descriptors live, lowest priority first: a file in a later
# directory replaces the one of the same name in an earlier one, an empty file hides
# it, and libvirt takes the first of `"type": "fs"` in file-name order.
VHOST_USER_DIRS = ("/usr/share/qemu/vhost-user", "/etc/qemu/vhost-user")
ID_MAP_OPTIONS = ("--translate-uid", "--translate-gid", "--uid-map", "--gid-map")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_MAX_DESCRIPTOR_BYTES = 64 << 10


@dataclass(frozen=True)
class VirtiofsdFacts:
    binary: str
    version: str  # the first line of `--version`
    id_map_options: tuple[str, ...]  # those of ID_MAP_OPTIONS its --help lists

    @property
    def can_map_ids(self) -> bool:
        found = set(self.id_map_options)
        return {"--translate-uid", "--translate-gid"} <= found or {"--uid-map", "--gid-map"} <= found


NOT_CONFINED = ("shares are not confined to their home's owner: root in a guest acts as any uid in "
                "each home shared into it and can create set-id and device files there "
                "(mount the homes nosuid,nodev everywhere; see docs/guests.md)")


def describe(facts: VirtiofsdFacts) -> str:
    """The line `cloud-agent check` shows for facts."""
    who = f"{facts.binary} ({facts.version})"
    if not facts.can_map_ids:
        return (f"{NOT_CONFINED}; {who} cannot map uids and gids (none of {', '.join(ID_MAP_OPTIONS)} "
                "in its --help)")
    return (f"{NOT_CONFINED}; {who} can map uids and gids ({', '.join(facts.id_map_options)}), "
            "but the controller does not configure a mapping yet")


def find_virtiofsd(dirs: tuple[str, ...] = VHOST_USER_DIRS) -> str:
    """The virtiofsd binary libvirt would start, from the vhost-user descriptors in dirs.

    HostUnavailable when none describes one (libvirt could then share no home).
    """
    chosen: dict[str, str] = {}
    for d in dirs:
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise HostError(f"cannot list {d}: {e.strerror or e}") from e
        for name in names:
            if name.endswith(".json"):
                chosen[name] = os.path.join(d, name)
    for name in sorted(chosen):
        path = chosen[name]
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_DESCRIPTOR_BYTES + 1)
        except OSError as e:
            raise HostError(f"cannot read {path}: {e.strerror or e}") from e
        if not raw.strip():
            continue  # an empty file hides the descriptor of that name
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise HostError(f"{path} is not a vhost-user descriptor: {e}") from e
        if isinstance(doc, dict) and doc.get("type") == "fs" and isinstance(doc.get("binary"), str):
            return doc["binary"]
    raise HostUnavailable(f"no virtiofsd: no vhost-user descriptor of type fs in {' or '.join(dirs)} "
                          "(install virtiofsd; without it no home can be shared into a guest)")


def probe_virtiofsd(binary: str) -> VirtiofsdFacts:
    """What binary says of itself (`--version`, `--help`); each run bounded in time."""
    if not os.path.isabs(binary):
        raise HostError(f"the vhost-user descriptor names a relative virtiofsd path {binary!r}")
    version = subp.run([binary, "--version"], timeout=10).stdout.strip().splitlines()
    helped = subp.run([binary, "--help"], timeout=10)
    listed = set(_OPTION.findall(helped.stdout + helped.stderr))
    return VirtiofsdFacts(binary=binary, version=version[0] if version else "version unknown",
                          id_map_options=tuple(o for o in ID_MAP_OPTIONS if o in listed))


class ShareConfinement:
    """Whether a home's share can be confined to its owner on this host."""

    def describe(self) -> str:
        """One line saying whether shares are confined and why (for `cloud-agent check`).

        HostUnavailable when no virtiofsd is installed.
        """
        raise NotImplementedError


class LocalShareConfinement(ShareConfinement):
    """The virtiofsd of this host's vhost-user descriptors (libvirt on this host)."""

    def __init__(self, dirs: tuple[str, ...] = VHOST_USER_DIRS):
        self.dirs = dirs

    def describe(self) -> str:
        return describe(probe_virtiofsd(find_virtiofsd(self.dirs)))


class FakeShareConfinement(ShareConfinement):
    """Answers `facts` (tests); set `error` to make describe() raise it."""

    def __init__(self, facts: VirtiofsdFacts | None = None):
        self.facts = facts or VirtiofsdFacts(binary="/usr/libexec/virtiofsd", version="virtiofsd 0.0",
                                             id_map_options=())
        self.error: Exception | None = None

    def describe(self) -> str:
        if self.error is not None:
            raise self.error
        return describe(self.facts)
