""".docx documents (python-docx): every paragraph translated in context, its runs' formatting
(bold, italics) kept on the words aligned to the run's words.

The paragraphs are those of every story of the package: the body (its tables and content
controls, nested ones too), every header and footer (first-page and even-page ones too), the
footnotes, endnotes and comments, and text boxes. A paragraph's runs are its own and those
nested in the containers a paragraph's text flows through (hyperlinks, tracked insertions,
smart tags, simple fields, inline content controls, custom XML, moved text), each translated
where it stands; deleted text (tracked deletions) is left as it is. A run holding text and
something else (a tab, a line break, a drawing, Word's page-break marker) is first cut into runs
of one kind each, with its formatting: its text is translated, the rest kept as it is at its
aligned place (a break parts the words on its sides). A field's code and its result are kept as
Word wrote them (Word writes a result again when it updates fields: page numbers, dates, a table
of contents), except the text of a hyperlink field. Every source word is replaced: a run no
output word is aligned to is emptied (taken out), and one line on stderr names the paragraphs
that keep text untranslated (a field's result).

The package is unpacked within the limits of `archive.py` first and python-docx is given a
copy whose directory tells the truth, so that nothing is inflated past them.
"""

from __future__ import annotations

import copy
import io
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents.aligning import translate_aligned
from seq2seq_cli.documents.archive import Entry, repack, unpack
from seq2seq_cli.documents.placing import Node, Unit, word_sources
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

log = logging.getLogger("seq2seq.documents")

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
TEXT_TAGS = (W + "t", W + "rPr")  # what a run holding only text holds
BREAKS = frozenset(W + tag for tag in ("br", "cr", "tab", "ptab"))  # what parts the words on its sides
TRANSLATED_FIELDS = frozenset(["HYPERLINK", "FORMTEXT"])  # fields whose result is text Word keeps when it updates
# elements inside a paragraph whose runs are the paragraph's text
CONTAINERS = frozenset(W + tag for tag in ("hyperlink", "ins", "smartTag", "fldSimple", "sdt", "sdtContent",
                                           "customXml", "moveTo", "dir", "bdo"))
STORY_TYPES = frozenset("application/vnd.openxmlformats-officedocument.wordprocessingml." + kind + "+xml"
                        for kind in ("header", "footer", "footnotes", "endnotes", "comments"))



def _load(data: bytes, name: str) -> Any:
    """The document python-docx reads from `data`; a UserError naming the file and what is
    wrong with it (a part that is not well-formed XML, a part its relationships name missing)."""
    import docx

    entries = unpack(name, data, DocumentFormat.docx)
    try:
        document = docx.Document(io.BytesIO(repack(entries)))
    except Exception as exc:  # python-docx raises many kinds on a broken package
        raise UserError(f"{name}: not a readable .docx file ({_broken(entries, exc)})") from None
    body = document.element.find(W + "body")
    if document.element.tag != W + "document" or body is None:
        raise UserError(f"{name}: not a readable .docx file ({str(document.part.partname).lstrip('/')} holds no "
                        "document body)")
    return document


def _broken(entries: list[Entry], exc: Exception) -> str:
    """What python-docx's exception `exc` says is wrong with a package, in words."""
    from lxml import etree

    if isinstance(exc, etree.XMLSyntaxError):
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        for entry in entries:
            if entry.info.filename.endswith((".xml", ".rels")):
                try:
                    etree.fromstring(entry.data, parser)
                except etree.XMLSyntaxError as found:
                    return f"{entry.info.filename} is not well-formed XML: {found.msg}"
        return f"a part is not well-formed XML: {exc.msg}"
    said = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    said = (said.splitlines() or [""])[0]
    if missing := re.fullmatch(r"There is no item named '(.*)' in the archive", said):
        return f"damaged: its relationships name {missing.group(1)}, which it does not hold"
    if missing := re.fullmatch(r"no content type for partname '/?(.*)' in \[Content_Types\]\.xml", said):
        return f"damaged: [Content_Types].xml gives no content type for {missing.group(1)}"
    if "officeDocument" in said and said.startswith("no relationship of type"):
        return "damaged: _rels/.rels names no main document"
    return f"damaged: {said}" if said else f"damaged: {type(exc).__name__}"


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


def _split_runs(paragraph: Any) -> None:
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


def _field_runs(root: Any) -> set[Any]:
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


def _prepare(document: Any) -> tuple[list[_Story], list[Any], set[Any]]:
    """The stories, their paragraphs (runs cut by `_split_runs`) and the runs kept for fields."""
    stories = _stories(document)
    paragraphs = _paragraphs(stories)
    for paragraph in paragraphs:
        _split_runs(paragraph)
    kept: set[Any] = set()
    for story in stories:
        kept |= _field_runs(story.root)
    return stories, paragraphs, kept


def text_chars(data: bytes, name: str = "the file") -> int:
    """Characters of text a .docx holds to translate (what a server's limit counts)."""
    _, paragraphs, kept = _prepare(_load(data, name))
    return sum(len(u.unit.text) for u in (_docx_unit(p, kept) for p in paragraphs) if u is not None)


def _text_only(run: Any) -> bool:
    return all(child.tag in TEXT_TAGS for child in run)


def _breaks(run: Any) -> bool:
    return any(child.tag in BREAKS for child in run)


@dataclass
class _Paragraph:
    paragraph: Any
    unit: Unit
    nodes: list[Node] = field(default_factory=list)
    holders: list[Any] = field(default_factory=list)  # the element each run stood in (the paragraph, a container)


def _docx_unit(paragraph: Any, kept: set[Any]) -> _Paragraph | None:
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
    return _Paragraph(paragraph, unit, nodes, [n.element.getparent() for n in nodes])


def _owners(p: _Paragraph, spans: list[list[tuple[int, int]]]) -> list[int]:
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


def _pieces(p: _Paragraph, aligned: list[Any]) -> list[list[Any]]:
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


def _render_paragraph(p: _Paragraph, aligned: list[Any]) -> None:
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


def _left_text(paragraph: Any, translated: set[Any], kept: set[Any]) -> tuple[str, bool]:
    """The text a paragraph keeps untranslated: that of its runs not in `translated` (a
    field's, or in an element this module does not read), not deleted text nor that of a
    paragraph inside it (a text box's, translated on its own); and whether all of it is a
    field's (its runs in `kept`)."""
    left, fields = [], True
    for t in paragraph.iter(W + "t"):
        run = t.getparent()
        inside = next(t.iterancestors(W + "p", W + "del", W + "moveFrom"), None)
        if inside is paragraph and run not in translated and (t.text or "").strip():
            left.append(t.text or "")
            fields = fields and run in kept
    return "".join(left), fields


def _describe_left(name: str, left: list[tuple[str, bool]]) -> str:
    """The one warning of a document whose paragraphs keep text untranslated."""
    sample = " ".join(left[0][0].split())
    sample = sample if len(sample) <= 40 else sample[:39] + "…"
    why = ("fields' results, which Word writes again when it updates fields" if all(f for _, f in left)
           else "fields' results, or text in an element this tool does not translate")
    return f'warning: {name}: {len(left)} paragraph(s) keep text untranslated ({why}), the first: "{sample}"'


def translate_docx(translator: Translator, data: bytes, splitter: Splitter, name: str = "the file",
                   cut: list[int] | None = None) -> bytes:
    """A .docx translated paragraph by paragraph, sentences batched across the document (the
    indices of those translated in pieces appended to `cut` when given). A paragraph that
    keeps text untranslated (a field's result) is named in one warning."""
    document = _load(data, name)
    stories, paragraphs, kept = _prepare(document)
    units = [u for u in (_docx_unit(p, kept) for p in paragraphs) if u is not None]
    translated = {n.element for u in units for n in u.nodes if not n.opaque}
    left = [found for found in (_left_text(p, translated, kept) for p in paragraphs) if any(c.isalpha() for c in found[0])]
    for u in units:
        u.unit.split = splitter.split(u.unit.text)
    sentences = [s for u in units for s in (u.unit.split.sentences if u.unit.split else [])]
    aligned = translate_aligned(translator, sentences)
    if cut is not None:
        cut.extend(i for i, a in enumerate(aligned) if a.pieces > 1)
    k = 0
    for u in units:
        n = len(u.unit.split.sentences) if u.unit.split else 0
        _render_paragraph(u, aligned[k : k + n])
        k += n
    if left:
        log.warning("%s", _describe_left(name, left))
    from docx.opc.oxml import serialize_part_xml

    for story in stories:
        if story.part is not None:
            story.part._blob = serialize_part_xml(story.root)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
