"""The typed configuration object (controller/config.py): one field per key, checked at load."""

import dataclasses
import ipaddress

import pytest

from controller.config import DEFAULTS, SECTIONS, Config, config_from_dict, load_config, sandbox_values
from controller.errors import InvalidInput

SECTION_FIELDS = {"path", "written"}  # Config's own fields that are not sections


def test_every_default_key_has_a_typed_field_and_every_field_a_default():
    types = {f.name: f.type for f in dataclasses.fields(Config) if f.name not in SECTION_FIELDS}
    assert set(types) == set(DEFAULTS) == set(SECTIONS)
    for name, cls in SECTIONS.items():
        assert types[name] is cls
        assert [f.name for f in dataclasses.fields(cls)] == list(DEFAULTS[name]), name


def test_the_defaults_are_read_with_their_types():
    config = config_from_dict({})
    assert config.path is None
    for name, cls in SECTIONS.items():
        section = getattr(config, name)
        assert dataclasses.is_dataclass(section) and type(section) is cls
    assert config.hosts.retry_seconds == 30 and type(config.hosts.retry_seconds) is int
    assert config.libvirt.status_max_age_seconds == 2.0 and type(config.libvirt.status_max_age_seconds) is float
    assert config.capacity.cpu_allocation_ratio == 4.0 and config.capacity.reserved_host_memory_mb == 4096
    assert config.network.isolate_guests is False
    assert config.server.interfaces == ("controller", "user")
    assert config.server.trusted_proxies == ()
    assert config.groups.refused_names == ()
    assert (config.database_path, config.controller_id, config.is_sandbox) == (DEFAULTS["database"]["path"], 1, False)


def test_written_values_are_typed_and_stripped(tmp_path):
    values = sandbox_values(str(tmp_path))
    values["server"].update(trusted_proxies="10.0.0.1, 10.1.0.0/16", interfaces=" user ")
    values["network"]["isolate_guests"] = "Yes"
    values["groups"] = {"refused_names": "wheel, , sudo"}
    values["hosts"] = {"retry_seconds": " 7 "}
    config = config_from_dict(values)
    assert config.server.trusted_proxies == (ipaddress.ip_network("10.0.0.1/32"), ipaddress.ip_network("10.1.0.0/16"))
    assert config.server.interfaces == ("user",)
    assert config.network.isolate_guests is True
    assert config.groups.refused_names == ("wheel", "sudo")
    assert config.hosts.retry_seconds == 7
    assert config.is_sandbox and config.limits.instances == 10000


def test_the_config_cannot_be_changed_in_place(tmp_path):
    config = config_from_dict(sandbox_values(str(tmp_path)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hosts.retry_seconds = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hosts = None


def _int_keys():
    return [(name, f.name) for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if f.type is int and "parse" not in f.metadata]


@pytest.mark.parametrize("section, key", _int_keys())
def test_a_wrongly_typed_value_is_refused_naming_section_and_key(tmp_path, section, key):
    values = sandbox_values(str(tmp_path))
    values.setdefault(section, {})[key] = "ten"
    with pytest.raises(InvalidInput, match=rf"^config \[{section}\] {key} must be an integer, got 'ten'$"):
        config_from_dict(values)


def test_a_wrongly_typed_value_in_the_file_is_refused_at_load(tmp_path):
    path = tmp_path / "controller.ini"
    path.write_text("[auth]\ntoken_ttl_seconds = an hour\n")
    with pytest.raises(InvalidInput, match=r"^config \[auth\] token_ttl_seconds must be an integer, got 'an hour'$"):
        load_config(str(path))
    path.write_text("[network]\nisolate_guests = maybe\n")
    with pytest.raises(InvalidInput, match=r"^config \[network\] isolate_guests: 'maybe' is not true or false$"):
        load_config(str(path))
    path.write_text("[libvirt]\nvirt_type = xen\n")
    with pytest.raises(InvalidInput, match=r"^config \[libvirt\] virt_type must be one of kvm, qemu$"):
        load_config(str(path))


def test_a_file_is_read_once_with_its_path_and_raw_section(tmp_path):
    path = tmp_path / "controller.ini"
    path.write_text("[directory]\nbackend = local\npeople_ou = ou=staff\n[hosts]\nretry_seconds = 9\n")
    config = load_config(str(path))
    assert config.path == str(path) and config.hosts.retry_seconds == 9
    # The LDAP adapter's own keys are read from the section as written, without defaults.
    assert config.raw_section("directory") == {"backend": "local", "people_ou": "ou=staff"}
    assert config.raw_section("unix") == {}


def test_with_values_gives_a_new_checked_config(tmp_path):
    config = config_from_dict(sandbox_values(str(tmp_path)))
    changed = config.with_values({"hosts": {"max_create_attempts": 2}})
    assert changed.hosts.max_create_attempts == 2 and config.hosts.max_create_attempts == 3
    assert changed.database_path == config.database_path
    with pytest.raises(InvalidInput, match=r"config \[hosts\] max_create_attempts must be 1 or more"):
        config.with_values({"hosts": {"max_create_attempts": 0}})
