"""TMX (Translation Memory eXchange, as OPUS and translation tools export it): read with
`xml.etree.ElementTree.iterparse`, streaming, each translation unit cleared once read.

A unit (`<tu>`) gives one pair: the segment (`<seg>`) of its variant (`<tuv>`) in the
source language and the one in the target language. Languages are matched as TMX writes
them: case-insensitively, `xml:lang` or TMX 1.1's `lang`, and a language without a region
(data.src_lang `es`) matches any region of it (`es`, `ES`, `es-ES`, `es_MX`); one with a
region (`pt-BR`) matches that region only. Inline codes of a segment (`bpt`, `ept`, `ph`,
`it`, `ut`) are markup, not text, and are left out; `hi` and `sub` keep their text. Line breaks
inside a segment become spaces. A bad file is reported with its line: XML that is not
well-formed, a root that is not `<tmx>`, a `<tuv>` without a language, a unit without one
of the two languages.
"""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pyarrow as pa

from seq2seq_cli.data.arrow_cache import cached_dataset
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_utf8, file_key, open_bytes

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
INLINE_CODES = frozenset({"bpt", "ept", "ph", "it", "ut"})  # native markup inside a segment, not text
BATCH = 1000
CACHE_VERSION = 1


class _LineReader:
    """A binary file handed to iterparse one line (at most a megabyte) per read, so that the
    events iterparse yields after a read lie on the line just read: `line` is its number."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.newlines = 0
        self.line = 1

    def read(self, size: int = -1) -> bytes:
        data = self.f.readline(1 << 20)
        self.newlines += data.count(b"\n")
        self.line = self.newlines if data.endswith(b"\n") else self.newlines + 1
        return data


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def lang_matches(code: str, want: str) -> bool:
    """Whether the TMX language `code` is the configured language `want` (see the module)."""
    c, w = code.strip().lower().replace("_", "-"), want.strip().lower().replace("_", "-")
    return c == w or ("-" not in w and c.split("-", 1)[0] == w)


def _text(seg: ET.Element) -> str:
    """The text of a segment (or of a `hi`/`sub` inside one), inline codes left out."""
    parts = [seg.text or ""]
    for child in seg:
        if _local(child.tag) not in INLINE_CODES:
            parts.append(_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _clean(text: str) -> str:
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ").strip()


def _pair(tu: ET.Element, src_lang: str, tgt_lang: str, where: str) -> tuple[str, str]:
    found: dict[str, str] = {}
    langs = []
    for tuv in tu:
        if _local(tuv.tag) != "tuv":
            continue
        lang = tuv.get(XML_LANG) or tuv.get("lang")
        if not lang:
            raise UserError(f"{where}: <tuv> without xml:lang (expected the language of its segment)")
        langs.append(lang)
        seg = next((c for c in tuv if _local(c.tag) == "seg"), None)
        for side, want in (("src", src_lang), ("tgt", tgt_lang)):
            if side not in found and lang_matches(lang, want):
                found[side] = _clean(_text(seg)) if seg is not None else ""
    missing = [want for side, want in (("src", src_lang), ("tgt", tgt_lang)) if side not in found]
    if missing:
        have = ", ".join(langs) or "none"
        raise UserError(f"{where}: translation unit without a variant in {' or '.join(missing)} (its languages: {have}; "
                        "data.src_lang and data.tgt_lang name the two, matched as es, ES, es-ES)")
    return found["src"], found["tgt"]


def tmx_units(path: Path, src_lang: str, tgt_lang: str) -> Iterator[tuple[int, str, str]]:
    """(line of its <tu>, source, target) for each translation unit of a TMX file (gzip or
    not), in file order, in bounded memory. Raises UserError `PATH:LINE: ...` on a bad file."""
    try:
        with open_bytes(path) as f:
            reader = _LineReader(f)
            body: ET.Element | None = None
            first, start = True, 0
            try:
                for event, elem in ET.iterparse(reader, events=("start", "end")):
                    tag = _local(elem.tag)
                    if event == "start":
                        if first and tag != "tmx":
                            raise UserError(f"{path}:{reader.line}: expected a TMX document (root element <tmx>), "
                                            f"found <{tag}>")
                        first = False
                        if tag == "body":
                            body = elem
                        elif tag == "tu":
                            start = reader.line
                        continue
                    if tag == "tu":
                        yield (start, *_pair(elem, src_lang, tgt_lang, f"{path}:{start}"))
                        elem.clear()
                        if body is not None:
                            body.clear()  # the units read so far: memory stays flat
            except ET.ParseError as exc:
                line, column = exc.position
                reason = str(exc).split(":", 1)[0]
                if reason == "no element found" and first:
                    raise UserError(f"{path}: empty file (expected a TMX document)") from None
                if "invalid token" in reason:
                    check_utf8(path)  # names the line and byte of invalid UTF-8, if that is what it is
                raise UserError(f"{path}:{line}: not well-formed XML ({reason}, column {column + 1}); "
                                "expected a TMX document") from None
    except (OSError, EOFError) as exc:  # e.g. a damaged .gz file
        raise UserError(f"{path}: could not be read ({exc})") from None


def unit_line(path: Path, index: int, src_lang: str, tgt_lang: str) -> int:
    """The line of translation unit `index` (from 0) of a TMX file."""
    for i, (line, _, _) in enumerate(tmx_units(path, src_lang, tgt_lang)):
        if i == index:
            return line
    return 0


def _batches(path: Path, src_lang: str, tgt_lang: str) -> Iterator[pa.RecordBatch]:
    src: list[str] = []
    tgt: list[str] = []
    for _, s, t in tmx_units(path, src_lang, tgt_lang):
        src.append(s)
        tgt.append(t)
        if len(src) == BATCH:
            yield pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], names=["src", "tgt"])
            src, tgt = [], []
    if src:
        yield pa.record_batch([pa.array(src, pa.string()), pa.array(tgt, pa.string())], names=["src", "tgt"])


SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


def read_tmx(path: Path, src_lang: str, tgt_lang: str, cache_dir: Path | None):
    """The pairs of a TMX file as a `datasets.Dataset` (columns src, tgt), streamed to an Arrow
    file in `cache_dir`/tmx (reused while the file and languages are unchanged), or held in
    memory without a cache directory."""
    empty = UserError(f"{path}: no translation units (<tu>) found (expected a TMX document of {src_lang} and "
                      f"{tgt_lang} segments)")
    if cache_dir is None:
        return cached_dataset(None, SCHEMA, lambda: _batches(path, src_lang, tgt_lang), empty)
    key = json.dumps([CACHE_VERSION, *file_key(path), src_lang, tgt_lang])
    target = cache_dir / "tmx" / f"{path.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.arrow"
    return cached_dataset(target, SCHEMA, lambda: _batches(path, src_lang, tgt_lang), empty)
