"""Placing translated words back into a unit's inline markup (HTML/XML in `markup.py`, .docx
runs, .odt spans): a unit of text with its inline elements (`Node`s), the translated sentences
aligned to its source words (`Aligned`), and `render_unit`, which puts each element around the
target words aligned to the source words it enclosed (see `markup.py` for the rules).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from seq2seq_cli.documents.sentences import Split


@dataclass
class Node:
    """An inline element of a unit: its characters [start, end) in the unit's text, and its
    inline children; `opaque` ones (no text of theirs translated) have start == end."""

    element: Any
    start: int
    end: int = -1
    opaque: bool = False
    children: list[Node] = field(default_factory=list)
    space_before: bool = False  # an opaque element the source parted from the words before it by a space
    space_after: bool = False  # ... and from the words after it: the output keeps the space there


@dataclass
class Unit:
    """The text a container element holds directly between two of its block children (or its
    start or end), with the inline elements there."""

    parent: Any
    anchor: Any  # the block child whose tail starts the unit; None: the parent's text
    lead: str = ""  # whitespace the unit starts with, kept
    trail: str = ""  # whitespace it ends with, kept
    text: str = ""  # its text, whitespace collapsed, tags taken out
    root: Node = field(default_factory=lambda: Node(None, 0))
    split: Split | None = None


@dataclass
class Aligned:
    """A translated sentence as words, each with the source subwords its tokens attend to most."""

    words: list[str]
    links: list[list[int]]  # per word: indices into `sources`
    sources: list[tuple[int, int]]  # character span of each source subword in the sentence
    pieces: int = 1  # the pieces the sentence was translated in (more than one: too long for the model)


def word_sources(unit: Unit, aligned: list[Aligned]) -> tuple[list[str], list[str], list[list[tuple[int, int]]], list[int]]:
    """The unit's target words, the separator before each, the source spans (unit characters)
    each is aligned to, and each word's sentence."""
    assert unit.split is not None
    words: list[str] = []
    seps: list[str] = []
    spans: list[list[tuple[int, int]]] = []
    sentence_of: list[int] = []
    for k, ((start, _), a) in enumerate(zip(unit.split.spans(), aligned)):
        for j, (word, links) in enumerate(zip(a.words, a.links)):
            seps.append(" " if j else (unit.split.gaps[k] if words else ""))
            words.append(word)
            spans.append([(start + a.sources[i][0], start + a.sources[i][1]) for i in links if 0 <= i < len(a.sources)])
            sentence_of.append(k)
    return words, seps, spans, sentence_of


def _target_range(node: Node, unit: Unit, spans: list[list[tuple[int, int]]], sentence_of: list[int]) -> tuple[int, int]:
    """The words [s, e) a node encloses in the translation (e == s: a slot before word s)."""
    assert unit.split is not None
    n, length = len(spans), max(1, len(unit.text))
    sentences = unit.split.spans()
    covered = {k for k, (a, b) in enumerate(sentences) if a < max(node.end, node.start + 1) and b > node.start}
    if not covered and node.end <= node.start:  # an element between two sentences goes with the one after it
        covered = {k for k, (a, _) in enumerate(sentences) if a >= node.start}
        covered = {min(covered)} if covered else covered
    if node.end > node.start:
        hit = [w for w, ss in enumerate(spans)
               if sentence_of[w] in covered and any(a < node.end and b > node.start for a, b in ss)]
        if hit:
            return _densest(hit)
        s = min(n, int(node.start / length * n))
        return s, min(n, max(s + 1, round(node.end / length * n)))
    if node.start >= len(unit.text):
        return n, n
    after = [w for w, ss in enumerate(spans) if sentence_of[w] in covered and any(a >= node.start for a, _ in ss)]
    if after:
        return min(after), min(after)
    s = round(node.start / length * n)
    return s, s


def _densest(hit: list[int], gap: int = 2) -> tuple[int, int]:
    """The words [s, e) of the run of `hit` (sorted word indices) holding the most of them, runs
    parted where more than `gap` words lie between two hits: a stray alignment far off does not
    stretch a tag over the words between."""
    runs = [[hit[0]]]
    for w in hit[1:]:
        if w - runs[-1][-1] > gap + 1:
            runs.append([])
        runs[-1].append(w)
    best = max(runs, key=len)
    return best[0], best[-1] + 1


@dataclass
class _Placed:
    node: Node
    start: int
    end: int
    children: list[_Placed]


def _place(nodes: list[Node], lo: int, hi: int, where: Callable[[Node], tuple[int, int]]) -> list[_Placed]:
    """Target ranges of sibling nodes inside [lo, hi], sorted and made not to overlap."""
    placed = []
    for node in nodes:
        s, e = where(node)
        s, e = min(max(s, lo), hi), min(max(e, lo), hi)
        placed.append(_Placed(node, s, max(s, e), []))
    placed.sort(key=lambda p: (p.start, p.end > p.start))  # stable: source order among equals
    cursor = lo
    for p in placed:
        p.start = max(p.start, cursor)
        p.end = max(p.end, p.start)
        cursor = p.end
        p.children = _place(p.node.children, p.start, p.end, where)
    return placed


def _emit(lo: int, hi: int, kids: list[_Placed], words: list[str], seps: list[str]) -> list[Any]:
    """The content of [lo, hi): strings and (node, content) pairs, spaces outside the tags."""
    out: list[Any] = []
    k, i = lo, 0
    while True:
        if lo < k < hi:
            out.append(seps[k])
        moved = False
        while i < len(kids) and kids[i].start == k:
            kid = kids[i]
            i += 1
            out.append((kid.node, _emit(kid.start, kid.end, kid.children, words, seps)))
            if kid.end > k:
                k, moved = kid.end, True
                break
        if moved:
            continue
        if k >= hi:
            return out
        out.append(words[k])
        k += 1


def _write(parent: Any, anchor: Any, old: list[Any], content: list[Any]) -> None:
    """Put `content` (strings and (node, content)) into `parent` after `anchor` (None: at its
    start), in place of the elements `old`; an opaque element spaced from its words in the
    source is spaced from them in the output."""
    for el in old:
        parent.remove(el)
    index = 0 if anchor is None else parent.index(anchor) + 1
    texts: list[str] = []
    last: Any = anchor
    last_node: Node | None = None
    for item in content + [None]:
        if isinstance(item, str):
            texts.append(item)
            continue
        joined = "".join(texts)
        if last_node is not None and last_node.space_after and joined and not joined[0].isspace():
            joined = " " + joined
        if item is not None and item[0].space_before and joined and not joined[-1].isspace():
            joined += " "
        if last is None:
            parent.text = joined or None
        else:
            last.tail = joined or None
        texts = []
        if item is None:
            break
        node, inner = item
        if not node.opaque:
            for child in list(node.element):
                node.element.remove(child)
            _write(node.element, None, [], inner)
        parent.insert(index, node.element)
        index += 1
        last, last_node = node.element, node


def render_unit(unit: Unit, aligned: list[Aligned]) -> None:
    """Write a unit's translation (one `Aligned` per sentence of its split) into the tree."""
    words, seps, spans, sentence_of = word_sources(unit, aligned)
    placed = _place(unit.root.children, 0, len(words), lambda node: _target_range(node, unit, spans, sentence_of))
    content = [unit.lead, *_emit(0, len(words), placed, words, seps), unit.trail]
    _write(unit.parent, unit.anchor, [n.element for n in unit.root.children], content)


# ---------------------------------------------------------------------------------- documents


