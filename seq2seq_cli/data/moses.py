"""OPUS's Moses zips: one .zip holding the two sides of a corpus as aligned text files
(`NAME.en-es.es` and `NAME.en-es.en`, besides a README and a LICENSE), read directly from
the zip, streaming, into an Arrow file of the run's cache.

The member of each side is the one whose name ends in `.SRC_LANG` (`.TGT_LANG`). A bad zip
is one line: not a zip, no member or several for a language, invalid UTF-8 (member, line,
byte), members of different line counts.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from seq2seq_cli.data.arrow_cache import cached_dataset
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import BOM, file_key

BATCH = 1000
CACHE_VERSION = 1
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


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
    return found[0], found[1]


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
    with zipfile.ZipFile(path) as z, z.open(src_name) as fs, z.open(tgt_name) as ft:
        line = 0
        while True:
            a, b = fs.readline(), ft.readline()
            if not a or not b:
                if a or b:
                    rest = sum(1 for _ in (fs if a else ft)) + 1
                    longer, shorter = (src_name, tgt_name) if a else (tgt_name, src_name)
                    raise UserError(f"{path}: {longer} has {line + rest} lines but {shorter} has {line}; "
                                    "source and target files must be aligned line by line")
                return
            line += 1
            yield _decode(a, f"{path}:{src_name}", line), _decode(b, f"{path}:{tgt_name}", line)


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
