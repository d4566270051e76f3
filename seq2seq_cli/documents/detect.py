"""Which format a document is in, decided the same way for `translate` and `serve`: by its
name's suffix, and where the name says nothing (no suffix, .txt or a language suffix such as
.es), by its first bytes (an HTML page, an XML document); `--format` overrides both. Then the
document is checked before it is opened: a .docx or .odt must be a zip holding what such a
file holds, and must not unpack to more than MAX_UNPACKED bytes (a zip bomb); text must be
UTF-8. Every problem is one line naming the file.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.errors import UserError

SUFFIXES = {".txt": DocumentFormat.text, ".html": DocumentFormat.html, ".htm": DocumentFormat.html,
            ".xhtml": DocumentFormat.html, ".xml": DocumentFormat.xml, ".docx": DocumentFormat.docx,
            ".odt": DocumentFormat.odt}
SERVED = (".txt", ".html", ".htm", ".docx", ".odt")  # what /translate_file accepts (LibreTranslate's names)
ARCHIVES = {DocumentFormat.docx: ("a .docx", "word/document.xml"), DocumentFormat.odt: ("an .odt", "content.xml")}
MAX_UNPACKED = 200 << 20  # bytes a .docx or .odt may unpack to
MAX_RATIO = 200  # unpacked / packed bytes of a large entry beyond which a zip is refused as a zip bomb
SNIFF_BYTES = 4096  # the bytes of a document's start its content is detected by
HTML_START = re.compile(rb"\s*(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", re.I | re.S)
XML_START = re.compile(rb"\s*<\?xml\s", re.I)


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


def check_document(name: str, data: bytes, fmt: DocumentFormat) -> None:
    """`data`, the bytes of the document `name` in format `fmt`, are fit to open; a UserError
    naming the file otherwise."""
    if not data:
        raise UserError(f"{name}: the file is empty (0 bytes)")
    if fmt not in ARCHIVES:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{name}: not UTF-8 text (invalid byte at {exc.start})") from None
        return
    kind, required = ARCHIVES[fmt]
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise UserError(f"{name}: not {kind} file ({kind} is a zip archive; this is not one)")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = archive.infolist()
        if required not in {e.filename for e in entries}:
            raise UserError(f"{name}: not {kind} file (the archive holds no {required})")
        unpacked = sum(e.file_size for e in entries)
        bomb = any(e.file_size > (1 << 20) and e.file_size > MAX_RATIO * max(1, e.compress_size) for e in entries)
        if unpacked > MAX_UNPACKED or bomb:
            raise UserError(f"{name}: refused: it unpacks to {unpacked} bytes from {len(data)} (a zip bomb?)")
        if fmt is DocumentFormat.odt:
            from seq2seq_cli.documents.odt import check_mimetype

            check_mimetype(name, archive)
