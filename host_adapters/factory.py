"""The set of host adapters the service uses, built from the config or from fakes."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from host_adapters.accounts.directory import Directory, FakeDirectory
from host_adapters.homes.homes import FakeHomeVolumes, HomeVolumes
from host_adapters.fake_hypervisor import FakeHosts, FakeHypervisor
from host_adapters.host_pool import HostPool, HostSpec
from host_adapters.hypervisor import Hypervisor
from host_adapters.accounts.unix_groups import FakeUnixGroups, UnixGroups
from host_adapters.guests.virtiofs import LocalShareConfinement, ShareConfinement


# What the factory reads of the service's config (AdapterConfig), named here so that
# host_adapters never imports the floor above it: controller/config.py's Config has these
# sections and keys (tests/server/test_factory.py holds the two together). Read, never set.
class LibvirtKeys(Protocol):
    uri: str
    storage_pool: str
    domain_prefix: str
    virt_type: str
    cpu_mode: str
    host_name: str
    status_max_age_seconds: float


class NetworkKeys(Protocol):
    name: str
    subnet: str


class VolumesKeys(Protocol):
    home_root: str
    quota_backend: str
    quota_mountpoint: str
    quota_command: str
    quota_command_timeout_seconds: int


class UnixKeys(Protocol):
    root: str


class DirectoryKeys(Protocol):
    backend: str
    default_shell: str


class GroupsKeys(Protocol):
    gid_min: int
    gid_max: int
    backend: str
    ldap_base: str


class HostsKeys(Protocol):
    retry_seconds: int
    connect_timeout_seconds: int


class AdapterConfig(Protocol):
    libvirt: LibvirtKeys
    network: NetworkKeys
    volumes: VolumesKeys
    unix: UnixKeys
    directory: DirectoryKeys
    groups: GroupsKeys
    hosts: HostsKeys

    def raw_section(self, section: str) -> dict[str, str]:
        """A section's keys as written: the LDAP directory checks its own."""


@dataclass
class Adapters:
    hypervisor: Hypervisor
    homes: HomeVolumes
    groups: UnixGroups
    directory: Directory
    # The hypervisor's state lives no longer than this process's connection to it
    # (libvirt's test driver, the sandbox: in this process, or in a daemon that drops
    # it when its last client goes): the server rebuilds it at start, another process
    # cannot check it, and a missing base disk may stand in blank.
    hypervisor_in_process: bool = False
    # One Hypervisor per hypervisor host (host_adapters/host_pool.py); `hypervisor` is the
    # config's own host. Without one, every host is that one (a single node).
    hosts: HostPool | None = None
    fake_hosts: FakeHosts | None = None  # the fakes behind `hosts` in tests
    # What confines a home's share on the config's host (`cloud-agent check`); None where
    # this process cannot look: the test driver runs no virtiofsd, a remote host's is there.
    shares: ShareConfinement | None = None

    def __post_init__(self):
        if self.hosts is None:
            self.hosts = HostPool(lambda spec: self.hypervisor)

    def checks(self) -> Iterator[tuple[str, Callable[[], None]]]:
        # The names `cloud-agent check` and /healthz report them by; homes and their quotas
        # are one check.
        yield "libvirt", self.hypervisor.check
        yield "directory", self.directory.check
        yield "quota_backend", self.homes.check
        yield "system_root", self.groups.check


def build_quota(config: AdapterConfig):
    from host_adapters.homes.quota_backends import make_quota_backend

    volumes = config.volumes
    return make_quota_backend(volumes.quota_backend, home_root=volumes.home_root,
                              mount_point=volumes.quota_mountpoint, command=volumes.quota_command,
                              command_timeout=volumes.quota_command_timeout_seconds)


def build_directory(config: AdapterConfig) -> Directory:
    if config.directory.backend == "ldap":
        from host_adapters.accounts.ldap_directory import ldap_directory_from_config

        return ldap_directory_from_config(config.raw_section("directory"), system_root=config.unix.root or None)
    from host_adapters.accounts.local_directory import LocalDirectory

    return LocalDirectory(config.unix.root or None, shell=config.directory.default_shell)


def build_groups(config: AdapterConfig, directory: Directory) -> UnixGroups:
    """`[groups] backend`: ldap writes posixGroups on the directory's server, local runs groupadd."""
    gid_range = (config.groups.gid_min, config.groups.gid_max)
    if config.groups.backend == "ldap":
        from host_adapters.accounts.ldap_groups import LdapUnixGroups

        return LdapUnixGroups(directory, base_dn=config.groups.ldap_base or None, gid_range=gid_range)
    from host_adapters.accounts.local_groups import CommandUnixGroups

    return CommandUnixGroups(config.unix.root or None, gid_range=gid_range)


def config_host(config: AdapterConfig) -> HostSpec:
    """The host the config names ([libvirt] uri, storage_pool, host_name; [network] name)."""
    return HostSpec(name=config.libvirt.host_name, uri=config.libvirt.uri,
                    storage_pool=config.libvirt.storage_pool, network=config.network.name)


def is_test_driver(uri: str) -> bool:
    """libvirt's test driver, in this process (`test:///default`) or served by a libvirtd
    (`test+unix:///default?socket=...`, any transport): either way it keeps its state in
    memory, has no volume streams and runs no guest."""
    scheme = uri.split(":", 1)[0]
    return scheme == "test" or scheme.startswith("test+")


def is_in_process_test_driver(uri: str) -> bool:
    """libvirt's test driver inside this process (`test:///default`, the sandbox profile): its
    domains are this process's alone, unseen by any other."""
    return uri.split(":", 1)[0] == "test"


def is_local_qemu(uri: str) -> bool:
    """A QEMU libvirt URI served on this machine (`qemu:///system`, `qemu+unix:///system`)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    return parts.scheme in ("qemu", "qemu+unix") and not parts.netloc


# Which channel reaches a host's console files (this machine, loopback, ssh) is chosen from its
# URI by host_files_choice.host_files_for, kept in a module of its own: the libvirt adapter
# picks its default there, and this module imports the adapter.


def build_hypervisor(config: AdapterConfig, host: HostSpec | None = None) -> Hypervisor:
    """The Hypervisor of one host (default: the config's own), with the config's
    virt_type, cpu_mode, domain prefix and subnet."""
    from host_adapters.files.host_files_choice import host_files_for
    from host_adapters.libvirt.driver import LibvirtHypervisor
    from host_adapters.libvirt.volume_io import InProcessVolumeIO, StreamVolumeIO

    host = host or config_host(config)
    # libvirt's test driver (the sandbox) has no volume streams, also behind a daemon,
    # and keeps its volumes only while the process (or the daemon's last client) lives:
    # contents stay in this process's memory and a missing base disk gets a blank
    # stand-in. Every other driver is a real host.
    test_driver = is_test_driver(host.uri)
    # Only a connection with nothing behind it cannot hang; a daemon (even the test
    # driver's, on a local socket) gets the same bound as any host.
    in_process = host.uri.split(":", 1)[0] == "test"
    return LibvirtHypervisor(
        host.uri,
        storage_pool=host.storage_pool,
        domain_prefix=config.libvirt.domain_prefix,
        network=host.network,
        subnet=config.network.subnet,
        virt_type=config.libvirt.virt_type,
        cpu_mode=config.libvirt.cpu_mode,
        volume_io=InProcessVolumeIO() if test_driver else StreamVolumeIO(),
        stand_in_base_images=test_driver,
        connect_timeout=None if in_process else float(config.hosts.connect_timeout_seconds),
        status_max_age=float(config.libvirt.status_max_age_seconds),
        lean_definitions=test_driver,
        # The console files: read on this machine or over ssh, never through a pool.
        host_files=host_files_for(host.uri),
    )


def build_hosts(config: AdapterConfig, default: Hypervisor) -> HostPool:
    """A HostPool whose config host is `default` (one connection per host) and whose
    other hosts are built from their records."""
    own = config_host(config)
    return HostPool(lambda spec: default if spec == own else build_hypervisor(config, spec),
                    retry_seconds=float(config.hosts.retry_seconds))


def build_adapters(config: AdapterConfig) -> Adapters:
    from host_adapters.homes.homes import DirectoryHomeVolumes

    hypervisor = build_hypervisor(config)
    directory = build_directory(config)
    return Adapters(
        hypervisor_in_process=is_test_driver(config.libvirt.uri),
        hypervisor=hypervisor,
        hosts=build_hosts(config, hypervisor),
        homes=DirectoryHomeVolumes(config.volumes.home_root, build_quota(config)),
        groups=build_groups(config, directory),
        directory=directory,
        shares=LocalShareConfinement() if is_local_qemu(config.libvirt.uri) else None,
    )


def fake_adapters() -> Adapters:
    directory = FakeDirectory()
    hypervisor = FakeHypervisor()
    fakes = FakeHosts(hypervisor)
    return Adapters(
        hypervisor=hypervisor,
        hosts=HostPool(fakes.build),
        fake_hosts=fakes,
        homes=FakeHomeVolumes(),
        groups=FakeUnixGroups(directory=directory),
        directory=directory,
    )
