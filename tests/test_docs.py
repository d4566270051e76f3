"""docs/architecture.md quotes the code it links to: every link names a file and the function
or class holding the code, and the code quoted after it must be a line of that definition, so
a quote left behind by an edit, or a renamed definition, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[\w/]+\.py `(?P<name>[\w.]+)`\]\(\.\./(?P<path>[\w/]+\.py)\) `(?P<code>[^`]+)`")


def definition_source(path: Path, qualname: str) -> str | None:
    """The source text of function/class `qualname` (e.g. "MultiHeadAttention.forward") in a file."""
    source = path.read_text(encoding="utf-8")
    node: ast.AST = ast.parse(source)
    for part in qualname.split("."):
        found = [c for c in ast.iter_child_nodes(node)
                 if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and c.name == part]
        if not found:
            return None
        node = found[0]
    return ast.get_source_segment(source, node)


def test_architecture_links_point_at_the_quoted_code():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    links = list(LINK.finditer(text))
    assert len(links) >= 40
    assert not re.search(r"\.py#L\d+", text), "links point at names, not line numbers"
    stale = []
    for m in links:
        body = definition_source(REPO / m["path"], m["name"])
        if body is None or m["code"] not in body:
            stale.append(f"{m['path']} {m['name']}: {m['code']}")
    assert not stale, "stale links in docs/architecture.md:\n" + "\n".join(stale)
