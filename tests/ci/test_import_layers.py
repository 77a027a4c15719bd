"""Imports only go down the floors of docs/architecture.md: agent/ over api/ over controller/
over host_adapters/ over common/, never up, not even for the type checker (an import under
`if TYPE_CHECKING:` is an arrow too) nor late inside a function. Inside controller/ and
host_adapters/, their packages stand on floors of their own (CONTROLLER_FLOORS,
HOST_ADAPTERS_FLOORS) and the same holds between them. No
module imports itself back through others, in the tests neither, no package through other
packages, and the rooms every resource module shares (guests, lookups) import none of them."""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ("common", "host_adapters", "controller", "api", "agent")  # ground first
PACKAGES = (*FLOORS, "tests")
RESOURCES = {"controller.users.users", "controller.users.accounts", "controller.users.groups",
             "controller.storage.images", "controller.storage.volumes", "controller.instances.instances"}
# controller/'s packages (controller/NAME/) and the modules at its top (controller/NAME.py),
# ground first: each imports only from its own floor or below. On one floor, arrows may run
# between its members (config reads limits) but never in a circle (the package test below).
CONTROLLER_FLOORS = (
    # The kernel every domain uses: errors, value rules, permissions, locks, configuration.
    ("errors", "rules", "permissions", "locks", "limits", "addresses", "config", "background",
     "status_cursors"),
    ("store", "security"),  # the SQL; password hashes, secrets, throttles
    ("audit",),  # the audit trail, each instance's history, request ids
    ("context",),  # what every service function is given
    ("lookups", "hosts"),  # the lookups resources share; hypervisor hosts and placement
    ("instances", "monitoring"),  # server-instances and their guests; /healthz and /metrics
    # volumes and images; users, accounts, groups; tokens; one cloud auth for several clusters
    ("storage", "users", "auth", "cloud_auth"),
    ("maintenance", "portal"),  # drain, evacuate, reconcile; what the portal's pages show
)
# host_adapters/'s packages and top modules, ground first, the same way.
HOST_ADAPTERS_FLOORS = (
    ("subp", "names", "fail_on"),  # the one command wrapper; name checks; the fakes' failing steps
    # A host's files; homes and their quotas; accounts and groups; what a guest is told and shares.
    ("files", "homes", "accounts", "guests"),
    ("network", "hypervisor"),  # the guests' NIC rules (remote hosts through files/); the VM interface
    ("images", "host_pool"),  # base images and moved disks checked; many hosts, one Hypervisor each
    ("libvirt",),  # the real Hypervisor, and the libvirt hook that writes the NIC rules on the host
    ("fake_hypervisor",),  # the in-memory Hypervisor (its NICs get libvirt's rules: nic_filters)
    ("factory",),  # the set of adapters, built from the config or from fakes
)
LAYERS = {"controller": CONTROLLER_FLOORS, "host_adapters": HOST_ADAPTERS_FLOORS}


def _imports(source: str) -> set[str]:
    """The modules a file's text imports: at its top, inside functions or under any `if`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from controller import hosts` names a module too.
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {i for i in _imports(path.read_text()) if i in modules and i != name}
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows from a module to a higher floor than its own."""
    floor = {name: FLOORS.index(name.split(".")[0]) for name in graph if name.split(".")[0] in FLOORS}
    return sorted((a, b) for a in floor for b in graph[a] if b in floor and floor[b] > floor[a])


def test_no_import_circle_anywhere():
    graph = _graph()
    # The tree was read, subfolders and tests included.
    assert {"controller.instances.instances", "api.app", "agent.cloud.cli", "host_adapters.libvirt.driver",
            "host_adapters.network.nft_guest_firewall", "common.client.session", "tests.fixtures.api"} <= set(graph)
    assert _cycle(graph) is None


def test_no_import_runs_up_a_floor():
    assert _upward(_graph()) == []


def _package(module: str) -> str:
    """Where a module lives: its floor's package and first folder or module below it
    (controller.hosts.drain -> controller.hosts, controller.errors -> controller.errors)."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for a, targets in graph.items():
        packages.setdefault(_package(a), set()).update(_package(b) for b in targets if _package(b) != _package(a))
    return packages


def test_no_import_circle_between_packages():
    packages = _package_graph(_graph())
    assert {"controller.hosts", "controller.store", "host_adapters.libvirt", "host_adapters.network",
            "api.portal"} <= set(packages)
    assert _cycle(packages) is None


def _floor_of(layer: str) -> dict[str, int]:
    return {f"{layer}.{name}": i for i, floor in enumerate(LAYERS[layer]) for name in floor}


@pytest.mark.parametrize("layer", LAYERS)
def test_every_package_stands_on_a_floor(layer):
    floor = _floor_of(layer)
    assert sum(map(len, LAYERS[layer])) == len(floor)  # none on two floors
    nodes = {_package(m) for m in _graph() if m.startswith(f"{layer}.")}
    assert nodes == set(floor)


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_runs_up_a_floor_inside(layer):
    floor = _floor_of(layer)
    packages = _package_graph(_graph())
    assert sorted((a, b) for a in floor for b in packages[a] if b in floor and floor[b] > floor[a]) == []


def test_guests_and_lookups_import_no_resource_module():
    graph = _graph()
    for shared in ("controller.instances.guests", "controller.lookups"):
        assert graph[shared] & RESOURCES == set(), shared


def test_a_module_counts_as_its_package():
    assert _package("controller.hosts.drain") == "controller.hosts"
    assert _package("controller.errors") == "controller.errors"
    assert _package_graph({"controller.a.x": {"controller.b.y", "controller.a.z"}, "controller.a.z": set(),
                           "controller.b.y": {"controller.a.z"}}) == {
        "controller.a": {"controller.b"}, "controller.b": {"controller.a"}}
    assert _cycle(_package_graph({"controller.a.x": {"controller.b.y"}, "controller.b.y": {"controller.a.z"},
                                  "controller.a.z": set()})) is not None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_an_import_for_the_type_checker_or_inside_a_function_counts():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from controller.config import Config\n"
              "def build():\n    from api import app\n")
    assert {"controller.config", "api.app"} <= _imports(source)
    assert _upward({"host_adapters.factory": {"controller.config", "common.errors"}, "controller.config": set(),
                    "common.errors": set()}) == [("host_adapters.factory", "controller.config")]
