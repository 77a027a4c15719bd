import pytest

from host_adapters import subp

# Fixtures that start or build real host parts live in their own modules.
pytest_plugins = [
    "tests.fixtures.api",
    "tests.fixtures.blackbox",
    "tests.fixtures.sysroot",
    "tests.fixtures.btrfs",
    "tests.fixtures.libvirtd",
    "tests.fixtures.remote_libvirtd",
    "tests.fixtures.slapd",
    "tests.fixtures.guest_image",
    "tests.fixtures.commands",
    "tests.fixtures.nspawn",
]


@pytest.fixture(autouse=True)
def _forbid_real_commands(request, monkeypatch):
    """Unit tests must not run host binaries; tests marked real_commands may."""
    if request.node.get_closest_marker("real_commands"):
        return

    def refuse(argv, **kwargs):
        raise AssertionError(f"real command in a unit test: {argv!r}")

    monkeypatch.setattr(subp, "_run", refuse)
    monkeypatch.setattr(subp, "_popen", refuse)


@pytest.fixture
def no_commands(monkeypatch):
    """For a test among real_commands ones that must run no host binary at all."""

    def refuse(argv, **kwargs):
        raise AssertionError(f"a command ran: {argv!r}")

    monkeypatch.setattr(subp, "_run", refuse)
    monkeypatch.setattr(subp, "_popen", refuse)


def pytest_collection_modifyitems(config, items):
    """A test that boots the guest image is marked `guest` (and `integration`): the test
    command runs those alone (scripts/test_lanes.py), never beside other heavy work, or a
    guest under software emulation misses its bounded waits."""
    wrong = [item.nodeid for item in items if "guest_image" in item.fixturenames
             and not (item.get_closest_marker("guest") and item.get_closest_marker("integration"))]
    if wrong:
        raise pytest.UsageError("tests that boot the guest image must be marked guest and integration: "
                                + ", ".join(wrong))
