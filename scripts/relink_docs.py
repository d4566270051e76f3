"""Update the line numbers of docs/architecture.md's code links after the code moved.

Each link `[file:N](../path#LN) `code`` is re-pointed at the line of `path` that contains
`code`; when the quoted code occurs on several lines, the occurrence nearest the old line is
kept. Run: .venv/bin/python scripts/relink_docs.py  (tests/test_docs.py checks the result).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LINK = re.compile(r"\[(?P<name>[\w.]+):\d+\]\(\.\./(?P<path>[\w/]+\.py)#L(?P<line>\d+)\) `(?P<code>[^`]+)`")


def relink(doc: Path, repo: Path) -> list[str]:
    """Rewrite `doc` in place; -> the quoted code that no longer occurs anywhere."""
    missing: list[str] = []

    def fix(m: re.Match) -> str:
        lines = (repo / m["path"]).read_text(encoding="utf-8").splitlines()
        hits = [i + 1 for i, line in enumerate(lines) if m["code"] in line]
        if not hits:
            missing.append(f"{m['path']}: {m['code']}")
            return m.group(0)
        n = min(hits, key=lambda h: abs(h - int(m["line"])))
        return f"[{m['name']}:{n}](../{m['path']}#L{n}) `{m['code']}`"

    doc.write_text(LINK.sub(fix, doc.read_text(encoding="utf-8")), encoding="utf-8")
    return missing


def main() -> None:
    repo = Path(__file__).resolve().parents[1]
    missing = relink(repo / "docs" / "architecture.md", repo)
    for item in missing:
        print(f"not found, edit the doc by hand: {item}", file=sys.stderr)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
