"""docs/architecture.md quotes the code it links to: every `file#Lline` link is followed by
the text of that line, so a link left behind by an edit fails here (`scripts/relink_docs.py`
re-points them)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(\.\./(?P<path>[\w/]+\.py)#L(?P<line>\d+)\) `(?P<code>[^`]+)`")


def test_architecture_links_point_at_the_quoted_code():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    links = list(LINK.finditer(text))
    assert len(links) >= 40
    stale = []
    for m in links:
        lines = (REPO / m["path"]).read_text(encoding="utf-8").splitlines()
        line = int(m["line"])
        if not (1 <= line <= len(lines) and m["code"] in lines[line - 1]):
            stale.append(f"{m['path']}#L{line}: {m['code']}")
    assert not stale, "stale links in docs/architecture.md:\n" + "\n".join(stale)
