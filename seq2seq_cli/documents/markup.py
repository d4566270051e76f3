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
relative position in the unit; one that is not translated keeps the spaces it had from the
words on either side. Every element of the source is in the output, with its attributes;
whitespace inside a unit's text is collapsed to single spaces (as a browser shows it), the
unit's leading and trailing whitespace kept.

A page's <title> and its meta descriptions (HEAD_META: their content) are translated; the
rest of <head> is not. Never translated, kept as they are: <script>, <style>, <code>, <pre>,
<kbd>, <samp>, <var>, <textarea>, <svg>, <math>, <template>, <noscript>, comments, processing
instructions, XML entity references, other attributes, and any element with translate="no"
or class "notranslate".
HTML's inline elements are its phrasing elements; in XML, an element is inline when its parent
holds text of its own beside it (mixed content) and a block otherwise.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from seq2seq_cli.documents.aligning import translate_aligned
from seq2seq_cli.documents.placing import Aligned, Node, Unit, render_unit
from seq2seq_cli.documents.sentences import Split, Splitter
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
MAX_NESTING = 400  # levels of elements inside each other an HTML page may have; deeper is refused
INTERNAL_SUBSET = re.compile(r"\s*((?:<!--.*?-->|<\?.*?\?>)\s*)*(<!DOCTYPE\s[^\[>]*\[.*?\]\s*>)", re.I | re.S)
"""An XML doctype with an internal subset (entity declarations), after any comments or processing instructions."""

HEAD_META = frozenset(["description", "og:title", "og:description", "twitter:title", "twitter:description"])
PAGE_START = re.compile(r"\s*(<!--.*?-->\s*)*<(!doctype|html|head|body)(?=[\s>/])", re.I | re.S)
"""The start of an HTML page (else a fragment): a doctype, or the tag of <html>, <head> or <body>."""
DOCTYPE = re.compile(r"<!DOCTYPE(?:[^>\[]|\[.*?\])*>", re.I | re.S)
WRAPPERS = ("html", "head", "body")  # the elements an HTML parser adds where a page leaves out their tags


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
    if html_rules:  # phrasing content all the way down (a loop: pages nest deeper than Python recurses)
        stack = [el]
        while stack:
            element = stack.pop()
            tag = _tag(element)
            if not isinstance(element.tag, str) or tag in OPAQUE_INLINE or tag in EMPTY_HTML:
                continue
            if tag not in INLINE_HTML:
                return False
            if not _untranslated(element, True):
                stack.extend(element)
        return True
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
            node.space_before = bool(self.parts) and self.parts[-1].endswith(" ")
            node.space_after = (el.tail or "")[:1].isspace()
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


def _depth(root: Any) -> int:
    """How deep elements nest under `root` (root alone: 1)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        element, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in element)
    return deepest


def _too_deep(name: str, limit: int) -> UserError:
    return UserError(f"{name}: refused: elements nested more than {limit} levels deep; flatten the document")


def _head(root: Any, splitter: Splitter) -> tuple[list[Unit], list[tuple[Any, str, Split]]]:
    """What a page's <head> shows its readers: the units of its <title>, and the meta
    descriptions (element, attribute, its text split), unless marked translate="no"."""
    units: list[Unit] = []
    attributes: list[tuple[Any, str, Split]] = []
    for head in root.findall("head"):
        if any(el.get("translate") == "no" for el in (head, *head.iterancestors())):
            continue
        for title in head.iter("title"):
            if title.get("translate") != "no":
                units += [u for u in _units(title, True) if u.text]
        for meta in head.iter("meta"):
            key = (meta.get("name") or meta.get("property") or "").lower()
            content = SPACE.sub(" ", meta.get("content") or "").strip()
            if key in HEAD_META and content and meta.get("translate") != "no":
                attributes.append((meta, "content", splitter.split(content)))
    return units, attributes


class MarkupDocument:
    """An HTML or XML document (or HTML fragment) whose text is to be translated: `sentences`
    to translate, then `render` with their aligned translations. An XML declaration is kept
    as it was written (the document is parsed without it: its encoding is the caller's);
    elements nested more than MAX_NESTING levels deep (HTML; 256 in XML, lxml's limit) are
    refused, not dropped."""

    def __init__(self, text: str, fmt: str, splitter: Splitter, name: str = "the input") -> None:
        from lxml import etree
        from lxml import html as lhtml

        self.fmt = fmt
        self.fragment = False
        found = re.match(r"\s*<\?xml[^>]*\?>\s*", text)
        self.declaration = found.group(0) if found else ""  # kept as it was written
        body = "\n" * self.declaration.count("\n") + text[len(self.declaration):]  # the lines where they were
        self.end = text[len(text.rstrip()):]  # the whitespace after the document, kept
        self.attributes: list[tuple[Any, str, Split]] = []  # (element, attribute, its text split)
        self.doctype = ""  # an XML doctype with an internal subset, as written (see `render`)
        self.page_doctype = ""  # an HTML page's doctype, as written (the output has it, or none)
        self.implied: set[str] = set()  # WRAPPERS whose tags the page leaves out: the output leaves them out too
        self.page_prolog: str | None = None  # what an HTML page has before its <html> tag, as written
        if fmt == "xml":
            found = INTERNAL_SUBSET.match(body)
            self.doctype = found.group(2) if found else ""
            parser = etree.XMLParser(resolve_entities=False, strip_cdata=False)
            try:
                self.root = etree.fromstring(body, parser)
            except etree.XMLSyntaxError as exc:
                if "Excessive depth" in exc.msg:
                    raise _too_deep(name, 256) from None
                raise UserError(f"{name}:{exc.lineno}: not well-formed XML ({exc.msg})") from None
        else:
            parser = lhtml.HTMLParser(huge_tree=True)  # lxml drops what nests past 256 levels without it
            if PAGE_START.match(body):
                self.root = lhtml.document_fromstring(body, parser=parser)
                start = re.search(r"<(?![!?])", re.sub(r"<!--.*?-->", lambda m: " " * len(m.group()), body, flags=re.S))
                found = DOCTYPE.search(body, 0, start.start() if start else len(body))
                self.page_doctype = found.group() if found else ""
                self.implied = {tag for tag in WRAPPERS if not re.search(rf"<{tag}[\s>/]", body, re.I)}
                if "html" not in self.implied and start:  # what comes before <html> is never translated: kept as written
                    self.page_prolog = body[self.declaration.count("\n") : start.start()]
            else:
                self.fragment = True
                try:
                    self.root = lhtml.fragment_fromstring(body, create_parent="div", parser=parser)
                except ValueError:  # lxml refuses its leading text: a control character before the first tag
                    bad = next((c for c in body if ord(c) < 32 and c not in "\t\n\r" or c in "\ufffe\uffff"), "?")
                    raise UserError(f"{name}: the text before its first tag holds U+{ord(bad):04X}, a character "
                                    "HTML cannot hold; remove it") from None
        if _depth(self.root) > MAX_NESTING:
            raise _too_deep(name, MAX_NESTING)
        html_rules = fmt == "html"
        self.units = [u for u in _units(self.root, html_rules) if u.text]
        if html_rules and not self.fragment:
            head_units, self.attributes = _head(self.root, splitter)
            self.units = head_units + self.units
        for unit in self.units:
            unit.split = splitter.split(unit.text)

    @property
    def sentences(self) -> list[str]:
        return [s for u in self.units for s in (u.split.sentences if u.split else [])] + [
            s for _, _, split in self.attributes for s in split.sentences]

    def render(self, aligned: list[Aligned]) -> str:
        """The document with its text replaced by the translations (one per `sentences`)."""
        from lxml import etree
        from lxml import html as lhtml

        k = 0
        for unit in self.units:
            n = len(unit.split.sentences) if unit.split else 0
            render_unit(unit, aligned[k : k + n])
            k += n
        for element, attribute, split in self.attributes:
            n = len(split.sentences)
            element.set(attribute, split.join([" ".join(a.words) for a in aligned[k : k + n]]))
            k += n
        if self.fragment:
            head = html.escape(self.root.text or "", quote=False)
            return self.declaration + head + "".join(lhtml.tostring(c, encoding="unicode") for c in self.root)
        method = "html" if self.fmt == "html" and not self.declaration else "xml"  # XHTML stays well-formed
        tree = self.root.getroottree()
        if self.fmt == "html":  # libxml2 writes a page with an XHTML doctype its own way (xmlns twice, a <meta> added)
            tree.docinfo.public_id = tree.docinfo.system_url = None
        body = str(etree.tostring(tree, method=method, encoding="unicode"))
        start = re.search(r"<(?![!?])", body)  # the root element's tag: what comes before it is the prolog
        prolog, body = body[: start.start() if start else len(body)], body[start.start() if start else len(body):]
        if self.page_prolog is not None:
            prolog = self.page_prolog
        elif self.fmt == "html":  # the page's own doctype as written, or none (lxml's otherwise)
            prolog = DOCTYPE.sub(lambda _: self.page_doctype, prolog, count=1)
            if not self.page_doctype:
                prolog = prolog.lstrip("\n")
            elif not DOCTYPE.search(prolog):
                prolog = self.page_doctype + "\n" + prolog
        if self.implied and method == "html":  # the tags the parser added are left out
            after = body[len(lhtml.tostring(self.root, encoding="unicode")):]
            for tag in ("head", "body"):
                added = self.root.find(tag)
                if tag in self.implied and added is not None:
                    added.drop_tag()
            inner = "".join(lhtml.tostring(child, encoding="unicode") for child in self.root)
            body = (html.escape(self.root.text or "", quote=False) + inner if "html" in self.implied
                    else lhtml.tostring(self.root, encoding="unicode")) + after
        if self.doctype and "<!DOCTYPE" not in prolog.upper():
            prolog = self.doctype + "\n" + prolog  # lxml drops a subset not named as the root: its entities stay declared
        return self.declaration + (prolog + body).rstrip() + self.end


def translate_markup(translator: Translator, text: str, fmt: str, splitter: Splitter, name: str = "the input",
                     cut: list[int] | None = None) -> str:
    """An HTML or XML document (or HTML fragment) translated, its markup carried through; a
    page without an element (a doctype alone) is given back as it is. The indices of the
    sentences translated in pieces (too long for the model) are appended to `cut` when given."""
    from lxml import etree

    if not text.strip():
        return text
    try:
        doc = MarkupDocument(text, fmt, splitter, name)
    except etree.ParserError:  # "Document is empty": nothing to translate
        return text
    translated = translate_aligned(translator, doc.sentences)
    if cut is not None:
        cut.extend(i for i, a in enumerate(translated) if a.pieces > 1)
    return doc.render(translated)
