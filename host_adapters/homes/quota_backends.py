"""Which quota backend `[volumes] quota_backend` names, and what the config checks of it."""

from common.errors import InvalidInput
from host_adapters.homes.btrfs_quota import BtrfsQuota
from host_adapters.homes.command_quota import CommandQuota
from host_adapters.homes.quota import NoQuota, QuotaBackend, find_mount_point
from host_adapters.homes.setquota import SetQuota
from host_adapters.homes.xfs_quota import XfsQuota

BACKEND_CLASSES: dict[str, type[QuotaBackend]] = {
    "none": NoQuota, "btrfs": BtrfsQuota, "xfs": XfsQuota, "setquota": SetQuota, "command": CommandQuota,
}
BACKENDS = tuple(BACKEND_CLASSES)


def guest_root_escapes(name: str) -> bool:
    """Whether root in a guest can write past the limits the backend `name` sets (setquota)."""
    cls = BACKEND_CLASSES[name]
    return cls.enforces_limits and not cls.binds_every_writer


def make_quota_backend(name: str, *, home_root: str, mount_point: str = "", command: str = "",
                       command_timeout: float = 60) -> QuotaBackend:
    """The backend `[volumes] quota_backend = name` asks for, for homes under home_root.

    xfs and setquota act on a filesystem: mount_point (`[volumes] quota_mountpoint`)
    when given, otherwise the one holding home_root. command runs the program `command`
    (`[volumes] quota_command`), bounded by command_timeout seconds.
    """
    if name == "none":
        return NoQuota()
    if name == "btrfs":
        return BtrfsQuota()
    if name == "xfs":
        return XfsQuota(mount_point=mount_point or find_mount_point(home_root))
    if name == "setquota":
        return SetQuota(filesystem=mount_point or find_mount_point(home_root))
    if name == "command":
        return CommandQuota(program=command, timeout=command_timeout)
    raise InvalidInput(f"unknown quota_backend {name!r}: must be one of {', '.join(BACKENDS)}")
