""".docx documents (python-docx): every paragraph translated in context, its runs' formatting
(bold, italics) kept on the words aligned to the run's words.

The paragraphs are those of every story of the package: the body (its tables and content
controls, nested ones too), every header and footer (first-page and even-page ones too), the
footnotes, endnotes and comments, and text boxes. A paragraph's runs are its own and those
nested in the containers a paragraph's text flows through (hyperlinks, tracked insertions,
smart tags, simple fields, inline content controls, custom XML, moved text), each translated
where it stands; deleted text (tracked deletions) is left as it is. A run holding more than
text (a drawing, a field's code, a tab) is kept as it is, untranslated, at its aligned place.

The package is unpacked within the limits of `archive.py` first and python-docx is given a
copy whose directory tells the truth, so that nothing is inflated past them.
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents.aligning import translate_aligned
from seq2seq_cli.documents.archive import repack, unpack
from seq2seq_cli.documents.placing import Node, Unit, word_sources
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
TEXT_TAGS = (W + "t", W + "rPr")  # what a run holding only text holds
# elements inside a paragraph whose runs are the paragraph's text
CONTAINERS = frozenset(W + tag for tag in ("hyperlink", "ins", "smartTag", "fldSimple", "sdt", "sdtContent",
                                           "customXml", "moveTo", "dir", "bdo"))
STORY_TYPES = frozenset("application/vnd.openxmlformats-officedocument.wordprocessingml." + kind + "+xml"
                        for kind in ("header", "footer", "footnotes", "endnotes", "comments"))


def _load(data: bytes, name: str) -> Any:
    import docx

    entries = unpack(name, data, DocumentFormat.docx)
    try:
        return docx.Document(io.BytesIO(repack(entries)))
    except Exception as exc:  # python-docx raises many kinds on a broken package
        reason = (str(exc).splitlines() or [""])[0]
        raise UserError(f"{name}: not a readable .docx file ({type(exc).__name__}: {reason})") from None


@dataclass
class _Story:
    root: Any  # the element holding the story's paragraphs
    part: Any = None  # a part python-docx keeps as bytes: written back from `root`


def _stories(document: Any) -> list[_Story]:
    """The body, then every header, footer, footnotes, endnotes and comments part."""
    from docx.oxml.parser import parse_xml

    stories = [_Story(document.element.body)]
    for part in document.part.package.iter_parts():
        if part.content_type not in STORY_TYPES:
            continue
        element = getattr(part, "element", None)
        stories.append(_Story(element) if element is not None else _Story(parse_xml(part.blob), part))
    return stories


def _paragraphs(stories: list[_Story]) -> list[Any]:
    """Every paragraph (w:p) of the stories, in document order."""
    return [p for story in stories for p in story.root.iter(W + "p")]


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


def text_chars(data: bytes, name: str = "the file") -> int:
    """Characters of text a .docx holds (what a server's limit counts)."""
    paragraphs = _paragraphs(_stories(_load(data, name)))
    return sum(len(r.text) for p in paragraphs for r in _runs(p) if _text_only(r))


def _text_only(run: Any) -> bool:
    return all(child.tag in TEXT_TAGS for child in run)


@dataclass
class _Paragraph:
    paragraph: Any
    unit: Unit
    nodes: list[Node] = field(default_factory=list)
    holders: list[Any] = field(default_factory=list)  # the element each run stood in (the paragraph, a container)


def _docx_unit(paragraph: Any, splitter: Splitter) -> _Paragraph | None:
    """A paragraph as a unit whose nodes are its runs (None: no text to translate)."""
    text, nodes = "", []
    for run in _runs(paragraph):
        if _text_only(run):
            nodes.append(Node(run, len(text), len(text) + len(run.text)))
            text += run.text
        else:
            nodes.append(Node(run, len(text), len(text), opaque=True))
    if not text.strip():
        return None
    lead = len(text) - len(text.lstrip())
    core = text.strip()
    for node in nodes:
        node.start = min(max(node.start - lead, 0), len(core))
        node.end = min(max(node.end - lead, node.start), len(core))
    unit = Unit(paragraph, None, text=core, root=Node(None, 0, len(core), children=nodes))
    unit.split = splitter.split(core)
    return _Paragraph(paragraph, unit, nodes, [n.element.getparent() for n in nodes])


def _owners(p: _Paragraph, spans: list[list[tuple[int, int]]]) -> list[int]:
    """The text run (index into p.nodes) each target word belongs to: the run holding most of
    the source subwords it is aligned to; a word aligned to none, the run of the word before."""
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
    return [first if o < 0 else o for o in owners]


def _space_before(before: Any, after: Any) -> bool:
    """Whether the space between two runs goes to the end of `before` (else the start of
    `after`): to the run that had a space on that side, else to the less formatted one."""
    if after.text[:1].isspace() or before.text[-1:].isspace():
        return not after.text[:1].isspace()

    def formatting(run: Any) -> int:
        properties = run.rPr
        return 0 if properties is None else len(properties)

    return formatting(before) <= formatting(after)


def _pieces(p: _Paragraph, aligned: list[Any]) -> list[list[Any]]:
    """[run index, text (None: a run that is not text)] in output order: each stretch of
    output words that belongs to one run (`_owners`); a run that is not text after the text
    run before it."""
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
    return pieces


def _top(paragraph: Any, run: Any) -> Any:
    """The child of `paragraph` that holds `run` (the run itself, or a container)."""
    while run.getparent() is not paragraph:
        run = run.getparent()
    return run


def _render_paragraph(p: _Paragraph, aligned: list[Any]) -> None:
    """Write a paragraph's translation into its runs, in output order: a run's words in that
    run, or a copy of it; runs inside a container stay in it, the container holding the
    longest stretch of its runs' words (a stretch apart from it goes into copies of its runs
    beside it, so that the words keep their order). What else the paragraph holds after its
    first run (a deletion, a bookmark, a container without text) follows the run or container
    it followed."""
    pieces = _pieces(p, aligned)
    parent = p.paragraph
    runs = [n.element for n in p.nodes]
    if not pieces:  # an empty translation, and every run text
        for run in runs:
            run.getparent().remove(run)
        return
    tops = [_top(parent, r) for r in runs]
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
    for index in {index for index, _ in pieces}:
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


def translate_docx(translator: Translator, data: bytes, splitter: Splitter, name: str = "the file",
                   cut: list[int] | None = None) -> bytes:
    """A .docx translated paragraph by paragraph, sentences batched across the document (the
    indices of those translated in pieces appended to `cut` when given)."""
    document = _load(data, name)
    stories = _stories(document)
    units = [u for u in (_docx_unit(p, splitter) for p in _paragraphs(stories)) if u is not None]
    sentences = [s for u in units for s in (u.unit.split.sentences if u.unit.split else [])]
    aligned = translate_aligned(translator, sentences)
    if cut is not None:
        cut.extend(i for i, a in enumerate(aligned) if a.pieces > 1)
    k = 0
    for u in units:
        n = len(u.unit.split.sentences) if u.unit.split else 0
        _render_paragraph(u, aligned[k : k + n])
        k += n
    from docx.opc.oxml import serialize_part_xml

    for story in stories:
        if story.part is not None:
            story.part._blob = serialize_part_xml(story.root)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
