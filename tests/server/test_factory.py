"""The adapter factory turns the config's keys into the right host adapters."""

import pytest

from controller.config import config_from_dict, sandbox_values
from host_adapters import factory
from host_adapters.homes.btrfs_quota import BtrfsQuota
from host_adapters.homes.homes import DirectoryHomeVolumes
from host_adapters.libvirt.driver import LibvirtHypervisor
from host_adapters.accounts.local_directory import LocalDirectory
from host_adapters.accounts.local_groups import CommandUnixGroups
from host_adapters.homes.quota import NoQuota
from host_adapters.homes.setquota import SetQuota
from host_adapters.homes.xfs_quota import XfsQuota


def config(tmp_path, **sections):
    values = sandbox_values(str(tmp_path))
    for section, keys in sections.items():
        values.setdefault(section, {}).update(keys)
    return config_from_dict(values)


def test_sandbox_builds_real_adapters_without_touching_the_host(tmp_path):
    adapters = factory.build_adapters(config(tmp_path))
    assert isinstance(adapters.hypervisor, LibvirtHypervisor)
    assert isinstance(adapters.homes, DirectoryHomeVolumes)
    assert isinstance(adapters.groups, CommandUnixGroups)
    assert isinstance(adapters.directory, LocalDirectory)
    assert [name for name, _ in adapters.checks()] == ["libvirt", "directory", "quota_backend", "system_root"]


def test_the_test_driver_gets_in_process_volumes_and_stand_in_base_disks(tmp_path):
    from host_adapters.libvirt.volume_io import InProcessVolumeIO, StreamVolumeIO

    hv = factory.build_hypervisor(config(tmp_path))
    assert isinstance(hv._io, InProcessVolumeIO) and hv._stand_in
    hv = factory.build_hypervisor(config(tmp_path, libvirt={"uri": "qemu:///system", "virt_type": "qemu",
                                                            "cpu_mode": "qemu64"},
                                         network={"name": "cc-net", "subnet": "10.50.0.0/24"}))
    assert isinstance(hv._io, StreamVolumeIO) and not hv._stand_in
    assert (hv.virt_type, hv.cpu_mode, hv.network, str(hv.subnet)) == ("qemu", "qemu64", "cc-net", "10.50.0.0/24")


@pytest.mark.parametrize("backend,cls", [
    ("none", NoQuota), ("btrfs", BtrfsQuota), ("xfs", XfsQuota), ("setquota", SetQuota),
])
def test_quota_backends(tmp_path, backend, cls):
    built = factory.build_quota(config(tmp_path, volumes={"quota_backend": backend}))
    assert isinstance(built, cls)


def test_quota_mountpoint_overrides_the_derived_one(tmp_path):
    built = factory.build_quota(config(tmp_path, volumes={"quota_backend": "xfs", "quota_mountpoint": "/srv"}))
    assert built.mount_point == "/srv"
    built = factory.build_quota(config(tmp_path, volumes={"quota_backend": "setquota", "quota_mountpoint": "/srv"}))
    assert built.filesystem == "/srv"


def test_ldap_backend_reads_its_section(tmp_path):
    secret = tmp_path / "bind.pw"
    secret.write_text("s3cret\n")
    directory = factory.build_directory(config(tmp_path, directory={
        "backend": "ldap", "uri": "ldap://127.0.0.1:1/", "base_dn": "dc=example,dc=test",
        "bind_dn": "cn=admin,dc=example,dc=test", "bind_password_file": str(secret), "uid_min": "30000",
    }))
    from host_adapters.accounts.ldap_directory import LdapDirectory

    assert isinstance(directory, LdapDirectory)


def test_the_config_has_every_key_the_factory_reads_with_its_type():
    # host_adapters names what it reads of the config (factory.AdapterConfig) instead of
    # importing controller/config.py: the service's Config must still have each of them.
    import typing

    from controller.config import Config

    sections = typing.get_type_hints(factory.AdapterConfig)
    assert set(sections) == {"libvirt", "network", "volumes", "unix", "directory", "groups", "hosts"}
    have = typing.get_type_hints(Config)
    for section, keys in sections.items():
        wanted, kept = typing.get_type_hints(keys), typing.get_type_hints(have[section])
        assert {key: kept.get(key) for key in wanted} == wanted, section
    assert callable(Config.raw_section)
