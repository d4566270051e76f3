"""Markup carried through translation: HTML and XML, inline tags kept around the words they enclosed.

A document is read with lxml and cut into units: the text a block element holds directly,
its inline elements (<b>, <i>, <a href>, <span> ...) included, is one unit, translated in
context (split into sentences, `sentences.py`) with its tags taken out. Each translated word
is aligned to source subwords by the model's cross-attention (the argmax per output token, as
`translate --alignment` gives it); an inline element then encloses the target words aligned
to the source text it enclosed (the first to the last of them, within the sentences it
covered), nested as in the source; siblings that would overlap are cut at the earlier one's
end. An element holding no text (<br>, <img>, a comment, a script) is put before the target
word aligned to the source word after it. Where no word is aligned, the element keeps its
relative position in the unit. Every element of the source is in the output, with its
attributes; whitespace inside a unit's text is collapsed to single spaces (as a browser
shows it), the unit's leading and trailing whitespace kept.

Never translated, kept as they are: <script>, <style>, <code>, <pre>, <kbd>, <samp>, <var>,
<textarea>, <svg>, <math>, <template>, <noscript>, comments, processing instructions,
XML entity references, attributes, and any element with translate="no" or class "notranslate".
HTML's inline elements are its phrasing elements; in XML, an element is inline when its parent
holds text of its own beside it (mixed content) and a block otherwise.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from seq2seq_cli.documents.placing import Aligned, Node, Unit, render_unit
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

INLINE_HTML = frozenset(
    "a abbr b bdi bdo big cite data del dfn em font i ins label mark nobr q rp rt ruby s small span strike strong sub "
    "sup time tt u".split())
EMPTY_HTML = frozenset("br img wbr input button select embed audio video canvas picture source track".split())
OPAQUE_INLINE = frozenset("script style code kbd samp var svg math".split())  # kept whole, as a word-less anchor
OPAQUE_BLOCK = frozenset("pre textarea template noscript iframe object head".split())  # kept whole, a unit break
SPACE = re.compile(r"\s+")


def _tag(el: Any) -> str:
    return el.tag.rsplit("}", 1)[-1].lower() if isinstance(el.tag, str) else ""


def _untranslated(el: Any, html_rules: bool) -> bool:
    """Whether an element's content is kept as it is (no text of its translated)."""
    if not isinstance(el.tag, str):  # comment, processing instruction, entity
        return True
    if el.get("translate") == "no" or any(k.endswith("}translate") and v == "no" for k, v in el.attrib.items()):
        return True
    if html_rules:
        return _tag(el) in OPAQUE_INLINE or _tag(el) in OPAQUE_BLOCK or "notranslate" in (el.get("class") or "").split()
    return False


def _mixed(parent: Any) -> bool:
    return bool((parent.text or "").strip()) or any((c.tail or "").strip() for c in parent)


def _inline(el: Any, html_rules: bool) -> bool:
    """Whether an element sits in the flow of its parent's text (else it is a block)."""
    if html_rules:
        tag = _tag(el)
        if not isinstance(el.tag, str) or tag in OPAQUE_INLINE or tag in EMPTY_HTML:
            return True
        if tag not in INLINE_HTML:
            return False
        return _untranslated(el, True) or all(_inline(c, True) for c in el)
    parent = el.getparent()
    return not isinstance(el.tag, str) or (parent is not None and _mixed(parent))


class UnitBuilder:
    """Collects a unit's text with whitespace collapsed."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.parts: list[str] = []
        self.length = 0

    def add(self, raw: str | None) -> None:
        text = SPACE.sub(" ", raw or "")
        if text.startswith(" ") and (self.length == 0 or self.parts[-1].endswith(" ")):
            text = text[1:]
        if text:
            self.parts.append(text)
            self.length += len(text)

    def node(self, el: Any, html_rules: bool) -> Node:
        if _untranslated(el, html_rules) or (html_rules and _tag(el) in EMPTY_HTML):
            node = Node(el, self.length, self.length, opaque=True)
            if _tag(el) == "br":
                self.add(" ")  # a line break parts words
            return node
        node = Node(el, self.length)
        self.add(el.text)
        for child in el:
            node.children.append(self.node(child, html_rules))
            self.add(child.tail)
        node.end = self.length
        return node


def _units(container: Any, html_rules: bool) -> Iterator[Unit]:
    """The units of `container` and of the block elements inside it, in document order."""
    if _untranslated(container, html_rules):
        return
    unit = Unit(container, None)
    builder = UnitBuilder(unit)
    raw = [container.text or ""]
    builder.add(container.text)
    for child in container:
        if _inline(child, html_rules):
            unit.root.children.append(builder.node(child, html_rules))
            builder.add(child.tail)
            raw.append(child.tail or "")
            continue
        yield finish_unit(unit, builder, raw)
        yield from _units(child, html_rules)
        unit = Unit(container, child)
        builder = UnitBuilder(unit)
        raw = [child.tail or ""]
        builder.add(child.tail)
    yield finish_unit(unit, builder, raw)


def finish_unit(unit: Unit, builder: UnitBuilder, raw: list[str]) -> Unit:
    text = "".join(builder.parts)
    unit.text = text.rstrip()
    unit.root.end = len(unit.text)
    unit.lead = raw[0][: len(raw[0]) - len(raw[0].lstrip())]
    unit.trail = raw[-1][len(raw[-1].rstrip()):] if len(raw) > 1 or raw[0].strip() else ""
    return unit


class MarkupDocument:
    """An HTML or XML document (or HTML fragment) whose text is to be translated: `sentences`
    to translate, then `render` with their aligned translations."""

    def __init__(self, text: str, fmt: str, splitter: Splitter, name: str = "the input") -> None:
        from lxml import etree
        from lxml import html as lhtml

        self.fmt = fmt
        self.fragment = False
        found = re.match(r"\s*<\?xml[^>]*\?>\s*", text)
        self.declaration = found.group(0) if found else ""  # kept as it was written
        self.end = text[len(text.rstrip()):]  # the whitespace after the document, kept
        if fmt == "xml":
            parser = etree.XMLParser(resolve_entities=False, strip_cdata=False)
            try:
                self.root = etree.fromstring(text.encode("utf-8"), parser)
            except etree.XMLSyntaxError as exc:
                raise UserError(f"{name}:{exc.lineno}: not well-formed XML ({exc.msg})") from None
        elif re.match(r"\s*(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*<(!doctype|html)", text, re.I | re.S):
            self.root = lhtml.document_fromstring(text)
        else:
            self.fragment = True
            self.root = lhtml.fragment_fromstring(text, create_parent="div")
        html_rules = fmt == "html"
        self.units = [u for u in _units(self.root, html_rules) if u.text]
        for unit in self.units:
            unit.split = splitter.split(unit.text)

    @property
    def sentences(self) -> list[str]:
        return [s for u in self.units for s in (u.split.sentences if u.split else [])]

    def render(self, aligned: list[Aligned]) -> str:
        """The document with its text replaced by the translations (one per `sentences`)."""
        from lxml import etree
        from lxml import html as lhtml

        k = 0
        for unit in self.units:
            n = len(unit.split.sentences) if unit.split else 0
            render_unit(unit, aligned[k : k + n])
            k += n
        if self.fragment:
            head = html.escape(self.root.text or "", quote=False)
            return head + "".join(lhtml.tostring(c, encoding="unicode") for c in self.root)
        if self.fmt == "html":
            return str(etree.tostring(self.root.getroottree(), method="html", encoding="unicode")).rstrip() + self.end
        body = str(etree.tostring(self.root.getroottree(), encoding="unicode"))
        return self.declaration + body.rstrip() + self.end


def aligned(translator: Translator, sentence: str, tokens: list[int], links: list[int]) -> Aligned:
    """One translated sentence as words with their aligned source subwords; `links`: for each
    output token, the source piece (of the sentence, a tag not counted) it attends to most."""
    sp = translator.src_sp
    raw = sentence.encode("utf-8")
    sources = []
    for piece in sp.encode(sentence, return_type="proto").pieces:
        start = len(raw[: piece.begin].decode("utf-8", errors="ignore"))
        end = len(raw[: piece.end].decode("utf-8", errors="ignore"))
        surface = sentence[start:end]
        sources.append((start + len(surface) - len(surface.lstrip()), end))
    groups: list[list[int]] = []  # token positions of each word
    for j, tok in enumerate(tokens):
        if not groups or translator.tgt_sp.id_to_piece(tok).startswith("\u2581"):
            groups.append([])
        groups[-1].append(j)
    words = [translator.tgt_sp.decode([tokens[j] for j in g]) for g in groups]
    kept = [(w, [links[j] for j in g if j < len(links)]) for w, g in zip(words, groups) if w]
    return Aligned([w for w, _ in kept], [ls for _, ls in kept], sources)


def translate_aligned(translator: Translator, sentences: list[str]) -> list[Aligned]:
    """Translate sentences (1-best) and align each output token to a source piece by the last
    decoder layer's cross-attention (mean over heads)."""
    if not sentences:
        return []
    ids = translator.encode(sentences)
    out = []
    skip = len(translator.tag_ids)
    for sentence, src, hyps in zip(sentences, ids, translator.translate_hypotheses(sentences, 1, ids)):
        tokens = hyps[0].tokens
        links: list[int] = []
        if tokens and len(src) - 1 > skip:
            attention = translator.cross_attention(src, tokens, -1, None)
            links = attention[: len(tokens), skip : len(src) - 1].argmax(dim=1).tolist()
        out.append(aligned(translator, sentence, tokens, links))
    return out


def translate_markup(translator: Translator, text: str, fmt: str, splitter: Splitter, name: str = "the input") -> str:
    """An HTML or XML document (or HTML fragment) translated, its markup carried through."""
    if not text.strip():
        return text
    doc = MarkupDocument(text, fmt, splitter, name)
    return doc.render(translate_aligned(translator, doc.sentences))
