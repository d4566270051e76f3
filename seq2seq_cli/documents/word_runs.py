"""A .docx paragraph's runs (WordprocessingML, lxml elements): the run-level work of `docx.py`.

What the runs are (a paragraph's own and those nested in the containers its text flows
through), the cutting of a run holding text and something else (a tab, a break, a drawing)
into runs of one kind each, the runs of a field kept as Word wrote them, a paragraph as a
unit whose nodes are its runs, and the translated words written back into those runs (each
word in the run its source words came from, a run no word is aligned to taken out).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from seq2seq_cli.documents.placing import Node, Unit, word_sources

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
TEXT_TAGS = (W + "t", W + "rPr")  # what a run holding only text holds
BREAKS = frozenset(W + tag for tag in ("br", "cr", "tab", "ptab"))  # what parts the words on its sides
TRANSLATED_FIELDS = frozenset(["HYPERLINK", "FORMTEXT"])  # fields whose result is text Word keeps when it updates
# elements inside a paragraph whose runs are the paragraph's text
CONTAINERS = frozenset(W + tag for tag in ("hyperlink", "ins", "smartTag", "fldSimple", "sdt", "sdtContent",
                                           "customXml", "moveTo", "dir", "bdo"))


def _runs(paragraph: Any) -> list[Any]:
    """The paragraph's runs: its own and those inside CONTAINERS, in order."""
    found: list[Any] = []

    def walk(element: Any) -> None:
        for child in element:
            if child.tag == W + "r":
                found.append(child)
            elif child.tag in CONTAINERS:
                walk(child)

    walk(paragraph)
    return found


def split_runs(paragraph: Any) -> None:
    """Cut each run holding text and something else (a tab, a break, a drawing, a page-break
    marker) into runs of one kind each, in order, each with the run's formatting."""
    for run in _runs(paragraph):
        content = [child for child in run if child.tag != W + "rPr"]
        if all(child.tag == W + "t" for child in content) or not any(child.tag == W + "t" for child in content):
            continue
        segments: list[list[Any]] = []
        for child in content:
            if child.tag == W + "t" and segments and segments[-1][-1].tag == W + "t":
                segments[-1].append(child)
            else:
                segments.append([child])
        properties = run.find(W + "rPr")
        at = run
        for segment in segments[1:]:
            piece = run.makeelement(run.tag, run.attrib)
            if properties is not None:
                piece.append(copy.deepcopy(properties))
            piece.extend(segment)  # moved out of `run`
            at.addnext(piece)
            at = piece


def field_runs(root: Any) -> set[Any]:
    """The runs of `root` that hold a field's code or a result Word writes again when it
    updates fields (all but TRANSLATED_FIELDS'): complex fields (w:fldChar begin, code,
    separate, result, end; nested, and across paragraphs) and simple ones (w:fldSimple)."""
    kept: set[Any] = set()
    stack: list[list[Any]] = []  # per open field: [its code, whether its result has begun]
    for run in root.iter(W + "r"):
        if any(not result or not _translated_field(code) for code, result in stack):
            kept.add(run)
        simple = next(run.iterancestors(W + "fldSimple"), None)
        if simple is not None and not _translated_field(simple.get(W + "instr") or ""):
            kept.add(run)
        for child in run:
            if child.tag == W + "instrText" and stack:
                stack[-1][0] += child.text or ""
            elif child.tag == W + "fldChar":
                kind = child.get(W + "fldCharType")
                if kind == "begin":
                    stack.append(["", False])
                elif kind == "separate" and stack:
                    stack[-1][1] = True
                elif kind == "end" and stack:
                    stack.pop()
    return kept


def _translated_field(code: str) -> bool:
    return (code.split() or [""])[0].upper() in TRANSLATED_FIELDS



def _text_only(run: Any) -> bool:
    return all(child.tag in TEXT_TAGS for child in run)


def _breaks(run: Any) -> bool:
    return any(child.tag in BREAKS for child in run)


@dataclass
class Paragraph:
    paragraph: Any
    unit: Unit
    nodes: list[Node] = field(default_factory=list)
    holders: list[Any] = field(default_factory=list)  # the element each run stood in (the paragraph, a container)


def paragraph_unit(paragraph: Any, kept: set[Any]) -> Paragraph | None:
    """A paragraph as a unit whose nodes are its runs (None: no text to translate). A run that
    is not text (or a field's, in `kept`) is an opaque node; a break parts the words on its
    sides (a space in the unit's text, between the runs)."""
    text, nodes = "", []
    for run in _runs(paragraph):
        if _text_only(run) and run not in kept:
            nodes.append(Node(run, len(text), len(text) + len(run.text)))
            text += run.text
            continue
        node = Node(run, len(text), len(text), opaque=True)
        node.space_before = text[-1:].isspace()
        if text and not node.space_before and _breaks(run):
            text += " "
            node.end = len(text)  # (for now) where the text after it starts
        nodes.append(node)
    for node in nodes:  # whether the source had a space after each opaque run
        if node.opaque:
            node.space_after = text[node.end : node.end + 1].isspace()
            node.end = node.start
    if not text.strip():
        return None
    lead = len(text) - len(text.lstrip())
    core = text.strip()
    for node in nodes:
        node.start = min(max(node.start - lead, 0), len(core))
        node.end = min(max(node.end - lead, node.start), len(core))
    unit = Unit(paragraph, None, text=core, root=Node(None, 0, len(core), children=nodes))
    return Paragraph(paragraph, unit, nodes, [n.element.getparent() for n in nodes])


def _owners(p: Paragraph, spans: list[list[tuple[int, int]]]) -> list[int]:
    """The text run (index into p.nodes) each target word belongs to: the run holding most of
    the source subwords it is aligned to; a word aligned to none, the run of the word before.
    A container (a hyperlink, a smart tag) whose runs no word belongs to takes the words
    aligned to its text where their run keeps another word: its text is translated where it
    stands, not dropped."""
    text_runs = [i for i, n in enumerate(p.nodes) if not n.opaque and n.end > n.start]
    owners: list[int] = []
    for word_spans in spans:
        votes: dict[int, int] = {}
        for a, b in word_spans:
            for i in text_runs:
                if a < p.nodes[i].end and b > p.nodes[i].start:
                    votes[i] = votes.get(i, 0) + 1
                    break
        owners.append(max(votes, key=lambda i: (votes[i], -i)) if votes else (owners[-1] if owners else -1))
    first = next((o for o in owners if o >= 0), text_runs[0] if text_runs else -1)
    owners = [first if o < 0 else o for o in owners]
    containers: dict[int, list[int]] = {}  # id(container) -> its text runs
    for i in text_runs:
        if p.holders[i] is not p.paragraph:
            containers.setdefault(id(p.holders[i]), []).append(i)
    for members in containers.values():
        if not owners or any(o in members for o in owners):
            continue
        lo, hi = p.nodes[members[0]].start, p.nodes[members[-1]].end
        hit = [w for w, ss in enumerate(spans) if any(a < hi and b > lo for a, b in ss)]
        if not hit:
            continue
        stretches = [[hit[0]]]  # the hits in stretches parted by more than two words; the longest taken
        for w in hit[1:]:
            if w - stretches[-1][-1] > 3:
                stretches.append([])
            stretches[-1].append(w)
        longest = max(stretches, key=len)
        for w in range(longest[0], longest[-1] + 1):
            if owners.count(owners[w]) > 1:
                owners[w] = members[0]
    return owners


def _space_before(before: Any, after: Any) -> bool:
    """Whether the space between two runs goes to the end of `before` (else the start of
    `after`): to the run that had a space on that side, else to the less formatted one."""
    if after.text[:1].isspace() or before.text[-1:].isspace():
        return not after.text[:1].isspace()

    def formatting(run: Any) -> int:
        properties = run.rPr
        return 0 if properties is None else len(properties)

    return formatting(before) <= formatting(after)


def _pieces(p: Paragraph, aligned: list[Any]) -> list[list[Any]]:
    """[run index, text (None: a run that is not text)] in output order: each stretch of
    output words that belongs to one run (`_owners`); a run that is not text after the text
    run before it, a break with no space on a side where the source had none."""
    words, seps, spans, _ = word_sources(p.unit, aligned)
    owners = _owners(p, spans)
    pieces: list[list[Any]] = []
    for w, (word, owner) in enumerate(zip(words, owners)):
        if pieces and pieces[-1][0] == owner:
            pieces[-1][1] += seps[w] + word
            continue
        if pieces and seps[w] and _space_before(p.nodes[pieces[-1][0]].element, p.nodes[owner].element):
            pieces[-1][1] += seps[w]
            pieces.append([owner, word])
        else:
            pieces.append([owner, (seps[w] if pieces else "") + word])
    for i, node in enumerate(p.nodes):
        if node.opaque:
            after = max((k for k, (o, _) in enumerate(pieces) if o < i), default=-1)
            pieces.insert(after + 1, [i, None])
    for k, (i, text) in enumerate(pieces):
        if text is None:
            _space(p.nodes[i], pieces[k - 1] if k and pieces[k - 1][1] is not None else None,
                   pieces[k + 1] if k + 1 < len(pieces) and pieces[k + 1][1] is not None else None)
    return pieces


def _space(node: Node, before: list[Any] | None, after: list[Any] | None) -> None:
    """The spaces between a run that is not text and the text pieces `before` and `after` it,
    as the source had them: a space kept on a side that had one; a break (a tab, a line break)
    with none where it had none; another run (a note's mark, a field) that followed its word
    with no space stays glued to it, the space after it instead."""
    brk = _breaks(node.element)
    if before is not None:
        if node.space_before and not before[1][-1:].isspace():
            before[1] += " "
        elif not node.space_before and before[1].endswith(" "):
            before[1] = before[1].rstrip(" ")
            if not brk and after is not None and not after[1][:1].isspace():
                after[1] = " " + after[1]
    if after is not None:
        if node.space_after and not after[1][:1].isspace():
            after[1] = " " + after[1]
        elif not node.space_after and brk:
            after[1] = after[1].lstrip(" ")


def _top(paragraph: Any, run: Any) -> Any:
    """The child of `paragraph` that holds `run` (the run itself, or a container)."""
    while run.getparent() is not paragraph:
        run = run.getparent()
    return run


def render_paragraph(p: Paragraph, aligned: list[Any]) -> None:
    """Write a paragraph's translation into its runs, in output order: a run's words in that
    run, or a copy of it; runs inside a container stay in it, the container holding the
    longest stretch of its runs' words (a stretch apart from it goes into copies of its runs
    beside it, so that the words keep their order). A text run no output word belongs to is
    taken out: no source word stays. What else the paragraph holds after its first run (a
    deletion, a bookmark, a container without text) follows the run or container it followed."""
    pieces = _pieces(p, aligned)
    parent = p.paragraph
    runs = [n.element for n in p.nodes]
    placed_runs = {index for index, _ in pieces}
    for index, node in enumerate(p.nodes):
        if not node.opaque and index not in placed_runs:
            runs[index].getparent().remove(runs[index])
    if not pieces:  # an empty translation, and every run text
        return
    tops = {index: _top(parent, runs[index]) for index in placed_runs}
    groups: list[tuple[Any, list[list[Any]]]] = []  # (top, pieces), consecutive pieces of one top
    for piece in pieces:
        top = tops[piece[0]]
        if groups and groups[-1][0] is top:
            groups[-1][1].append(piece)
        else:
            groups.append((top, [piece]))
    home: dict[int, int] = {}  # id(container) -> the group it holds
    for g, (top, members) in enumerate(groups):
        if top.tag != W + "r" and (id(top) not in home or len(members) > len(groups[home[id(top)]][1])):
            home[id(top)] = g
    placed = {id(top) for top, _ in groups}
    children = list(parent)
    first = min(children.index(top) for top, _ in groups)
    trailing: dict[int, list[Any]] = {}  # id(top) -> what followed it, up to the next top placed
    current = 0
    for child in children[first:]:
        if id(child) in placed:
            current = id(child)
            trailing[current] = []
        else:
            trailing[current].append(child)
        parent.remove(child)
    for index in placed_runs:
        if runs[index].getparent() is not None:
            runs[index].getparent().remove(runs[index])
    order: list[Any] = []
    used: set[int] = set()
    for g, (top, members) in enumerate(groups):
        inside = home.get(id(top)) == g
        if inside:
            order.append(top)
        for index, text in members:
            run = runs[index] if index not in used else copy.deepcopy(runs[index])
            used.add(index)
            if inside:
                p.holders[index].append(run)
            else:
                order.append(run)
            if text is not None:
                run.text = text
        order += trailing.pop(id(top), [])
    for offset, element in enumerate(order):
        parent.insert(first + offset, element)

