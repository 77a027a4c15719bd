"""The service layer and the API import downwards only: no module imports itself back
through others (late imports inside functions included), and the rooms every resource
module shares (guests, lookups) import none of them (docs/architecture.md)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "api")
RESOURCES = {"controller.users", "controller.accounts", "controller.groups", "controller.images",
             "controller.instances", "controller.volumes"}


def _imports(path: Path) -> set[str]:
    """The project modules a file imports, at its top or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from controller import hosts` names a module too.
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    modules = {f"{p}.{f.stem}": f for p in PACKAGES for f in (ROOT / p).glob("*.py") if f.stem != "__init__"}
    return {name: {i for i in _imports(path) if i in modules and i != name}
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


def test_controller_and_api_have_no_import_circle():
    graph = _graph()
    assert "controller.instances" in graph and "api.app" in graph  # the tree was read
    assert _cycle(graph) is None


def test_guests_and_lookups_import_no_resource_module():
    graph = _graph()
    for shared in ("controller.guests", "controller.lookups"):
        assert graph[shared] & RESOURCES == set(), shared


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
