"""Documents built byte by byte for the tests of hostile and damaged input: a .docx holding
every story and container Word writes, zips whose directory lies, damaged and encrypted ones."""

from __future__ import annotations

import io
import re
import struct
import zipfile
from collections.abc import Mapping

from seq2seq_cli.documents.placing import Aligned

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PKG = "http://schemas.openxmlformats.org/package/2006/relationships"
OFFICE = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
WML = "application/vnd.openxmlformats-officedocument.wordprocessingml"
ODT_MIMETYPE = "application/vnd.oasis.opendocument.text"
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # what a password-protected .docx starts with


def upper(sentence: str) -> Aligned:
    """A sentence "translated" into its own words in capitals, each aligned to itself."""
    words = list(re.finditer(r"\S+", sentence))
    return Aligned([w.group().upper() for w in words], [[i] for i in range(len(words))],
                   [(w.start(), w.end()) for w in words])


def _p(inner: str) -> str:
    return f"<w:p>{inner}</w:p>"


def _r(text: str, bold: bool = False) -> str:
    props = "<w:rPr><w:b/></w:rPr>" if bold else ""
    return f'<w:r>{props}<w:t xml:space="preserve">{text}</w:t></w:r>'


def _part(root: str, body: str) -> str:
    return (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            f'<w:{root} xmlns:w="{W_NS}" xmlns:r="{R_NS}">{body}</w:{root}>')


def word_document() -> bytes:
    """A .docx whose Spanish text sits in every place Word puts text: a hyperlink, a tracked
    insertion (beside a tracked deletion), a smart tag, a simple field, inline and block
    content controls, a table, default, first-page and even-page headers and footers,
    footnotes and comments."""
    body = "".join([
        _p(_r("Ver ") + f'<w:hyperlink r:id="rIdLink">{_r("el sitio")}</w:hyperlink>' + _r(" hoy.")),
        _p(_r("Dijo ") + f'<w:ins w:id="1" w:author="a" w:date="2024-01-01T00:00:00Z">{_r("una cosa")}</w:ins>'
           + '<w:del w:id="2" w:author="a" w:date="2024-01-01T00:00:00Z"><w:r><w:delText>borrado</w:delText></w:r></w:del>'
           + _r(" nueva.")),
        _p(_r("Vive en ") + f'<w:smartTag w:uri="u" w:element="place">{_r("Madrid")}</w:smartTag>' + _r(" ahora.")),
        _p(_r("Página ") + f'<w:fldSimple w:instr=" TITLE ">{_r("título largo")}</w:fldSimple>' + _r(" fin.")),
        _p(_r("Una ") + f'<w:sdt><w:sdtPr><w:id w:val="5"/></w:sdtPr><w:sdtContent>{_r("caja")}</w:sdtContent></w:sdt>'
           + _r(" llena.")),
        f'<w:sdt><w:sdtPr><w:id w:val="6"/></w:sdtPr><w:sdtContent>{_p(_r("Bloque de control."))}</w:sdtContent></w:sdt>',
        _p(_r("Texto con nota") + '<w:r><w:footnoteReference w:id="1"/></w:r>' + _r(" aquí.")),
        f'<w:tbl><w:tr><w:tc>{_p(_r("Celda uno."))}</w:tc></w:tr></w:tbl>',
        '<w:sectPr><w:headerReference w:type="default" r:id="rIdH1"/><w:headerReference w:type="first" r:id="rIdH2"/>'
        '<w:headerReference w:type="even" r:id="rIdH3"/><w:footerReference w:type="first" r:id="rIdF1"/>'
        '<w:footerReference w:type="even" r:id="rIdF2"/><w:titlePg/></w:sectPr>',
    ])
    parts = {
        "word/document.xml": _part("document", f"<w:body>{body}</w:body>"),
        "word/header1.xml": _part("hdr", _p(_r("Cabecera normal."))),
        "word/header2.xml": _part("hdr", _p(_r("Cabecera primera."))),
        "word/header3.xml": _part("hdr", _p(_r("Cabecera par."))),
        "word/footer1.xml": _part("ftr", _p(_r("Pie primero."))),
        "word/footer2.xml": _part("ftr", _p(_r("Pie par."))),
        "word/footnotes.xml": _part("footnotes", f'<w:footnote w:id="1">{_p(_r("Nota al pie."))}</w:footnote>'),
        "word/comments.xml": _part("comments", f'<w:comment w:id="0" w:author="a">{_p(_r("Un comentario."))}</w:comment>'),
    }
    kinds = {"header1": "header", "header2": "header", "header3": "header", "footer1": "footer", "footer2": "footer",
             "footnotes": "footnotes", "comments": "comments"}
    ids = {"header1": "rIdH1", "header2": "rIdH2", "header3": "rIdH3", "footer1": "rIdF1", "footer2": "rIdF2",
           "footnotes": "rIdN", "comments": "rIdC"}
    overrides = "".join(f'<Override PartName="/word/{n}.xml" ContentType="{WML}.{k}+xml"/>' for n, k in kinds.items())
    parts["[Content_Types].xml"] = (
        '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/word/document.xml" ContentType="{WML}.document.main+xml"/>{overrides}</Types>')
    parts["_rels/.rels"] = (f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{PKG}">'
                            f'<Relationship Id="rId1" Type="{OFFICE}/officeDocument" Target="word/document.xml"/>'
                            '</Relationships>')
    rels = "".join(f'<Relationship Id="{ids[n]}" Type="{OFFICE}/{k}" Target="{n}.xml"/>' for n, k in kinds.items())
    parts["word/_rels/document.xml.rels"] = (
        f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{PKG}">{rels}'
        f'<Relationship Id="rIdLink" Type="{OFFICE}/hyperlink" Target="https://example.org" TargetMode="External"/>'
        '</Relationships>')
    return zipped(parts)


def zipped(parts: Mapping[str, str | bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return out.getvalue()


def odt_document(text: str = "Hola mundo.", manifest: str = "") -> bytes:
    content = ('<?xml version="1.0" encoding="UTF-8"?><office:document-content '
               'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
               'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
               f'<text:p>{text}</text:p></office:text></office:body></office:document-content>')
    parts: dict[str, str | bytes] = {"mimetype": ODT_MIMETYPE, "content.xml": content}
    if manifest:
        parts["META-INF/manifest.xml"] = manifest
    return zipped(parts)


def _entries(data: bytes) -> dict[str, tuple[int, int]]:
    """name -> (offset of its local header, offset of its central directory record)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        local = {i.filename: i.header_offset for i in archive.infolist()}
    central = {}
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        size = struct.unpack_from("<H", data, at + 28)[0]
        central[data[at + 46 : at + 46 + size].decode()] = at
        at = data.find(b"PK\x01\x02", at + 46)
    return {name: (local[name], central[name]) for name in local}


def lying(data: bytes, entry: str, claimed: int) -> bytes:
    """The zip `data` with `entry`'s uncompressed size said to be `claimed` bytes."""
    out = bytearray(data)
    local, central = _entries(data)[entry]
    struct.pack_into("<I", out, local + 22, claimed)
    struct.pack_into("<I", out, central + 24, claimed)
    return bytes(out)


def encrypted_flag(data: bytes) -> bytes:
    """The zip `data` with every entry marked encrypted (as `zip -e` marks them)."""
    out = bytearray(data)
    for local, central in _entries(data).values():
        out[local + 6] |= 1
        out[central + 8] |= 1
    return bytes(out)


def corrupted(data: bytes, entry: str) -> bytes:
    """The zip `data` with a byte in the middle of `entry`'s packed bytes changed."""
    out = bytearray(data)
    local, _ = _entries(data)[entry]
    name_len, extra_len = struct.unpack_from("<HH", data, local + 26)
    packed = struct.unpack_from("<I", data, local + 18)[0]
    out[local + 30 + name_len + extra_len + packed // 2] ^= 0x55
    return bytes(out)


def big_zeros_entry(parts: dict[str, str], entry: str, size: int) -> bytes:
    """A zip of `parts` plus `entry` holding `size` zero bytes, written without holding them."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
        with archive.open(entry, "w", force_zip64=False) as stream:
            block = bytes(1 << 20)
            for _ in range(size >> 20):
                stream.write(block)
    return out.getvalue()


def odt_lying(size: int) -> bytes:
    """An .odt whose content.xml says it holds 1,000 bytes and inflates to `size`."""
    return lying(big_zeros_entry({"mimetype": ODT_MIMETYPE}, "content.xml", size), "content.xml", 1000)


def docx_lying(size: int) -> bytes:
    """A .docx whose word/document.xml says it holds 1,000 bytes and inflates to `size`."""
    source = zipfile.ZipFile(io.BytesIO(word_document()))
    parts = {n: source.read(n).decode() for n in source.namelist() if n != "word/document.xml"}
    return lying(big_zeros_entry(parts, "word/document.xml", size), "word/document.xml", 1000)
