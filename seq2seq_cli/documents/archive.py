"""The zip inside a .docx or .odt, unpacked with every size counted as it inflates.

A zip's directory states each entry's sizes, and a hostile one lies: an entry said to hold
1,000 bytes may inflate to gigabytes, which `ZipFile.read` inflates whole before it notices.
Here each entry is read through `ZipFile.open` in CHUNK-byte reads, so no more than a chunk
is ever inflated beyond what is kept, and the bytes kept are counted against MAX_UNPACKED
(the whole archive) and MAX_RATIO (one large entry against its packed size) as they come; an
entry that inflates to more or less than its directory says fails its checksum. Only the
two methods Office and OpenDocument write (stored, deflated) are read; an encrypted entry, a
password-protected Office file (an OLE compound file, not a zip) and an OpenDocument whose
manifest says its content is encrypted are called encrypted. Every problem is one line
naming the file.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from dataclasses import dataclass

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.errors import UserError

MAX_UNPACKED = 200 << 20  # bytes a .docx or .odt may unpack to
MAX_RATIO = 200  # unpacked / packed bytes of a large entry beyond which a zip is refused as a zip bomb
LARGE_ENTRY = 1 << 20  # bytes from which an entry's ratio is checked
MAX_ENTRIES = 10_000  # entries an archive may hold
CHUNK = 1 << 16  # bytes inflated per read
METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # a password-protected .docx is such a file
MIMETYPE = "application/vnd.oasis.opendocument.text"
KINDS = {DocumentFormat.docx: ("a .docx", ("word/document.xml", "[Content_Types].xml")),
         DocumentFormat.odt: ("an .odt", ("content.xml",))}


@dataclass
class Entry:
    info: zipfile.ZipInfo
    data: bytes


def _refuse_bomb(name: str, data: bytes, unpacked: str) -> UserError:
    return UserError(f"{name}: refused: it unpacks to {unpacked} bytes from {len(data)} (a zip bomb?)")


def _damaged(name: str, kind: str, what: str) -> UserError:
    return UserError(f"{name}: not a readable {kind.split(' ', 1)[1]} file (damaged: {what})")


def _open(name: str, data: bytes, fmt: DocumentFormat) -> zipfile.ZipFile:
    kind = KINDS[fmt][0]
    if data.startswith(OLE_MAGIC):
        raise UserError(f"{name}: encrypted (password-protected); save it without a password and try again")
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise UserError(f"{name}: not {kind} file ({kind} is a zip archive; this is not one)")
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as exc:
        raise _damaged(name, kind, str(exc) or type(exc).__name__) from None


def _inflate(name: str, kind: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, data: bytes) -> bytes:
    """One entry's bytes, read CHUNK by CHUNK: at most `budget` of them (else a zip bomb)."""
    parts: list[bytes] = []
    got = 0
    try:
        with archive.open(info) as stream:
            while chunk := stream.read(CHUNK):
                got += len(chunk)
                if got > budget:
                    raise _refuse_bomb(name, data, f"more than {MAX_UNPACKED}")
                if got > LARGE_ENTRY and got > MAX_RATIO * max(1, info.compress_size):
                    raise _refuse_bomb(name, data, f"more than {got}")
                parts.append(chunk)
    except RuntimeError as exc:  # zipfile's word for an entry it needs a password for
        if "encrypted" in str(exc) or "password" in str(exc):
            raise UserError(f"{name}: encrypted (password-protected); save it without a password and try again") from None
        raise _damaged(name, kind, f"{info.filename}: {exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, NotImplementedError) as exc:
        raise _damaged(name, kind, f"{info.filename}: {exc}") from None
    return b"".join(parts)


def unpack(name: str, data: bytes, fmt: DocumentFormat) -> list[Entry]:
    """The entries of the .docx or .odt `data` (called `name`), each inflated within the
    limits; a UserError naming the file when it is not one, is damaged, encrypted or a bomb."""
    kind, required = KINDS[fmt]
    with _open(name, data, fmt) as archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise UserError(f"{name}: refused: the archive holds {len(infos)} entries, more than {MAX_ENTRIES}")
        names = {info.filename for info in infos}
        if required[0] not in names:
            raise UserError(f"{name}: not {kind} file (the archive holds no {required[0]})")
        stated = sum(info.file_size for info in infos)
        if stated > MAX_UNPACKED or any(
                i.file_size > LARGE_ENTRY and i.file_size > MAX_RATIO * max(1, i.compress_size) for i in infos):
            raise _refuse_bomb(name, data, str(stated))
        for part in required[1:]:
            if part not in names:
                raise UserError(f"{name}: not {kind} file (the archive holds no {part})")
        if any(info.flag_bits & 0x1 for info in infos):
            raise UserError(f"{name}: encrypted (password-protected); save it without a password and try again")
        for info in infos:
            if info.compress_type not in METHODS:
                raise _damaged(name, kind, f"{info.filename} is compressed with method {info.compress_type}, "
                                           "which .docx and .odt files do not use")
        entries: list[Entry] = []
        left = MAX_UNPACKED
        for info in infos:
            payload = _inflate(name, kind, archive, info, left, data)
            left -= len(payload)
            entries.append(Entry(info, payload))
    if fmt is DocumentFormat.odt:
        _check_odt(name, entries)
    return entries


def _check_odt(name: str, entries: list[Entry]) -> None:
    """An .odt holds text (its mimetype, where it has one) and is not encrypted."""
    by_name = {e.info.filename: e.data for e in entries}
    if "mimetype" in by_name:
        found = by_name["mimetype"][:100].decode("ascii", "replace").strip()
        if found != MIMETYPE:
            raise UserError(f"{name}: not an .odt file (its mimetype is {found or 'empty'}, not {MIMETYPE})")
    if b"encryption-data" in by_name.get("META-INF/manifest.xml", b""):
        raise UserError(f"{name}: encrypted (password-protected); save it without a password and try again")


def repack(entries: list[Entry]) -> bytes:
    """The entries as a new zip, stored, whose directory tells the truth (what python-docx reads)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for entry in entries:
            copy = zipfile.ZipInfo(entry.info.filename, entry.info.date_time)
            copy.external_attr = entry.info.external_attr
            archive.writestr(copy, entry.data)
    return out.getvalue()
