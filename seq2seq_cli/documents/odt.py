"""OpenDocument text (.odt) translated: each paragraph and heading (text:p, text:h: in the body,
tables, lists, notes, frames, headers and footers) in context, its inline spans kept around
the words aligned to the words they enclosed.

An .odt is a zip; its text is content.xml (headers and footers: styles.xml's master pages),
read and written with lxml. A paragraph is a unit of `markup.py`: its text: spans
(`text:span`, links, `text:meta`) are inline elements, placed by cross-attention alignment and
nested as before; every other element (a space `text:s`, `text:tab`, `text:line-break`, a
frame, a field, a note, a bookmark) is kept as it is, untranslated, before the word aligned
to the one after it. A paragraph inside a note or a frame is a unit of its own. The zip is
unpacked within the limits of `archive.py`; its other entries (styles, pictures, manifest,
settings) are written back as they were, the mimetype first and stored, as the format asks.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents.aligning import translate_aligned
from seq2seq_cli.documents.archive import MIMETYPE, Entry, unpack
from seq2seq_cli.documents.markup import INTERNAL_SUBSET, UnitBuilder, finish_unit
from seq2seq_cli.documents.placing import Node, Unit, render_unit
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
PARTS = {"content.xml": OFFICE + "body", "styles.xml": OFFICE + "master-styles"}  # where each part's text is
PARAGRAPHS = (TEXT + "p", TEXT + "h")
INLINE = frozenset(TEXT + tag for tag in ("span", "a", "meta"))  # translated, kept around their words
BREAKS = frozenset(TEXT + tag for tag in ("s", "tab", "line-break"))  # kept; they part words
SKIPPED = frozenset([TEXT + "tracked-changes"])  # paragraphs inside are not translated (deleted text)


def _read(data: bytes, name: str) -> tuple[list[Entry], dict[str, Any]]:
    """The zip's entries (unpacked within the limits of `archive.py`) and its parts holding text, parsed."""
    from lxml import etree

    entries = unpack(name, data, DocumentFormat.odt)
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    trees: dict[str, Any] = {}
    for entry in entries:
        if entry.info.filename in PARTS:
            try:
                trees[entry.info.filename] = etree.fromstring(entry.data, parser)
            except etree.XMLSyntaxError as exc:
                raise UserError(f"{name}: not a readable .odt file ({entry.info.filename}: {exc.msg})") from None
    if trees["content.xml"].find(f"{OFFICE}body/{OFFICE}text") is None:
        raise UserError(f"{name}: not an .odt file (content.xml holds no office:text)")
    return entries, trees


@dataclass
class _Paragraph:
    unit: Unit
    glued: list[Any] = field(default_factory=list)  # elements not text with no space before them


def _node(p: _Paragraph, builder: UnitBuilder, element: Any) -> Node:
    """An element of a paragraph as a node: a span with its text and children, or opaque."""
    if element.tag in INLINE:
        node = Node(element, builder.length)
        builder.add(element.text)
        for child in element:
            node.children.append(_node(p, builder, child))
            builder.add(child.tail)
        node.end = builder.length
        return node
    node = Node(element, builder.length, builder.length, opaque=True)
    if builder.length and not builder.parts[-1].endswith(" "):
        p.glued.append(element)
    elif element.tag not in BREAKS:  # kept apart from the words on its sides as the source had it
        node.space_before = builder.length > 0
        node.space_after = (element.tail or "")[:1].isspace()
    if element.tag in BREAKS:
        builder.add(" ")  # it parts the words on its sides
    return node


def _paragraph(paragraph: Any) -> _Paragraph:
    """A text:p or text:h as a unit of `markup.py` (its text: `unit.text`, empty if none)."""
    p = _Paragraph(Unit(paragraph, None))
    builder = UnitBuilder(p.unit)
    raw = [paragraph.text or ""]
    builder.add(paragraph.text)
    for child in paragraph:
        p.unit.root.children.append(_node(p, builder, child))
        builder.add(child.tail)
        raw.append(child.tail or "")
    finish_unit(p.unit, builder, raw)
    return p


def _paragraphs(trees: dict[str, Any]) -> list[_Paragraph]:
    """Every paragraph and heading holding text, in the body then the headers and footers."""
    found = []
    for part, container in PARTS.items():
        root = trees.get(part)
        for holder in root.iter(container) if root is not None else []:
            for element in holder.iter(*PARAGRAPHS):
                if not any(a.tag in SKIPPED for a in element.iterancestors()):
                    p = _paragraph(element)
                    if p.unit.text:
                        found.append(p)
    return found


def _unglue(p: _Paragraph) -> None:
    """An element that followed a word with no space between (a note's mark, a tab) is put
    before the separator the output has there: after its word again; a break (a space, a tab,
    a line break) stands for the separator, which is taken out."""
    for element in p.glued:
        before = element.getprevious()
        text = before.tail if before is not None else element.getparent().text
        if not text or not text.endswith(" "):
            continue
        if before is not None:
            before.tail = text[:-1]
        else:
            element.getparent().text = text[:-1]
        if element.tag not in BREAKS and not (element.tail or "").startswith(" "):
            element.tail = " " + (element.tail or "")


def _serialize(tree: Any, source: bytes) -> bytes:
    """A part as it is now, with what came before its root element (comments, processing
    instructions) and the doctype `source` declared entities in (lxml leaves it out): the
    entities its text names stay declared."""
    from lxml import etree

    payload = etree.tostring(tree.getroottree(), xml_declaration=True, encoding="UTF-8")
    found = INTERNAL_SUBSET.match(source[:1 << 20].decode("utf-8", errors="replace"))
    start = re.search(rb"<(?![!?])", payload)  # the root element's tag: the prolog is before it
    if found is None or b"<!DOCTYPE" in payload[: start.start() if start else len(payload)]:
        return payload
    declaration, _, rest = payload.partition(b"\n")
    return declaration + b"\n" + found.group(2).encode("utf-8") + b"\n" + rest


def _write(entries: list[Entry], trees: dict[str, Any]) -> bytes:
    """The package again: the mimetype first and stored, the parsed parts as they are now, the
    other entries as they were."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr(zipfile.ZipInfo("mimetype"), MIMETYPE, compress_type=zipfile.ZIP_STORED)
        for entry in entries:
            info, payload = entry.info, entry.data
            if info.filename == "mimetype":
                continue
            if info.filename in trees:
                payload = _serialize(trees[info.filename], entry.data)
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.compress_type, copy.external_attr = info.compress_type, info.external_attr
            archive.writestr(copy, payload)
    return out.getvalue()


def text_chars(data: bytes, name: str = "the file") -> int:
    """Characters of text an .odt's paragraphs hold (whitespace collapsed)."""
    return sum(len(p.unit.text) for p in _paragraphs(_read(data, name)[1]))


def translate_odt(translator: Translator, data: bytes, splitter: Splitter, name: str = "the file",
                  cut: list[int] | None = None) -> bytes:
    """An .odt translated paragraph by paragraph, sentences batched across the document (the
    indices of those translated in pieces appended to `cut` when given)."""
    entries, trees = _read(data, name)
    paragraphs = _paragraphs(trees)
    for p in paragraphs:
        p.unit.split = splitter.split(p.unit.text)
    sentences = [s for p in paragraphs for s in (p.unit.split.sentences if p.unit.split else [])]
    aligned = translate_aligned(translator, sentences)
    if cut is not None:
        cut.extend(i for i, a in enumerate(aligned) if a.pieces > 1)
    k = 0
    for p in paragraphs:
        n = len(p.unit.split.sentences) if p.unit.split else 0
        render_unit(p.unit, aligned[k : k + n])
        _unglue(p)
        k += n
    return _write(entries, trees)
