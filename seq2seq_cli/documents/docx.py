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

The run-level work (cutting runs, fields kept, placing words into runs) is `word_runs.py`.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents.aligning import translate_aligned
from seq2seq_cli.documents.archive import Entry, repack, unpack
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.word_runs import W, field_runs, paragraph_unit, render_paragraph, split_runs
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

log = logging.getLogger("seq2seq.documents")

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


def _prepare(document: Any) -> tuple[list[_Story], list[Any], set[Any]]:
    """The stories, their paragraphs (runs cut by `split_runs`) and the runs kept for fields."""
    stories = _stories(document)
    paragraphs = _paragraphs(stories)
    for paragraph in paragraphs:
        split_runs(paragraph)
    kept: set[Any] = set()
    for story in stories:
        kept |= field_runs(story.root)
    return stories, paragraphs, kept


def text_chars(data: bytes, name: str = "the file") -> int:
    """Characters of text a .docx holds to translate (what a server's limit counts)."""
    _, paragraphs, kept = _prepare(_load(data, name))
    return sum(len(u.unit.text) for u in (paragraph_unit(p, kept) for p in paragraphs) if u is not None)


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
    units = [u for u in (paragraph_unit(p, kept) for p in paragraphs) if u is not None]
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
        render_paragraph(u, aligned[k : k + n])
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
