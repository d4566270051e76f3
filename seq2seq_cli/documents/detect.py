"""Which format a document is in, decided the same way for `translate` and `serve`: by its
name's suffix, and where the name says nothing (no suffix, .txt or a language suffix such as
.es), by its first bytes (an HTML page, an XML document); `--format` overrides both. Then the
document is checked before it is opened: a .docx or .odt must be a zip holding what such a
file holds, unpacked within the limits of `archive.py` (a zip bomb, damaged or encrypted, is
refused); text must be UTF-8, or for XML the encoding its declaration names. Every problem is
one line naming the file.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents.archive import KINDS as ARCHIVES
from seq2seq_cli.documents.archive import unpack
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import wide_bom_hint

SUFFIXES = {".txt": DocumentFormat.text, ".html": DocumentFormat.html, ".htm": DocumentFormat.html,
            ".xhtml": DocumentFormat.html, ".xml": DocumentFormat.xml, ".docx": DocumentFormat.docx,
            ".odt": DocumentFormat.odt}
SERVED = (".txt", ".html", ".htm", ".docx", ".odt")  # what /translate_file accepts (LibreTranslate's names)
SNIFF_BYTES = 4096  # the bytes of a document's start its content is detected by
HTML_START = re.compile(rb"\s*(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", re.I | re.S)
XML_START = re.compile(rb"\s*<\?xml\s", re.I)
DECLARED = re.compile(rb"(?:\xef\xbb\xbf)?\s*<\?xml\s[^>]*?\bencoding\s*=\s*[\"']([A-Za-z][A-Za-z0-9._-]*)[\"']")
META_CHARSET = re.compile(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z][A-Za-z0-9._:-]*)", re.I)


def detect(name: str, head: bytes, given: DocumentFormat = DocumentFormat.auto) -> DocumentFormat:
    """The format of the document called `name` ('-' for stdin) that starts with `head` (its
    first SNIFF_BYTES bytes, or fewer): `given` unless it is auto; else by the suffix; else by
    the content; else text."""
    if given is not DocumentFormat.auto:
        return given
    by_name = SUFFIXES.get(Path(name).suffix.lower()) if name != "-" else None
    if by_name is not None and by_name is not DocumentFormat.text:
        return by_name
    head = head.removeprefix(b"\xef\xbb\xbf")
    if HTML_START.match(head):
        return DocumentFormat.html
    if XML_START.match(head):
        return DocumentFormat.xml
    return DocumentFormat.text


def check_served_name(name: str) -> None:
    """A file `serve` translates has one of the suffixes LibreTranslate's clients send."""
    suffix = Path(name).suffix.lower()
    if suffix not in SERVED:
        raise UserError(f"{name}: {suffix or 'a file without an extension'} is not supported; "
                        f"send {', '.join(SERVED[:-1])} or {SERVED[-1]}")


def text_encoding(name: str, data: bytes, fmt: DocumentFormat) -> str:
    """The encoding of a document that is text: UTF-8, or for XML and HTML the one its XML
    declaration names, or for HTML without one the one its <meta> names (charset, or
    http-equiv's content), as a browser reads it: Latin-1 and ASCII as Windows-1252, UTF-16 as
    UTF-8. A byte-order mark says UTF-8 whatever either says."""
    found = DECLARED.match(data[:SNIFF_BYTES]) if fmt in (DocumentFormat.xml, DocumentFormat.html) else None
    if data.startswith(b"\xef\xbb\xbf"):
        return "utf-8"
    if found is None and fmt is DocumentFormat.html:
        meta = META_CHARSET.search(data[:SNIFF_BYTES])
        if meta is None:
            return "utf-8"
        codec = named_codec(name, meta, "its <meta> names the charset")
        if codec.name.startswith(("utf-16", "utf-32")):  # read as ASCII, the page cannot be in it (the HTML standard's rule)
            return "utf-8"
        return "cp1252" if codec.name in ("iso8859-1", "ascii") else codec.name
    if found is None:
        return "utf-8"
    declared = found.group(1).decode("ascii")
    codec = named_codec(name, found, "its XML declaration names the encoding")
    if codec.name.startswith(("utf-16", "utf-32")):  # read as ASCII, the declaration cannot be theirs
        raise UserError(f"{name}: its XML declaration names {declared}, but the file is not in it "
                        "(a UTF-16 or UTF-32 file starts with a byte-order mark)")
    return codec.name


WEB_CODECS = frozenset([
    "utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "ascii", "cp866", "cp874",
    *(f"cp{n}" for n in range(1250, 1259)), *(f"iso8859-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
    "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic", "shift_jis", "euc_jp", "iso2022_jp", "gb18030", "gbk", "gb2312",
    "big5", "big5hkscs", "euc_kr",
])
"""Python's names of the text encodings web pages are written in (the WHATWG Encoding
standard's, with Python's codecs); others Python knows (hex, base64, rot13, UTF-7, unicode-escape
...) are not how a page is stored, and a browser would not read one so."""


def named_codec(name: str, found: re.Match[bytes], said: str) -> codecs.CodecInfo:
    """The codec of the encoding `found` names (its group 1) where a page or XML document may
    be in it (`WEB_CODECS`); else a UserError: 'NAME: SAID LABEL, which is not known'."""
    label = found.group(1).decode("ascii")
    try:
        codec = codecs.lookup(label)
    except LookupError:
        codec = None
    if codec is None or codec.name not in WEB_CODECS:
        raise UserError(f"{name}: {said} {label}, which is not known")
    return codec


def document_text(name: str, data: bytes, fmt: DocumentFormat) -> str:
    """The text of a document that is text (`text_encoding`), without a byte-order mark."""
    encoding = text_encoding(name, data, fmt)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        if encoding == "utf-8":
            raise UserError(f"{name}: not UTF-8 text (invalid byte at {exc.start})"
                            f"{wide_bom_hint(data) or utf8_hint(name, fmt)}") from None
        said = "its XML declaration" if DECLARED.match(data[:SNIFF_BYTES]) else "its <meta> charset"
        raise UserError(f"{name}: not {encoding} text, as {said} says (invalid byte at {exc.start})") from None
    return text.removeprefix("\ufeff")


def utf8_hint(name: str, fmt: DocumentFormat) -> str:
    """How to make a document that is not UTF-8 readable: convert it, or (HTML, XML) name its
    encoding where a reader looks for it."""
    convert = f"; convert it to UTF-8 (iconv -f latin1 -t utf-8 {name} > utf8{Path(name).suffix})"
    if fmt is DocumentFormat.html:
        return convert + ' or name its encoding in the page (<meta charset="windows-1252"> for Latin-1)'
    if fmt is DocumentFormat.xml:
        return convert + ' or name its encoding in an XML declaration (<?xml version="1.0" encoding="ISO-8859-1"?>)'
    return convert


def check_document(name: str, data: bytes, fmt: DocumentFormat) -> None:
    """`data`, the bytes of the document `name` in format `fmt`, are fit to open; a UserError
    naming the file otherwise."""
    if not data:
        raise UserError(f"{name}: the file is empty (0 bytes)")
    if fmt not in ARCHIVES:
        document_text(name, data, fmt)
        return
    unpack(name, data, fmt)
