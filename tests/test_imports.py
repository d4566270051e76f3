"""The package's import graph has no cycles, every import between wings points down, and no
test module imports another test module."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "seq2seq_cli"

# The wings (subpackages), lowest first. A module may import modules of its own wing and of
# the wings before it in this list, never one after it. The modules at the top of the package
# are the bottom layer, except cli (and __main__, which runs it): the top.
BOTTOM, TOP = "bottom", "cli"
LAYERS = [BOTTOM, "model", "data", "run", "convert", "decode", "documents", "train", "serve", TOP]
# serve sits above the others in LAYERS, but knows nothing of training or export, and only the
# command line starts it (test_serve_is_imported_by_cli_only).
SERVE_MAY_NOT_IMPORT = ("train", "convert")


def package_modules() -> dict[str, Path]:
    """{dotted name inside the package: file} for every module, wings included: "config",
    "model.transformer", "model.__init__"."""
    root = REPO / PACKAGE
    return {".".join(path.relative_to(root).with_suffix("").parts): path for path in sorted(root.rglob("*.py"))}


def _module_named(parts: list[str], modules: set[str]) -> str | None:
    """The package module a dotted name inside the package names: its longest prefix that is a
    module, a package standing for its __init__."""
    for end in range(len(parts), -1, -1):
        name = ".".join(parts[:end])
        for module in (name, f"{name}.__init__" if name else "__init__"):
            if module in modules:
                return module
    return None


def _imported_modules(tree: ast.AST, name: str, modules: set[str]) -> set[str]:
    """Package modules named by the imports anywhere in module `name`, lazy ones inside
    functions included, relative ones resolved against the module's package."""
    package = name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package):
                    continue
                base = [PACKAGE, *package[: len(package) - node.level + 1], *(node.module.split(".") if node.module else [])]
            else:
                base = (node.module or "").split(".")
            # `from seq2seq_cli.run import checkpoint` names run.checkpoint, a module;
            # `from seq2seq_cli.run.checkpoint import save_checkpoint` names run.checkpoint too.
            names = [[*base, alias.name] for alias in node.names]
        else:
            continue
        for parts in names:
            if parts[0] == PACKAGE:
                module = _module_named(parts[1:], modules)
                if module is not None:
                    found.add(module)
    return found


def without_type_checking_blocks(tree: ast.Module) -> ast.Module:
    """`tree` without its `if TYPE_CHECKING:` blocks: imports for annotations alone, which never run."""
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                setattr(node, field, [n for n in block if not (isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")])
    return tree


def import_graph(runtime_only: bool = False) -> dict[str, set[str]]:
    """{module: package modules it imports} for every module of the package; `runtime_only`:
    leaving out the imports made for annotations only (under `if TYPE_CHECKING:`)."""
    files = package_modules()

    def tree(path: Path) -> ast.Module:
        parsed = ast.parse(path.read_text(encoding="utf-8"))
        return without_type_checking_blocks(parsed) if runtime_only else parsed

    return {name: _imported_modules(tree(path), name, set(files)) - {name}
            for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, each module importing the next (first == last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()  # graph values are a node's predecessors
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))
    return None


def wing(module: str) -> str:
    """The layer a module belongs to: its wing; BOTTOM for the modules at the top of the package,
    TOP for cli (and __main__, which runs it)."""
    if "." in module:
        return module.split(".")[0]
    return TOP if module in ("cli", "__main__") else BOTTOM


def upward_imports(graph: dict[str, set[str]], layers: list[str]) -> list[str]:
    """Every import of a module in a higher layer than the importer's, or of a wing the layer
    list lacks, as "importer (wing) -> imported (wing)"."""
    rank = {layer: i for i, layer in enumerate(layers)}
    found = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            low, high = wing(importer), wing(target)
            if low not in rank or high not in rank or rank[high] > rank[low]:
                found.append(f"{importer} ({low}) -> {target} ({high})")
    return found


def test_a_cycle_is_reported_in_import_order():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"])
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_an_upward_import_is_reported():
    layers = [BOTTOM, "model", "decode", TOP]
    assert upward_imports({"config": {"ids"}, "model.transformer": {"config", "model.masks"},
                           "decode.search": {"model.transformer"}, "cli": {"decode.search", "config"}}, layers) == []
    assert upward_imports({"model.transformer": {"decode.search"}}, layers) == [
        "model.transformer (model) -> decode.search (decode)"]
    assert upward_imports({"config": {"model.transformer"}}, layers) == ["config (bottom) -> model.transformer (model)"]
    assert upward_imports({"decode.search": {"cli"}}, layers) == ["decode.search (decode) -> cli (cli)"]
    assert upward_imports({"cli": {"serve.app"}}, layers) == ["cli (cli) -> serve.app (serve)"]  # a wing not in the list


def test_imports_name_modules_relative_ones_included():
    modules = {"__init__", "config", "model.__init__", "model.transformer", "model.masks", "run.__init__", "run.checkpoint"}
    code = ("from seq2seq_cli.run import checkpoint\nfrom seq2seq_cli.config import X\nimport seq2seq_cli.model.masks\n"
            "def f():\n    from ..run.checkpoint import load\n    from . import masks\n    from .. import config\n")
    assert _imported_modules(ast.parse(code), "model.transformer", modules) == {"run.checkpoint", "config", "model.masks"}
    assert _imported_modules(ast.parse("from seq2seq_cli import model"), "config", modules) == {"model.__init__"}


def test_the_import_graph_is_read():
    graph = import_graph()
    assert {"model.kv_cache", "model.masks", "ids"} <= graph["model.transformer"]
    assert "model.transformer" in graph["decode.search"]
    assert "data.formats" in graph["data.tokenizer"]  # lazy, inside a function
    assert {"run.checkpoint", "run.runlock", "train.distributed"} <= graph["train.setup"]  # from seq2seq_cli.run import ...
    assert "run.__init__" not in graph["train.setup"]
    assert {"decode.loading", "convert.exporting", "train.loop"} <= graph["cli.__init__"]
    assert "cli.__init__" in graph["__main__"]
    assert {"config", "__init__", "model.__init__"} <= set(graph)  # bottom modules, and a wing's __init__
    # every module of every wing is in the graph the cycle and layer tests walk, convert/ included
    assert set(graph) == {".".join(p.relative_to(REPO / PACKAGE).with_suffix("").parts)
                          for p in (REPO / PACKAGE).rglob("*.py")}
    assert {"convert.hf", "convert.export", "convert.__init__"} <= set(graph)


def test_type_checking_imports_are_left_out_of_the_runtime_graph():
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from seq2seq_cli.model.transformer import X\n"
    modules = {"model.transformer", "model.step"}
    assert _imported_modules(ast.parse(code), "model.step", modules) == {"model.transformer"}
    assert _imported_modules(without_type_checking_blocks(ast.parse(code)), "model.step", modules) == set()


def test_no_import_cycles_among_package_modules():
    """Imports that run: a module importing another for its annotations only (under
    TYPE_CHECKING) makes no cycle; it still counts for the direction of the layers."""
    graph = import_graph(runtime_only=True)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_wing_is_in_the_layer_list():
    wings = {wing(module) for module in import_graph()}
    assert wings == set(LAYERS), f"wings missing from LAYERS: {sorted(wings - set(LAYERS))}"


def test_imports_between_wings_point_down():
    upward = upward_imports(import_graph(), LAYERS)
    assert not upward, "imports of a higher wing (layers, lowest first: " + " < ".join(LAYERS) + "):\n" + "\n".join(upward)


def test_no_test_module_imports_another_test_module():
    offenders = []
    paths = sorted((REPO / "tests").rglob("*.py"))
    assert {p.parent.name for p in paths} >= {"tests", "model", "decode", "serve"}  # every folder, not only the top one
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            where = path.relative_to(REPO / "tests")
            offenders += [f"{where}: {n}" for n in names if n.split(".")[-1].startswith("test_") or n.startswith("tests.")]
    assert not offenders, "test modules importing test modules:\n" + "\n".join(offenders)


def test_serve_is_imported_by_cli_only():
    graph = import_graph()
    importers = sorted(m for m, imported in graph.items() if wing(m) != "serve" and any(wing(t) == "serve" for t in imported))
    assert importers == ["cli.__init__"]
    wrong = sorted(f"{m} -> {t}" for m, imported in graph.items() if wing(m) == "serve"
                   for t in imported if wing(t) in SERVE_MAY_NOT_IMPORT)
    assert not wrong, "serve imports training or export code:\n" + "\n".join(wrong)


def private_imports(files: dict[str, Path]) -> list[str]:
    """Every `from seq2seq_cli.X import _name` of a module of another module's private name."""
    found = []
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                found += [f"{name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_a_private_import_is_reported(tmp_path):
    (tmp_path / "a.py").write_text("from seq2seq_cli.documents.markup import _Builder, Node\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("from seq2seq_cli.documents.markup import Node\nfrom x import _y\n", encoding="utf-8")
    assert private_imports({"a": tmp_path / "a.py", "b": tmp_path / "b.py"}) == [
        "a: from seq2seq_cli.documents.markup import _Builder"]


def test_no_module_imports_another_modules_private_names():
    offenders = private_imports(package_modules())
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


MAX_MODULE_LINES = 400
# Modules still over the limit, each held to its length today so that it can only shrink.
STILL_LONG: dict[str, int] = {}


def test_no_module_is_longer_than_the_limit():
    long = {name: n for name, path in package_modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > STILL_LONG.get(name, MAX_MODULE_LINES)}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_no_module_of_decode_is_about_a_file_format():
    formats = ("markup", "odt", "docx", "docfiles", "sentences", "textfile", "documents", "html")
    assert not [m for m in package_modules() if m.startswith("decode.") and m.split(".")[1] in formats]


MAX_FUNCTION_LINES = 100  # the hard limit; a function over 60 lines is split where that reads better


def test_no_function_is_longer_than_the_hard_limit():
    long = []
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)
