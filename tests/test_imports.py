"""The package's import graph has no cycles, and no test module imports another test module."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "seq2seq_cli"

# config -> checkpoint (for atomic_write_text) closes config -> checkpoint -> config;
# removed when atomic writes leave checkpoint.py.
def _imported_modules(tree: ast.AST, package_modules: set[str]) -> set[str]:
    """Package modules named by the imports anywhere in a module, lazy ones inside functions included."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in package_modules:
                found.add(parts[1])
    return found


def import_graph() -> dict[str, set[str]]:
    """{module: package modules it imports} for every module of the package."""
    files = {p.stem: p for p in (REPO / PACKAGE).glob("*.py")}
    return {name: _imported_modules(ast.parse(path.read_text(encoding="utf-8")), set(files)) - {name}
            for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, each module importing the next (first == last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()  # graph values are a node's predecessors
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))
    return None


def test_a_cycle_is_reported_in_import_order():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"])
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_is_read():
    graph = import_graph()
    assert "kv_cache" in graph["model"] and "model" in graph["search"] and "ids" in graph["model"]


def test_no_import_cycles_among_package_modules():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_test_module_imports_another_test_module():
    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[-1].startswith("test_") or n.startswith("tests.")]
    assert not offenders, "test modules importing test modules:\n" + "\n".join(offenders)
