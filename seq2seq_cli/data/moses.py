"""OPUS's Moses zips: one .zip holding the two sides of a corpus as aligned text files
(`NAME.en-es.es` and `NAME.en-es.en`, besides a README and a LICENSE), read directly from
the zip, streaming, into an Arrow file of the run's cache.

The member of each side is the one whose name ends in `.SRC_LANG` (`.TGT_LANG`). A bad zip
is one line: not a zip, no member or several for a language, a member encrypted or packed by
a method Python cannot unpack (Deflate64), damaged (a bad CRC, cut short), invalid UTF-8
(member, line, byte), a line of more than `fileio.MAX_LINE_BYTES`, a member that inflates to
more than MAX_RATIO times its packed size (a zip bomb: text packs 3 to 5 times), members of
different line counts. Each member is read a line at a time, never more than a line is held.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from seq2seq_cli.data.arrow_cache import cached_dataset
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import BOM, file_key, read_line

BATCH = 1000
CACHE_VERSION = 1
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
           zipfile.ZIP_LZMA: "lzma"}  # the methods Python unpacks
KNOWN_METHODS = {9: "Deflate64", 93: "Zstandard", 95: "xz", 98: "PPMd", 99: "AES encryption"}
MAX_RATIO = 200  # unpacked / packed bytes of a member beyond which the zip is refused as a zip bomb
LARGE_MEMBER = 1 << 20  # bytes from which a member's ratio is checked


def members(path: Path, src_lang: str, tgt_lang: str) -> tuple[str, str]:
    """The names of the source and target members of the zip at `path`."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if not n.endswith("/")]
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"{path}: not a zip file ({exc}); expected an OPUS Moses zip (X.{src_lang} and X.{tgt_lang})") from None
    found = []
    for lang in (src_lang, tgt_lang):
        mine = [n for n in names if n.endswith(f".{lang}")]
        if len(mine) != 1:
            what = "no member" if not mine else f"{len(mine)} members ({', '.join(mine)})"
            raise UserError(f"{path}: {what} ending in .{lang} (its members: {', '.join(names) or 'none'}); expected "
                            f"one file per language, as OPUS's Moses zips hold (X.{src_lang} and X.{tgt_lang})")
        found.append(mine[0])
    with zipfile.ZipFile(path) as z:
        for name in found:
            _check_member(path, z.getinfo(name))
    return found[0], found[1]


def _check_member(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse a member that is encrypted, packed by a method Python does not unpack, or says it
    unpacks to more than MAX_RATIO times its packed size."""
    where = f"{path}: {info.filename}"
    if info.flag_bits & 0x1 or info.compress_type == 99:
        raise UserError(f"{where}: encrypted (the zip has a password); unzip it with its password and give the "
                        "two text files (X.es and X.en, or one .tsv) instead")
    if info.compress_type not in METHODS:
        method = KNOWN_METHODS.get(info.compress_type, f"method {info.compress_type}")
        raise UserError(f"{where}: packed with {method}, which Python's zipfile cannot unpack (it reads "
                        f"{', '.join(METHODS.values())}); unzip it with another tool (7z x) and give the text files, "
                        "or zip them again (zip -9)")
    if info.file_size > LARGE_MEMBER and info.file_size > MAX_RATIO * max(1, info.compress_size):
        raise _bomb(path, info, str(info.file_size))


def _bomb(path: Path, info: zipfile.ZipInfo, size: str) -> UserError:
    return UserError(f"{path}: {info.filename}: refused: it unpacks to {size} bytes from {info.compress_size} "
                     f"(more than {MAX_RATIO} times; text packs 3 to 5 times: a zip bomb?)")


class _Member:
    """One member of the zip read a line at a time, its inflated bytes counted against
    MAX_RATIO times its packed size, and every problem of reading it one line naming it."""

    def __init__(self, path: Path, z: zipfile.ZipFile, name: str) -> None:
        self.path, self.info, self.got = path, z.getinfo(name), 0
        self.where = f"{path}:{name}"
        self.stream = self._guard(lambda: z.open(name))

    def _guard(self, read):
        try:
            return read()
        except UserError:
            raise
        except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, RuntimeError,
                NotImplementedError, ValueError) as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"{self.path}: {self.info.filename}: damaged ({text}); download the zip again") from None

    def readline(self, number: int) -> bytes:
        raw = self._guard(lambda: read_line(self.stream, self.where, number))
        self.got += len(raw)
        if self.got > LARGE_MEMBER and self.got > MAX_RATIO * max(1, self.info.compress_size):
            raise _bomb(self.path, self.info, f"more than {self.got}")
        return raw

    def rest(self, number: int) -> int:
        """The number of lines from here to the end."""
        count = 0
        while self.readline(number + count + 1):
            count += 1
        return count

    def close(self) -> None:
        self.stream.close()


def _decode(raw: bytes, where: str, line: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}:{line}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason})") from None
    text = text.rstrip("\n").rstrip("\r")
    return text.removeprefix(BOM) if line == 1 else text


def pairs(path: Path, src_lang: str, tgt_lang: str) -> Iterator[tuple[str, str]]:
    """(source, target) for each line of the zip's two members, in order, streaming."""
    src_name, tgt_name = members(path, src_lang, tgt_lang)
    with zipfile.ZipFile(path) as z:
        fs, ft = _Member(path, z, src_name), _Member(path, z, tgt_name)
        try:
            line = 0
            while True:
                a, b = fs.readline(line + 1), ft.readline(line + 1)
                if not a or not b:
                    if a or b:
                        rest = (fs if a else ft).rest(line + 1) + 1
                        longer, shorter = (src_name, tgt_name) if a else (tgt_name, src_name)
                        raise UserError(f"{path}: {longer} has {line + rest} lines but {shorter} has {line}; "
                                        "source and target files must be aligned line by line")
                    return
                line += 1
                yield _decode(a, f"{path}:{src_name}", line), _decode(b, f"{path}:{tgt_name}", line)
        finally:
            fs.close()
            ft.close()


def _batches(path: Path, src_lang: str, tgt_lang: str) -> Iterator[pa.RecordBatch]:
    src: list[str] = []
    tgt: list[str] = []
    for s, t in pairs(path, src_lang, tgt_lang):
        src.append(s)
        tgt.append(t)
        if len(src) == BATCH:
            yield pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=SCHEMA)
            src, tgt = [], []
    if src:
        yield pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], schema=SCHEMA)


def read_moses(path: Path, src_lang: str, tgt_lang: str, cache_dir: Path | None):
    """The pairs of a Moses zip as a `datasets.Dataset` (columns src, tgt), streamed to an
    Arrow file in `cache_dir`/moses (reused while the zip and languages are unchanged), or
    held in memory without a cache directory."""
    empty = UserError(f"{path}: its members hold no lines (expected X.{src_lang} and X.{tgt_lang}, one sentence a line)")
    if cache_dir is None:
        return cached_dataset(None, SCHEMA, lambda: _batches(path, src_lang, tgt_lang), empty)
    key = json.dumps([CACHE_VERSION, *file_key(path), src_lang, tgt_lang])
    target = cache_dir / "moses" / f"{path.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.arrow"
    return cached_dataset(target, SCHEMA, lambda: _batches(path, src_lang, tgt_lang), empty)
