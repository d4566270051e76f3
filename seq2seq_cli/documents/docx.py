""".docx documents (python-docx): each paragraph of the body, its tables, headers and footers
translated in context, its runs' formatting (bold, italics) kept on the words aligned to the
run's words. A run holding more than text (a drawing, a field, a tab) is kept as it is,
untranslated, at its aligned place.
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seq2seq_cli.documents.markup import translate_aligned
from seq2seq_cli.documents.placing import Node, Unit, word_sources
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

TEXT_TAGS = ("}t", "}rPr")  # what a run holding only text holds


def text_chars(data: bytes) -> int:
    """Characters of text a .docx holds (what a server's limit counts)."""
    import docx

    return sum(len(p.text) for p in _paragraphs(docx.Document(io.BytesIO(data))))


def _paragraphs(document: Any) -> list[Any]:
    """Every paragraph of the body, its tables (nested ones too), headers and footers."""
    def walk(container: Any) -> list[Any]:
        found = list(container.paragraphs)
        for table in getattr(container, "tables", []):
            for row in table.rows:
                for cell in row.cells:
                    found += walk(cell)
        return found

    found = walk(document)
    for section in document.sections:
        for part in (section.header, section.footer):
            if not part.is_linked_to_previous:
                found += walk(part)
    unique, seen = [], set()
    for p in found:  # a merged cell is met once per cell it spans
        if id(p._p) not in seen:
            seen.add(id(p._p))
            unique.append(p)
    return unique


def _text_only(run: Any) -> bool:
    return all(child.tag.endswith(TEXT_TAGS) for child in run._r)


@dataclass
class _Paragraph:
    paragraph: Any
    unit: Unit
    nodes: list[Node] = field(default_factory=list)


def _docx_unit(paragraph: Any, splitter: Splitter) -> _Paragraph | None:
    """A paragraph as a unit whose nodes are its runs (None: no text to translate)."""
    runs = paragraph.runs
    text, nodes = "", []
    for run in runs:
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
    return _Paragraph(paragraph, unit, nodes)


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
        properties = run._r.rPr
        return 0 if properties is None else len(properties)

    return formatting(before) <= formatting(after)


def _render_paragraph(p: _Paragraph, aligned: list[Any]) -> None:
    """Write a paragraph's translation into its runs: each stretch of output words that belongs
    to one run (`_owners`) in that run, or a copy of it; a run that is not text, where it was
    among the text runs."""
    words, seps, spans, _ = word_sources(p.unit, aligned)
    owners = _owners(p, spans)
    pieces: list[list[Any]] = []  # [node index, text], in output order
    for w, (word, owner) in enumerate(zip(words, owners)):
        if pieces and pieces[-1][0] == owner:
            pieces[-1][1] += seps[w] + word
            continue
        if pieces and seps[w] and _space_before(p.nodes[pieces[-1][0]].element, p.nodes[owner].element):
            pieces[-1][1] += seps[w]
            pieces.append([owner, word])
        else:
            pieces.append([owner, (seps[w] if pieces else "") + word])
    for i, node in enumerate(p.nodes):  # runs that are not text follow the text run before them
        if node.opaque:
            after = max((k for k, (o, _) in enumerate(pieces) if o < i), default=-1)
            pieces.insert(after + 1, [i, None])
    parent = p.paragraph._p
    first = min(parent.index(n.element._r) for n in p.nodes)
    for node in p.nodes:
        parent.remove(node.element._r)
    used: set[int] = set()
    for offset, (index, text) in enumerate(pieces):
        run = p.nodes[index].element
        element = run._r if index not in used else copy.deepcopy(run._r)
        used.add(index)
        parent.insert(first + offset, element)
        if text is not None:
            type(run)(element, run._parent).text = text


def translate_docx(translator: Translator, data: bytes, splitter: Splitter, name: str = "the file") -> bytes:
    """A .docx translated paragraph by paragraph, sentences batched across the document."""
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises many kinds on a broken package
        raise UserError(f"{name}: not a readable .docx file ({type(exc).__name__}: {exc})") from None
    units = [u for u in (_docx_unit(p, splitter) for p in _paragraphs(document)) if u is not None]
    sentences = [s for u in units for s in (u.unit.split.sentences if u.unit.split else [])]
    aligned = translate_aligned(translator, sentences)
    k = 0
    for u in units:
        n = len(u.unit.split.sentences) if u.unit.split else 0
        _render_paragraph(u, aligned[k : k + n])
        k += n
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
