"""The one INI configuration file, its defaults, and the typed object read from it.

Every key is documented in etc/controller.ini.sample and the README's config table. `load_config` reads and checks
every key once, at start; code reads `config.hosts.retry_seconds`, never a
section and key by name (docs/architecture.md).
"""

import configparser
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from common.words import HOST_NAME_RULE
from controller.errors import InvalidInput
from controller.limits import (SANDBOX_CAPACITY, SANDBOX_LIMITS, number_or_none, parse_limit, parse_ratio,
                               parse_reserved_mb)
from host_adapters.homes.program_path import program_problem

DEFAULT_CONFIG_PATH = "/etc/cloud-controller/controller.ini"
CONFIG_ENV = "CLOUD_CONTROLLER_CONFIG"

QUOTA_BACKENDS = ("none", "btrfs", "xfs", "setquota", "command")
DIRECTORY_BACKENDS = ("local", "ldap")
VIRT_TYPES = ("kvm", "qemu")
# Hypervisor host names: a DNS-like label, as operators name their nodes.
HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
GUEST_SUDO = ("none", "owner")

DEFAULTS: dict[str, dict[str, str]] = {
    "database": {"path": "/var/lib/cloud-controller/controller.db"},
    "server": {
        "host": "127.0.0.1",
        "port": "8080",
        # Requests served at once apart from host work and password logins (reads, /healthz).
        "threads": "4",
        # Host work (creates, deletes, power tasks, volume, group and account changes)
        # running at once, waiting for a turn at most, and how long one waits; serve runs
        # threads + host_workers + host_queue + 2 * [auth] max_password_checks threads
        # (api/admission.py).
        "host_workers": "4",
        "host_queue": "32",
        "host_queue_seconds": "300",
        # Of those places (running or waiting), one user holds at most this many; one more of
        # theirs is answered 429 with Retry-After (api/admission.py).
        "host_work_per_user": "16",
        "max_body_bytes": str(1024 * 1024),
        # Any of controller, user, portal (the cloud portal's pages need user in the same process).
        "interfaces": "controller,user",
        # Connections (issue 16): open at once; idle ones closed after channel_timeout_seconds;
        # one whose request has been arriving for request_timeout_seconds closed too.
        "connection_limit": "1000",
        "channel_timeout_seconds": "15",
        "request_timeout_seconds": "30",
        "cleanup_interval_seconds": "2",
        "backlog": "1024",
        "max_header_bytes": str(32 * 1024),
        # Addresses or networks of reverse proxies whose X-Forwarded-For names the client.
        "trusted_proxies": "",
    },
    "auth": {
        "secret_key_file": "/etc/cloud-controller/secret.key",
        "token_ttl_seconds": "3600",
        "max_failures": "5",
        "failure_window_seconds": "300",
        "lockout_seconds": "60",
        # argon2id cost; lower only for tests.
        "argon2_time_cost": "3",
        "argon2_memory_kib": "65536",
        # Lanes of one hash, each computed on a thread of its own: RFC 9106's second
        # recommended profile (argon2-cffi's default), t=3, 64 MiB, p=4.
        "argon2_parallelism": "4",
        # Password logins hashing at once; one more is answered 429 at once.
        "max_password_checks": "4",
        # Password logins one client address may have in progress at once (0: no cap). Two, so
        # that two users of a head node (all at 127.0.0.1) log in at the same moment, while one
        # client still holds at most half of the slots.
        "max_password_checks_per_source": "2",
    },
    "libvirt": {
        "uri": "qemu:///system",
        "storage_pool": "cloud-controller",
        "domain_prefix": "cc-",
        # kvm, or qemu (software emulation) where KVM cannot boot a guest.
        "virt_type": "kvm",
        # host-passthrough, host-model, or a named CPU model (e.g. qemu64). Empty: follows
        # virt_type (host-passthrough with kvm, QEMU's default CPU with qemu).
        "cpu_mode": "",
        # The name under which uri is a hypervisor host (`cloud-agent host list`).
        "host_name": "default",
        # Lists answer statuses from a snapshot of every domain's state at most this old.
        "status_max_age_seconds": "2",
    },
    "network": {
        # The libvirt network of every instance's private NIC; `cloud-agent init`
        # creates it (NAT on subnet) when missing.
        "name": "cc-private",
        "subnet": "10.213.0.0/16",
        # A second NIC on this host bridge with a static address from public_pool.
        "public_bridge": "",
        "public_pool": "",
        "public_prefix": "",
        "public_gateway": "",
        "public_dns": "",
        # true: a guest sends nothing to other guests of the private network, only to
        # its gateway and beyond (every NIC sends only from its own MAC and address either way).
        "isolate_guests": "false",
    },
    "guest": {
        # none, or owner: the instance's owner gets root (sudo) in the guest.
        "sudo": "none",
        # reboot and power-off ask the guest to shut down (ACPI power button) and wait this
        # long before powering it off hard; 0: at once (a pulled plug). A Debian or RHEL
        # guest shuts down in 2 to 20 s; systemd gives a stuck service 90 s.
        "shutdown_timeout_seconds": "60",
    },
    "volumes": {
        "home_root": "/home",
        "quota_backend": "none",
        "max_size_gb": "1024",
        "quota_mountpoint": "",
        # quota_backend = command: the site program that sets, reads and removes a home's
        # quota (host_adapters/homes/command_quota.py), and how long one run of it may take.
        "quota_command": "",
        "quota_command_timeout_seconds": "60",
    },
    "unix": {"root": ""},
    "directory": {
        # LDAP keys (people_ou, groups_ou, uid_min, uid_max, tls_ca_file, starttls,
        # timeout) and their defaults are documented in host_adapters/accounts/ldap_directory.py.
        "backend": "local",
        "uri": "",
        "base_dn": "",
        "bind_dn": "",
        "bind_password_file": "",
        "default_shell": "/bin/bash",
    },
    # name: how users and the portal call this cluster (empty: cluster-ID); url: this
    # controller's API as clients reach it (the catalog lists it; empty: the URL they used).
    "controller": {"id": "1", "profile": "production", "name": "", "url": ""},
    # Groups made through the API (issue 8, finding 1); see etc/controller.ini.sample.
    "groups": {
        "name_prefix": "",
        "name_pattern": "",
        # name_pattern in words, for the refusal users read (never the pattern itself).
        "name_rule": "",
        "refused_names": "",
        # Apart from the accounts' uids and private gids (local and LDAP: 10000-60000),
        # from Debian's reserved 60000-64999 and from systemd's dynamic users (61184-65519).
        "gid_min": "70000",
        "gid_max": "79999",
        # local (groupadd) or ldap (posixGroup entries); empty follows [directory] backend.
        "backend": "",
        # With backend = ldap: the DN the groups go under; empty is [directory] groups_ou
        # (default ou=groups) under [directory] base_dn.
        "ldap_base": "",
    },
    # What one user may hold at once (-1: no limit); `cloud-agent user limits` overrides
    # them per user. See controller/limits.py and docs/decisions.md.
    "limits": {
        "instances": "10",
        "vcpus": "20",
        "memory_mb": "51200",
        "groups": "20",
        "managed_users": "50",
    },
    # Host admission with Nova's meanings: vCPUs up to CPUs * cpu_allocation_ratio,
    # memory up to (memory - reserved_host_memory_mb) * ram_allocation_ratio.
    "capacity": {
        "cpu_allocation_ratio": "4.0",
        "ram_allocation_ratio": "1.0",
        "reserved_host_memory_mb": "4096",
    },
}

# Many hypervisor hosts (issue 10); see docs/scaling.md.
DEFAULTS["hosts"] = {
    # A host that did not answer is not tried again for this long (its calls fail at once).
    "retry_seconds": "30",
    # How long opening a connection to a remote host may take.
    "connect_timeout_seconds": "10",
    # A host's CPUs and memory (libvirt getInfo) are read again at a create when older.
    "capacity_max_age_seconds": "600",
    # A create placed on a host that does not answer is placed again on the next host
    # with room (Nova's reschedule), at most this many placements in all.
    "max_create_attempts": "3",
    # A create waits this long for another create's copy of the same image to the same
    # host (one upload per host and image), then answers 503.
    "image_copy_wait_seconds": "300",
    # `host drain` asks each running guest to shut down (ACPI) and waits this long before
    # powering it off hard.
    "shutdown_wait_seconds": "120",
}

# GET /healthz answers from the last result of the checks, refreshed by one thread
# (issue 16, finding 2); see controller/monitoring/health.py.
DEFAULTS["health"] = {
    # Seconds between two rounds of checks.
    "refresh_seconds": "2",
    # A check still running after this long is reported failed ("timed out").
    "check_timeout_seconds": "5",
}

# Audit growth and retention (issue 8, finding 4).
DEFAULTS["audit"] = {
    # Rows older than this many days are pruned by `cloud-agent serve` once an hour; 0 keeps them
    # (then only the per-instance bound of the history holds, and the audit grows without one).
    "retention_days": "365",
    # Anonymous failed requests are counted and written as one row per this many seconds.
    "anonymous_interval_seconds": "300",
}

# The Prometheus endpoint `cloud-agent serve` runs beside the API (issue 19); see
# controller/monitoring/metrics.py and docs/scaling.md, "Metrics".
DEFAULTS["metrics"] = {
    # false: no endpoint (the sandbox profile writes false: its servers would share the port).
    "enabled": "true",
    # Its own address, never the API's; anyone who reaches it reads every metric (no auth).
    "listen_host": "127.0.0.1",
    "listen_port": "9180",
    # Seconds between two reads of every host's statuses (which also tell whether it
    # answers), off the scrape path; 0: none (reachability then shows what other work found).
    "refresh_seconds": "15",
    # Users shown by id with their usage against their limits, per kind (0: aggregates only).
    "top_users": "0",
}

# A controller of one cluster whose users, passwords and tokens live at a cloud auth serving
# several (docs/clusters.md). url empty: this process's own database is the cloud auth.
DEFAULTS["cloud_auth"] = {
    "url": "",
    # The secret `cloud-agent controller add` printed at cloud auth, alone in a file of mode 0600.
    "secret_file": "",
    # A CA bundle to verify cloud auth's certificate with (empty: the system's); at cloud auth,
    # the controllers' certificates its portal reaches.
    "ca_file": "",
    "poll_seconds": "1",
    # A call to cloud auth; at cloud auth, a portal page's calls to one cluster's controller.
    "timeout_seconds": "2",
    # Tokens already seen keep working this long after the last good poll (0: not at all).
    "offline_grace_seconds": "300",
}

# The cloud portal's sessions (pages under /portal/, served when [server] interfaces has portal).
DEFAULTS["portal"] = {
    # A session ends after this long without a request, and this long after its login whatever.
    "session_idle_seconds": "1800",
    "session_max_seconds": "28800",
    # The portal's origin as browsers see it (https://cloud.example.org), checked against a
    # form's Origin header; empty: the request's own (scheme and Host). Set it behind a proxy.
    "public_url": "",
}

# Instance leases (docs/leases.md): an instance ends unless its owner renews it. Off while
# default and max are empty (or 0) here and on every flavor: expires-at stays null.
DEFAULTS["leases"] = {
    # The lease a new instance gets (a duration: a number with s, m, h or d); empty or 0: none.
    "default": "",
    # The longest a renewal may ask for, from now; empty or 0: no bound.
    "max": "",
    # Before expiry, a warning at each of these (history, and notify_command).
    "warn": "24h, 1h",
    # How long an expired instance stays, powered off, before it is deleted.
    "keep": "7d",
    # Seconds between two sweeps of the leases in `cloud-agent serve`.
    "check_seconds": "30",
    # A site program run with one JSON object on stdin per warning, expiry and delete (its
    # arguments separated by spaces); empty: none.
    "notify_command": "",
    # How long one run of notify_command may take before it is killed (and retried).
    "notify_timeout_seconds": "30",
}


# -- the typed sections -------------------------------------------------------------------
# One frozen dataclass per section, one field per key of DEFAULTS (same names). A field's
# type says how its text is read; its metadata adds the check ("min", "choices", or a
# "parse" function given the text and "config [section] key" for its message).


def _at_least(low: int, why: str | None = None):
    return field(metadata={"min": low, "why": why})


def _one_of(choices: tuple[str, ...]):
    return field(metadata={"choices": choices})


def _parsed(parse):
    return field(metadata={"parse": parse})


def _host_name(text: str, where: str) -> str:
    if not HOST_NAME.fullmatch(text):
        raise InvalidInput(f"{where} is not a host name: {HOST_NAME_RULE}")
    return text


def _seconds(text: str, where: str) -> float:
    value = number_or_none(float, text)
    if value is None or not value >= 0:  # NaN is not >= 0
        raise InvalidInput(f"{where} must be a number of seconds, 0 or more")
    return value


def _positive_seconds(text: str, where: str) -> float:
    value = _seconds(text, where)
    if value <= 0:
        raise InvalidInput(f"{where} must be a number of seconds above 0")
    return value


def _networks(text: str, where: str) -> tuple:
    """Comma-separated addresses or networks; a bare address is a /32 or /128."""
    try:
        return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in text.split(",") if p.strip())
    except ValueError as e:
        raise InvalidInput(f"{where}: {e}") from None


def _names(text: str, where: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


INTERFACES = ("controller", "user", "portal")


def _optional_host_name(text: str, where: str) -> str:
    return _host_name(text, where) if text else ""


def _optional_url(text: str, where: str) -> str:
    if not text:
        return ""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or parts.username or any(c.isspace() for c in text):
        raise InvalidInput(f"{where} must be http(s)://HOST[:PORT][/PATH] or empty")
    return text.rstrip("/")


def _interfaces(text: str, where: str) -> tuple[str, ...]:
    names = _names(text, where)
    if not names or set(names) - set(INTERFACES):
        raise InvalidInput(f"{where} must name some of {', '.join(INTERFACES)}")
    if "portal" in names and "user" not in names:
        raise InvalidInput(f"{where}: portal needs user in the same process (its sessions are the user "
                           "interface's logins)")
    return names


def _origin(text: str, where: str) -> str:
    """Empty, or an http(s) origin (scheme, host, optional port; no path), kept without a slash."""
    if not text:
        return text
    found = re.fullmatch(r"(https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?", text)
    if not found:
        raise InvalidInput(f"{where} must be an origin such as https://cloud.example.org (no path), got {text!r}")
    return f"{found[1]}://{found[2].lower()}{found[3] or ''}"


def _name_prefix(text: str, where: str) -> str:
    if text and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,30}", text):
        raise InvalidInput(f"{where} must be the start of a POSIX name "
                           "(lower-case letters, digits, _ and -, not first) and leave room for a name")
    return text


# One run of the quota program may take at most this long (every wait is bounded).
QUOTA_COMMAND_TIMEOUT_MAX = 600


def _program(text: str, where: str) -> str:
    """A program root runs: an absolute path to an executable regular file that only root (or
    the user this runs as) can change, in directories only they can change
    (host_adapters/homes/program_path.py). Empty: none."""
    if not text:
        return text
    problem = program_problem(text)
    if problem is not None:
        raise InvalidInput(f"{where}: {problem}" if text.startswith("/") else f"{where} {problem}")
    return text


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd])")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A lease longer than this is no lease (and keeps every date within RFC 3339's years).
MAX_DURATION_SECONDS = 3650 * 86400


def parse_duration(text: str, where: str) -> int | None:
    """Seconds of a duration written as a number with s, m, h or d ("36h", "7d", "90m");
    None for empty or 0 (no lease, no bound)."""
    text = text.strip()
    if text in ("", "0"):
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        raise InvalidInput(f"{where} must be a duration: a number with s, m, h or d (36h, 7d), or 0 for none")
    seconds = round(float(match.group(1)) * _DURATION_UNITS[match.group(2)])
    if seconds == 0:
        return None
    if seconds > MAX_DURATION_SECONDS:
        raise InvalidInput(f"{where} must be at most {MAX_DURATION_SECONDS // 86400} days")
    return seconds


def _duration(text: str, where: str) -> int | None:
    return parse_duration(text, where)


def _kept_duration(text: str, where: str) -> int:
    seconds = parse_duration(text, where)
    return 0 if seconds is None else seconds


def _durations(text: str, where: str) -> tuple[int, ...]:
    """Comma-separated durations, longest first (each at most once)."""
    found = {parse_duration(p, where) for p in text.split(",") if p.strip()}
    return tuple(sorted((s for s in found if s), reverse=True))


def _argv(text: str, where: str) -> tuple[str, ...]:
    """A site program and its arguments, separated by spaces (no shell); its program is checked
    as _program checks one. Empty: none."""
    argv = tuple(text.split())
    if argv:
        _program(argv[0], where)
    return argv


def _pattern(text: str, where: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise InvalidInput(f"{where} is not a regular expression: {e}") from None
    return text


def _port(text: str, where: str) -> int:
    port = number_or_none(int, text)
    if port is None or not 1 <= port <= 65535:
        raise InvalidInput(f"{where} must be a TCP port, 1-65535")
    return port


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


@dataclass(frozen=True)
class DatabaseConfig:
    path: str


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    threads: int = _at_least(1)
    host_workers: int = _at_least(1)
    host_queue: int = _at_least(0)
    host_queue_seconds: int = _at_least(1)
    host_work_per_user: int = _at_least(1)
    max_body_bytes: int
    interfaces: tuple[str, ...] = _parsed(_interfaces)
    connection_limit: int = _at_least(1)
    channel_timeout_seconds: int = _at_least(1)
    request_timeout_seconds: int = _at_least(1)
    cleanup_interval_seconds: int = _at_least(1)
    backlog: int = _at_least(1)
    max_header_bytes: int = _at_least(1)
    trusted_proxies: tuple = _parsed(_networks)  # ip_network objects


@dataclass(frozen=True)
class AuthConfig:
    secret_key_file: str
    token_ttl_seconds: int
    max_failures: int
    failure_window_seconds: int
    lockout_seconds: int
    argon2_time_cost: int
    argon2_memory_kib: int
    argon2_parallelism: int = _at_least(1)
    max_password_checks: int = _at_least(1)
    max_password_checks_per_source: int = _at_least(0, "0 (no cap) or more")


@dataclass(frozen=True)
class LibvirtConfig:
    uri: str
    storage_pool: str
    domain_prefix: str
    virt_type: str = _one_of(VIRT_TYPES)
    cpu_mode: str
    host_name: str = _parsed(_host_name)
    status_max_age_seconds: float = _parsed(_seconds)


@dataclass(frozen=True)
class NetworkConfig:
    """As written; controller.addresses.network_plan checks them together and gives addresses."""

    name: str
    subnet: str
    public_bridge: str
    public_pool: str
    public_prefix: str
    public_gateway: str
    public_dns: str
    isolate_guests: bool


@dataclass(frozen=True)
class GuestConfig:
    sudo: str = _one_of(GUEST_SUDO)
    shutdown_timeout_seconds: int = _at_least(0, "0 (a hard power-off at once) or more")


@dataclass(frozen=True)
class VolumesConfig:
    home_root: str
    quota_backend: str = _one_of(QUOTA_BACKENDS)
    max_size_gb: int
    quota_mountpoint: str
    quota_command: str = _parsed(_program)
    quota_command_timeout_seconds: int = _at_least(1)

    def __post_init__(self):
        where = "config [volumes]"
        if not self.quota_command_timeout_seconds <= QUOTA_COMMAND_TIMEOUT_MAX:
            raise InvalidInput(f"{where} quota_command_timeout_seconds must be from 1 to {QUOTA_COMMAND_TIMEOUT_MAX}")
        if self.quota_backend == "command" and not self.quota_command:
            raise InvalidInput(f"{where} quota_backend = command needs quota_command (the program's path)")
        if self.quota_command and self.quota_backend != "command":
            raise InvalidInput(f"{where} quota_command is run only with quota_backend = command, "
                               f"not {self.quota_backend}")


@dataclass(frozen=True)
class UnixConfig:
    root: str


@dataclass(frozen=True)
class DirectoryConfig:
    """The keys every backend reads; the LDAP adapter reads its own from Config.raw_section."""

    backend: str = _one_of(DIRECTORY_BACKENDS)
    uri: str
    base_dn: str
    bind_dn: str
    bind_password_file: str
    default_shell: str


@dataclass(frozen=True)
class ControllerConfig:
    id: int
    profile: str
    name: str = _parsed(_optional_host_name)
    url: str = _parsed(_optional_url)


@dataclass(frozen=True)
class GroupsConfig:
    name_prefix: str = _parsed(_name_prefix)
    name_pattern: str = _parsed(_pattern)
    name_rule: str
    refused_names: tuple[str, ...] = _parsed(_names)
    gid_min: int
    gid_max: int
    backend: str = _one_of(("",) + DIRECTORY_BACKENDS)  # "" until parse_config resolves it
    ldap_base: str

    def __post_init__(self):
        if not 1 <= self.gid_min <= self.gid_max <= 4294967294:
            raise InvalidInput("config [groups] gid_min and gid_max must give a range within 1-4294967294")


@dataclass(frozen=True)
class LimitsConfig:
    instances: int = _parsed(parse_limit)
    vcpus: int = _parsed(parse_limit)
    memory_mb: int = _parsed(parse_limit)
    groups: int = _parsed(parse_limit)
    managed_users: int = _parsed(parse_limit)


@dataclass(frozen=True)
class CapacityConfig:
    cpu_allocation_ratio: float = _parsed(parse_ratio)
    ram_allocation_ratio: float = _parsed(parse_ratio)
    reserved_host_memory_mb: int = _parsed(parse_reserved_mb)


@dataclass(frozen=True)
class HostsConfig:
    retry_seconds: int = _at_least(1)
    connect_timeout_seconds: int = _at_least(1)
    capacity_max_age_seconds: int = _at_least(1)
    max_create_attempts: int = _at_least(1)
    image_copy_wait_seconds: int = _at_least(1)
    shutdown_wait_seconds: int = _at_least(1)


@dataclass(frozen=True)
class HealthConfig:
    refresh_seconds: int = _at_least(1)
    check_timeout_seconds: int = _at_least(1)


@dataclass(frozen=True)
class AuditConfig:
    retention_days: int = _at_least(0)
    anonymous_interval_seconds: int = _at_least(0)


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool
    listen_host: str
    listen_port: int = _parsed(_port)
    refresh_seconds: int = _at_least(0)
    top_users: int = _at_least(0)


@dataclass(frozen=True)
class CloudAuthConfig:
    url: str = _parsed(_optional_url)
    secret_file: str
    ca_file: str
    poll_seconds: float = _parsed(_positive_seconds)
    timeout_seconds: float = _parsed(_positive_seconds)
    offline_grace_seconds: float = _parsed(_seconds)


@dataclass(frozen=True)
class PortalConfig:
    session_idle_seconds: int = _at_least(60)
    session_max_seconds: int = _at_least(60)
    public_url: str = _parsed(_origin)


@dataclass(frozen=True)
class LeasesConfig:
    default: int | None = _parsed(_duration)
    max: int | None = _parsed(_duration)
    warn: tuple = _parsed(_durations)
    keep: int = _parsed(_kept_duration)
    check_seconds: int = _at_least(1)
    notify_command: tuple = _parsed(_argv)
    notify_timeout_seconds: int = _at_least(1)

    def __post_init__(self):
        if self.default is not None and self.max is not None and self.default > self.max:
            raise InvalidInput("config [leases] default must not be longer than [leases] max")
        if self.notify_timeout_seconds > QUOTA_COMMAND_TIMEOUT_MAX:
            raise InvalidInput(f"config [leases] notify_timeout_seconds must be from 1 to {QUOTA_COMMAND_TIMEOUT_MAX}")


# Section name -> its dataclass; the order is the order sections are checked in.
SECTIONS: dict[str, type] = {
    "volumes": VolumesConfig, "directory": DirectoryConfig, "libvirt": LibvirtConfig, "guest": GuestConfig,
    "network": NetworkConfig, "limits": LimitsConfig, "capacity": CapacityConfig,
    "controller": ControllerConfig, "database": DatabaseConfig, "server": ServerConfig, "auth": AuthConfig,
    "unix": UnixConfig, "audit": AuditConfig, "hosts": HostsConfig, "health": HealthConfig,
    "groups": GroupsConfig, "metrics": MetricsConfig, "portal": PortalConfig, "cloud_auth": CloudAuthConfig,
    "leases": LeasesConfig,
}


def _value(section: str, f, text: str):
    where = f"config [{section}] {f.name}"
    if "parse" in f.metadata:
        return f.metadata["parse"](text, where)
    if f.type is bool:
        if text.lower() not in _TRUE + _FALSE:
            raise InvalidInput(f"{where}: {text!r} is not true or false")
        return text.lower() in _TRUE
    if f.type is int:
        try:
            value = int(text)
        except ValueError:
            raise InvalidInput(f"{where} must be an integer, got {text!r}") from None
        low = f.metadata.get("min")
        if low is not None and value < low:
            raise InvalidInput(f"{where} must be {f.metadata['why'] or f'{low} or more'}")
        return value
    if text not in f.metadata.get("choices", (text,)):
        raise InvalidInput(f"{where} must be one of {', '.join(f.metadata['choices'])}")
    return text


def _section(name: str, texts: dict[str, str]):
    cls = SECTIONS[name]
    return cls(**{f.name: _value(name, f, texts[f.name].strip()) for f in fields(cls)})


@dataclass(frozen=True)
class Config:
    """The configuration, parsed and checked once: `config.hosts.retry_seconds` is an int.

    `path` is the file it came from (None for one built in memory); `raw_section` gives a
    section's keys as written, for readers that own keys of their own (the LDAP directory).
    """

    database: DatabaseConfig
    server: ServerConfig
    auth: AuthConfig
    libvirt: LibvirtConfig
    network: NetworkConfig
    guest: GuestConfig
    volumes: VolumesConfig
    unix: UnixConfig
    directory: DirectoryConfig
    controller: ControllerConfig
    groups: GroupsConfig
    limits: LimitsConfig
    capacity: CapacityConfig
    hosts: HostsConfig
    health: HealthConfig
    audit: AuditConfig
    metrics: MetricsConfig
    portal: PortalConfig
    cloud_auth: CloudAuthConfig
    leases: LeasesConfig
    path: str | None = None
    written: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False, compare=False)

    # Shortcuts for the keys the code reads most.
    @property
    def database_path(self) -> str:
        return self.database.path

    @property
    def controller_id(self) -> int:
        return self.controller.id

    @property
    def is_sandbox(self) -> bool:
        return self.controller.profile == "sandbox"

    def raw_section(self, section: str) -> dict[str, str]:
        """A section's keys and text exactly as written (none of the defaults)."""
        return dict(self.written.get(section, {}))

    def with_values(self, values: dict[str, dict[str, object]]) -> "Config":
        """A new Config, checked again, with these keys set over the ones written (tests)."""
        merged = {s: dict(keys) for s, keys in self.written.items()}
        for section, keys in values.items():
            merged.setdefault(section, {}).update({k: str(v) for k, v in keys.items()})
        return parse_config(merged, path=self.path)


def _defaults(section: str, profile: str) -> dict[str, str]:
    # A sandbox, even one written before [limits] and [capacity] existed, gets the sandbox's.
    sandbox = {"limits": SANDBOX_LIMITS, "capacity": SANDBOX_CAPACITY}
    if profile == "sandbox" and section in sandbox:
        return {k: str(v) for k, v in sandbox[section].items()}
    return DEFAULTS[section]


def parse_config(written: dict[str, dict[str, str]], path: str | None = None) -> Config:
    """Every section read and checked from the text written (defaults for keys not written);
    InvalidInput names the first bad section and key."""
    profile = written.get("controller", {}).get("profile", DEFAULTS["controller"]["profile"]).strip()
    sections = {name: _section(name, {**_defaults(name, profile), **written.get(name, {})}) for name in SECTIONS}
    sections["groups"] = _groups_backend(sections["groups"], sections["directory"])
    config = Config(**sections, path=path,
                    written=MappingProxyType({s: MappingProxyType(dict(k)) for s, k in written.items()}))
    _check_guest_root_quota(config)
    _check_shutdown_timeout(config)
    _check_cloud_auth(config)
    from controller.addresses import network_plan

    network_plan(config)  # raises InvalidInput naming the bad [network] key
    return config


def _groups_backend(groups: GroupsConfig, directory: DirectoryConfig) -> GroupsConfig:
    """[groups] backend follows [directory] backend unless written; ldap groups live on the
    directory's server (its uri, bind and base), so they need the ldap directory."""
    backend = groups.backend or directory.backend
    if backend == "ldap" and directory.backend != "ldap":
        raise InvalidInput("config [groups] backend = ldap needs [directory] backend = ldap "
                           "(the groups are written to the directory's server)")
    return replace(groups, backend=backend)


def _check_cloud_auth(config: Config) -> None:
    """A controller following a cloud auth serves the controller interface only: its users and
    the portal live at cloud auth. Its secret file is checked where it is read (`serve`, `check`)."""
    if not config.cloud_auth.url:
        return
    if config.server.interfaces != ("controller",):
        raise InvalidInput("config [server] interfaces must be controller alone when [cloud_auth] url is set: "
                           "users and the portal are served by cloud auth")
    if not config.cloud_auth.secret_file:
        raise InvalidInput("config [cloud_auth] secret_file is required when [cloud_auth] url is set "
                           "(the secret `cloud-agent controller add` printed at cloud auth)")


def _check_guest_root_quota(config: Config) -> None:
    from host_adapters.homes.quota_backends import guest_root_escapes

    # Guest root writes through a home's share as uid 0 on the head node: a per-uid
    # limit never sees those files, so the owner's sudo would make the quota moot.
    # A site's quota_command may limit the uid too, and the controller cannot tell.
    backend = config.volumes.quota_backend
    if config.guest.sudo == "owner" and guest_root_escapes(backend):
        limits = ("may limit the user's uid (the controller cannot tell)" if backend == "command"
                  else "limits the user's uid")
        raise InvalidInput(
            f"config [guest] sudo = owner cannot be used with [volumes] quota_backend = {backend}: "
            f"{backend} {limits}, and root in a guest writes into the homes shared with it "
            "as root, past every user's quota; use quota_backend btrfs or xfs (they limit the home "
            "whoever writes) or [guest] sudo = none")


# A power task's request waits for the guest's shutdown: the `cloud` command and the client
# library wait for a task's answer this long and more (common/client/session.py TASK_TIMEOUT).
MAX_SHUTDOWN_TIMEOUT_SECONDS = 600


def _check_shutdown_timeout(config: Config) -> None:
    if config.guest.shutdown_timeout_seconds > MAX_SHUTDOWN_TIMEOUT_SECONDS:
        raise InvalidInput(f"config [guest] shutdown_timeout_seconds must be at most {MAX_SHUTDOWN_TIMEOUT_SECONDS}: "
                           "a reboot or power-off request waits for the guest's shutdown")


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | None = None) -> Config:
    """Read the INI file at path (or the default location); a missing file is an error."""
    path = path or default_config_path()
    parser = configparser.ConfigParser(interpolation=None)
    if not Path(path).is_file():
        raise InvalidInput(f"config file not found: {path}")
    parser.read(path)
    return parse_config({s: dict(parser[s]) for s in parser.sections()}, path=str(path))


def config_from_dict(values: dict[str, dict[str, object]], path: str | None = None) -> Config:
    """Build a Config in memory (tests, and `init --sandbox` before it writes the file)."""
    return parse_config({s: {k: str(v) for k, v in keys.items()} for s, keys in values.items()}, path=path)


def write_config(values: dict[str, dict[str, object]], path: str) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    for section, keys in values.items():
        parser[section] = {k: str(v) for k, v in keys.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w") as f:
        parser.write(f)
    os.chmod(tmp, 0o640)
    os.replace(tmp, path)


def sandbox_values(state_dir: str) -> dict[str, dict[str, object]]:
    """A complete config whose state all lives under state_dir (`cloud-agent init --sandbox DIR`)."""
    d = Path(state_dir).resolve()
    return {
        "controller": {"id": 1, "profile": "sandbox"},
        "database": {"path": d / "controller.db"},
        # The sandbox serves the cloud portal beside both interfaces.
        "server": {"host": "127.0.0.1", "port": 8080, "threads": 4, "max_body_bytes": 1048576,
                   "interfaces": "controller,user,portal"},
        "auth": {
            "secret_key_file": d / "secret.key",
            "token_ttl_seconds": 3600,
            "max_failures": 5,
            "failure_window_seconds": 300,
            "lockout_seconds": 60,
        },
        "libvirt": {"uri": "test:///default", "storage_pool": "default-pool", "domain_prefix": "cc-",
                    # cpu_mode empty as in the sample: a host-passthrough next to a virt_type
                    # = qemu host (the config pointed elsewhere) is refused.
                    "virt_type": "kvm", "cpu_mode": ""},
        # The test driver's own network: it exists in every process, as the sandbox's
        # agent commands and server are separate processes with separate test drivers.
        "network": {"name": "default", "subnet": "10.213.0.0/16"},
        "guest": {"sudo": "none"},
        "volumes": {"home_root": d / "home", "quota_backend": "none", "max_size_gb": 100},
        "unix": {"root": d / "sysroot"},
        "directory": {"backend": "local", "default_shell": "/bin/bash"},
        # Generous, and ratios fit to the test driver's small host (controller/limits.py).
        "limits": dict(SANDBOX_LIMITS),
        "capacity": dict(SANDBOX_CAPACITY),
        # Off: every sandbox would listen on the one port; `serve --metrics-port P` turns it on.
        "metrics": {"enabled": "false"},
    }
