"""Strict validation of names that reach a host command or a path, and the names made from them.

`groupadd` itself accepts names such as `bad;name`, so every name is checked
here before any command runs. The hypervisor adapters name domains and
volumes after instance and image ids (Names): those ids are checked here too.
"""

import re
import uuid

from common.errors import InvalidInput
from common.words import GROUP_NAME_RULE, ID_RULE, PREFIX_RULE, USERNAME_RULE, VOLUME_NAME_RULE, quoted

# POSIX portable user and group names: a lower-case letter or underscore, then up to 31
# lower-case letters, digits, underscores or hyphens.
_POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def check_pattern(value: object, pattern: re.Pattern, what: str, rule: str = "") -> str:
    """`value`, a string `pattern` matches whole; else InvalidInput naming `what`, the value
    (cut short) and `rule`: the pattern in words (common/words.py), never the pattern."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInput(f"invalid {what} {quoted(value)}" + (f": {rule}" if rule else ""))
    return value


def check_group_name(name: object) -> str:
    return check_pattern(name, _POSIX_NAME, "group name", GROUP_NAME_RULE)


def check_username(name: object) -> str:
    return check_pattern(name, _POSIX_NAME, "username", USERNAME_RULE)


# Group names an API client may never take (issue 8, finding 1). Membership in
# these hands out root or host-wide access, through sudoers rules (%sudo,
# %admin, %wheel), package install scripts that create them later (docker, lxd,
# libvirt), device and file ownership (disk, kmem, shadow, video, render,
# input, tty, kvm) or write access to system paths (staff: /usr/local). The
# list is Debian's base groups (base-passwd's group.master) plus the groups
# that common packages and other distributions make privileged; names that
# already exist on the host are refused anyway, these are refused even where
# they do not exist (yet), since a cluster node or a later package may have
# them. `[groups] refused_names` adds site-specific names.
PRIVILEGED_GROUP_NAMES = frozenset({
    # base-passwd's group.master (Debian 12)
    "root", "daemon", "bin", "sys", "adm", "tty", "disk", "lp", "mail", "news", "uucp", "man",
    "proxy", "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip",
    "www-data", "backup", "operator", "list", "irc", "src", "gnats", "shadow", "utmp", "video",
    "sasl", "plugdev", "staff", "games", "users", "nogroup",
    # admin and privilege groups of other distributions and tools
    "admin", "wheel", "sudoers", "toor", "nobody", "nfsnobody", "lpadmin", "sambashare",
    # container and virtualization control (root-equivalent)
    "docker", "podman", "lxd", "lxc", "incus", "incus-admin", "libvirt", "libvirt-qemu",
    "libvirt-dnsmasq", "libvirtd", "kvm", "qemu", "vboxusers",
    # devices and system services
    "input", "render", "sgx", "netdev", "bluetooth", "scanner", "i2c", "gpio", "crontab",
    "messagebus", "polkitd", "ssl-cert", "ssh", "_ssh", "sshd", "tss", "tcpdump", "wireshark",
    "pcap", "log", "syslog", "journal", "mlocate", "ntp", "_chrony", "chrony", "openldap", "ldap",
    "nslcd", "sssd", "postfix", "postdrop", "rdma", "uuidd",
    # HPC services whose group members can act for every user
    "slurm", "munge", "pbs", "torque", "lsfadmin",
})
# Prefixes of families of system groups (systemd-journal, systemd-network, ...).
PRIVILEGED_GROUP_PREFIXES = ("systemd-",)


def privileged_group_name(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether an API client must not create a group of this name (see PRIVILEGED_GROUP_NAMES)."""
    return (name in PRIVILEGED_GROUP_NAMES or name in extra
            or any(name.startswith(p) for p in PRIVILEGED_GROUP_PREFIXES))


# --- domain and volume names (the hypervisor adapters) ------------------------

# Ids end up in domain and volume names, hence in paths: no "/", no leading dot.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VOLUME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_TOKEN = re.compile(r"^[0-9a-f]{8}-$")


def check_id(value: object, what: str) -> str:
    return check_pattern(value, _ID, what, f"{what[:1].upper()}{what[1:]}s are {ID_RULE}")


def check_volume_name(value: object) -> str:
    return check_pattern(value, _VOLUME, "base image volume name", VOLUME_NAME_RULE)


class Names:
    """Domain and volume names of one deployment (one prefix)."""

    def __init__(self, prefix: str):
        check_pattern(prefix, _PREFIX, "domain prefix", PREFIX_RULE)
        self.prefix = prefix

    def domain(self, instance_id: str) -> str:
        return self.prefix + instance_id

    def disk(self, instance_id: str) -> str:
        return f"{self.prefix}disk-{instance_id}.qcow2"

    def seed(self, instance_id: str) -> str:
        return f"{self.prefix}seed-{instance_id}.iso"

    def base(self, image_id: str) -> str:
        return f"{self.prefix}base-{image_id}.qcow2"

    def partial_base(self, image_id: str, token: str) -> str:
        """Where an upload writes before the base image is published; `token` (8 hex digits)
        keeps two uploads of one image (two processes) apart."""
        return f"{self.prefix}part-{token}-{image_id}.qcow2"

    def _strip(self, name: str, head: str, tail: str) -> str | None:
        if name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
            found = name[len(head) : len(name) - len(tail)]
            return found if _ID.fullmatch(found) else None
        return None

    def instance_of_domain(self, name: str) -> str | None:
        return self._strip(name, self.prefix, "")

    def instance_of_disk(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}disk-", ".qcow2")

    def instance_of_seed(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}seed-", ".iso")

    def image_of_base(self, name: str) -> str | None:
        return self._strip(name, f"{self.prefix}base-", ".qcow2")

    def image_of_partial(self, name: str) -> str | None:
        found = self._strip(name, f"{self.prefix}part-", ".qcow2")
        if found is None or not _TOKEN.fullmatch(found[:9]):
            return None
        return found[9:] if _ID.fullmatch(found[9:]) else None


def domain_uuid(instance_id: str, domain_name: str) -> str:
    # Operators find an instance in `virsh list --uuid` by the controller's id.
    try:
        return str(uuid.UUID(instance_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, "libvirt-domain:" + domain_name))
