"""The one INI configuration file and its defaults.

Keys named by CONTRACT.md section 6 keep their meaning; the rest are ours and
are documented in etc/controller.ini.sample.
"""

import configparser
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import InvalidInput
from controller.limits import SANDBOX_CAPACITY, SANDBOX_LIMITS

DEFAULT_CONFIG_PATH = "/etc/cloud-controller/controller.ini"
CONFIG_ENV = "CLOUD_CONTROLLER_CONFIG"

QUOTA_BACKENDS = ("none", "btrfs", "xfs", "setquota")
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
        "max_body_bytes": str(1024 * 1024),
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
        # Password logins hashing at once; one more is answered 429 at once.
        "max_password_checks": "2",
        # Password logins one client address may have in progress at once (0: no cap).
        "max_password_checks_per_source": "1",
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
    },
    "volumes": {
        "home_root": "/home",
        "quota_backend": "none",
        "max_size_gb": "1024",
        "quota_mountpoint": "",
    },
    "unix": {"root": ""},
    "directory": {
        # LDAP keys (people_ou, groups_ou, uid_min, uid_max, tls_ca_file, starttls,
        # timeout) and their defaults are documented in host_adapters/ldap_directory.py.
        "backend": "local",
        "uri": "",
        "base_dn": "",
        "bind_dn": "",
        "bind_password_file": "",
        "default_shell": "/bin/bash",
    },
    "controller": {"id": "1", "profile": "production"},
    # Groups made through the API (issue 8, finding 1); see etc/controller.ini.sample.
    "groups": {
        "name_prefix": "",
        "name_pattern": "",
        "refused_names": "",
        # Apart from the accounts' uids and private gids (local and LDAP: 10000-60000),
        # from Debian's reserved 60000-64999 and from systemd's dynamic users (61184-65519).
        "gid_min": "70000",
        "gid_max": "79999",
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
}

# GET /healthz answers from the last result of the checks, refreshed by one thread
# (issue 16, finding 2); see controller/health.py.
DEFAULTS["health"] = {
    # Seconds between two rounds of checks.
    "refresh_seconds": "2",
    # A check still running after this long is reported failed ("timed out").
    "check_timeout_seconds": "5",
}

# Audit growth and retention (issue 8, finding 4).
DEFAULTS["audit"] = {
    # Rows older than this many days are pruned by `cloud-agent serve` once an hour; 0 keeps them.
    "retention_days": "0",
    # Anonymous failed requests are counted and written as one row per this many seconds.
    "anonymous_interval_seconds": "300",
}


@dataclass
class Config:
    """Parsed configuration; `path` is the file it came from (None for defaults only)."""

    parser: configparser.ConfigParser
    path: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def get(self, section: str, key: str) -> str:
        return self.parser.get(section, key, fallback=DEFAULTS.get(section, {}).get(key, ""))

    def get_int(self, section: str, key: str) -> int:
        raw = self.get(section, key)
        try:
            return int(raw)
        except ValueError:
            raise InvalidInput(f"config [{section}] {key} must be an integer, got {raw!r}") from None

    # Accessors for the keys the code reads most.
    @property
    def database_path(self) -> str:
        return self.get("database", "path")

    @property
    def controller_id(self) -> int:
        return self.get_int("controller", "id")

    def trusted_proxies(self) -> tuple:
        """[server] trusted_proxies as ip_network objects (a bare address is a /32 or /128)."""
        import ipaddress

        raw = self.get("server", "trusted_proxies")
        try:
            return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in raw.split(",") if p.strip())
        except ValueError as e:
            raise InvalidInput(f"config [server] trusted_proxies: {e}") from None

    @property
    def is_sandbox(self) -> bool:
        return self.get("controller", "profile") == "sandbox"

    def validate(self) -> None:
        backend = self.get("volumes", "quota_backend")
        if backend not in QUOTA_BACKENDS:
            raise InvalidInput(f"config [volumes] quota_backend must be one of {', '.join(QUOTA_BACKENDS)}")
        directory = self.get("directory", "backend")
        if directory not in DIRECTORY_BACKENDS:
            raise InvalidInput(f"config [directory] backend must be one of {', '.join(DIRECTORY_BACKENDS)}")
        if self.get("libvirt", "virt_type") not in VIRT_TYPES:
            raise InvalidInput(f"config [libvirt] virt_type must be one of {', '.join(VIRT_TYPES)}")
        if self.get("guest", "sudo") not in GUEST_SUDO:
            raise InvalidInput(f"config [guest] sudo must be one of {', '.join(GUEST_SUDO)}")
        self._validate_guest_root_quota(backend)
        from controller.addresses import network_plan

        network_plan(self)  # raises InvalidInput naming the bad [network] key
        from controller.limits import check_config

        check_config(self)  # raises InvalidInput naming the bad [limits] or [capacity] key
        for section, key in (("controller", "id"), ("volumes", "max_size_gb"), ("server", "max_body_bytes")):
            self.get_int(section, key)
        for key in ("retention_days", "anonymous_interval_seconds"):
            if self.get_int("audit", key) < 0:
                raise InvalidInput(f"config [audit] {key} must be 0 or more")
        for key in ("retry_seconds", "connect_timeout_seconds", "capacity_max_age_seconds", "max_create_attempts",
                    "image_copy_wait_seconds"):
            if self.get_int("hosts", key) < 1:
                raise InvalidInput(f"config [hosts] {key} must be 1 or more")
        if not HOST_NAME.fullmatch(self.get("libvirt", "host_name")):
            raise InvalidInput("config [libvirt] host_name must match " + HOST_NAME.pattern)
        try:
            if not float(self.get("libvirt", "status_max_age_seconds")) >= 0:
                raise ValueError
        except ValueError:
            raise InvalidInput("config [libvirt] status_max_age_seconds must be a number of seconds, 0 or more") \
                from None
        for section, key in [("server", k) for k in ("connection_limit", "channel_timeout_seconds",
                                                     "request_timeout_seconds", "cleanup_interval_seconds",
                                                     "backlog", "max_header_bytes", "threads", "host_workers",
                                                     "host_queue_seconds")] + \
                [("health", "refresh_seconds"), ("health", "check_timeout_seconds")]:
            if self.get_int(section, key) < 1:
                raise InvalidInput(f"config [{section}] {key} must be 1 or more")
        if self.get_int("server", "host_queue") < 0:
            raise InvalidInput("config [server] host_queue must be 0 or more")
        if self.get_int("auth", "max_password_checks") < 1:
            raise InvalidInput("config [auth] max_password_checks must be 1 or more")
        if self.get_int("auth", "max_password_checks_per_source") < 0:
            raise InvalidInput("config [auth] max_password_checks_per_source must be 0 (no cap) or more")
        self.trusted_proxies()  # raises InvalidInput naming the bad address
        self._validate_groups()

    def _validate_guest_root_quota(self, backend: str) -> None:
        from host_adapters.quota import guest_root_escapes

        # Guest root writes through a home's share as uid 0 on the head node: a per-uid
        # limit never sees those files, so the owner's sudo would make the quota moot.
        if self.get("guest", "sudo") == "owner" and guest_root_escapes(backend):
            raise InvalidInput(
                f"config [guest] sudo = owner cannot be used with [volumes] quota_backend = {backend}: "
                f"{backend} limits the user's uid, and root in a guest writes into the homes shared with it "
                "as root, past every user's quota; use quota_backend btrfs or xfs (they limit the home "
                "whoever writes) or [guest] sudo = none")

    def _validate_groups(self) -> None:
        import re

        prefix = self.get("groups", "name_prefix")
        if prefix and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,30}", prefix):
            raise InvalidInput("config [groups] name_prefix must be the start of a POSIX name "
                               "(lower-case letters, digits, _ and -, not first) and leave room for a name")
        pattern = self.get("groups", "name_pattern")
        try:
            re.compile(pattern)
        except re.error as e:
            raise InvalidInput(f"config [groups] name_pattern is not a regular expression: {e}") from None
        low, high = self.get_int("groups", "gid_min"), self.get_int("groups", "gid_max")
        if not 1 <= low <= high <= 4294967294:
            raise InvalidInput("config [groups] gid_min and gid_max must give a range within 1-4294967294")


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | None = None) -> Config:
    """Read the INI file at path (or the default location); a missing file is an error."""
    path = path or default_config_path()
    parser = configparser.ConfigParser(interpolation=None)
    if not Path(path).is_file():
        raise InvalidInput(f"config file not found: {path}")
    parser.read(path)
    config = Config(parser=parser, path=str(path))
    config.validate()
    return config


def config_from_dict(values: dict[str, dict[str, object]], path: str | None = None) -> Config:
    """Build a Config in memory (tests, and `init --sandbox` before it writes the file)."""
    parser = configparser.ConfigParser(interpolation=None)
    for section, keys in values.items():
        parser[section] = {k: str(v) for k, v in keys.items()}
    config = Config(parser=parser, path=path)
    config.validate()
    return config


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
    """A complete config whose state all lives under state_dir (CONTRACT.md section 6)."""
    d = Path(state_dir).resolve()
    return {
        "controller": {"id": 1, "profile": "sandbox"},
        "database": {"path": d / "controller.db"},
        "server": {"host": "127.0.0.1", "port": 8080, "threads": 4, "max_body_bytes": 1048576},
        "auth": {
            "secret_key_file": d / "secret.key",
            "token_ttl_seconds": 3600,
            "max_failures": 5,
            "failure_window_seconds": 300,
            "lockout_seconds": 60,
        },
        "libvirt": {"uri": "test:///default", "storage_pool": "default-pool", "domain_prefix": "cc-",
                    "virt_type": "kvm", "cpu_mode": "host-passthrough"},
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
    }
