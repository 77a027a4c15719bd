"""Strict validation of names that reach a host command or a path.

`groupadd` itself accepts names such as `bad;name`, so every name is checked
here before any command runs.
"""

import re

from common.errors import InvalidInput

# POSIX portable user and group names, as CONTRACT.md section 5 fixes them.
_POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def check_group_name(name: object) -> str:
    if not isinstance(name, str) or not _POSIX_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid group name {name!r}: must match ^[a-z_][a-z0-9_-]{{0,31}}$"
        )
    return name


def check_username(name: object) -> str:
    if not isinstance(name, str) or not _POSIX_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid username {name!r}: must match ^[a-z_][a-z0-9_-]{{0,31}}$"
        )
    return name


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
