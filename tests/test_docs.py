"""The docs stay true and in their place: docs/architecture.md quotes the code it links to (every
link names a file and the function or class holding the code, and the code quoted after it must
be a line of that definition, so a quote left behind by an edit, or a renamed definition, fails
here); docs/configuration.md lists every key of the config schema; the README stays a page a
newcomer reads in minutes and links every page of docs/."""

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


def test_the_readme_is_one_page_that_links_every_doc():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250, "the README is a newcomer's page; move details to docs/, figures to bench/"
    unlinked = [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_configuration_page_lists_every_config_key():
    """Each section of the schema has a `## section` of docs/configuration.md whose table rows
    name every key (a corpus entry's keys as `train[].KEY` under data)."""
    from seq2seq_cli.config import Config, CorpusConfig, DistillConfig

    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    sections = {"top level": Config, **{name: Config.model_fields[name].annotation for name in
                                         ("data", "tokenizer", "model", "train", "decode")}, "distill": DistillConfig}
    missing = []
    for title, schema in sections.items():
        part = re.split(r"(?im)^## " + re.escape(title) + r"\s*$", text)[1].split("\n## ", 1)[0]
        listed = {key for row in re.findall(r"^\| (`[^|]+`) \|", part, flags=re.M) for key in re.findall(r"`([^`]+)`", row)}
        keys = set(schema.model_fields) | ({f"train[].{k}" for k in CorpusConfig.model_fields} if title == "data" else set())
        missing += [f"{title}: {key}" for key in sorted(keys - listed)]
    assert not missing, "config keys docs/configuration.md does not list:\n" + "\n".join(missing)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"(?ms)^```.*?^```", "", text), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_between_the_docs_resolve():
    """Every relative link of the README, bench/README.md and docs/*.md names a file that exists,
    and its #anchor a heading of that file, so moving a section cannot strand its links."""
    pages = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
