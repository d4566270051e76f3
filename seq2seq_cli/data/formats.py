"""Parallel corpora on disk: the formats, read through HF `datasets` (local files only) and
checked line by line.

A split is two aligned text files (PREFIX.SRC_LANG and PREFIX.TGT_LANG, one sentence per
line), one TSV file (source<TAB>target per line, no quoting), one JSONL file (one object per
line with a source and a target field, at the top level or under "translation"), one TMX
file (`tmx`) or one OPUS Moses zip (`moses`, X.SRC_LANG and X.TGT_LANG inside); any file but
the zip may be gzip- or xz-compressed. A split may also be a dataset of the Hugging Face Hub
(`hub`). Problems are UserErrors naming the file, the line and what was
expected: a missing file, invalid UTF-8 (with the byte offset), differing line counts, a TSV
row without two columns, a JSONL line that is not an object or lacks a field.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.compute as pc

from seq2seq_cli.config import SplitConfig
from seq2seq_cli.data.arrow_cache import cached_dataset
from seq2seq_cli.data.pages import release_dataset
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import (
    BOM,
    MAX_LINE_BYTES,
    check_utf8,
    file_key,
    line_too_long,
    lone_surrogate,
    open_bytes,
    remove_dead_temps,
)
from seq2seq_cli.layout import RunLayout

READ_BATCH = 1000


COMPRESSED = (".gz", ".xz")


@dataclass(frozen=True)
class Source:
    """Where one split's pairs come from: `files` is (source, target) for text, (file,) for a
    file, () for a Hub dataset (`hub`, its settings, and `revision`, the one found)."""

    format: str
    files: tuple[Path, ...]
    hub: SplitConfig | None = None
    revision: str = ""

    def describe(self) -> str:
        if self.hub is not None:
            return f"{self.hub.describe()} @ {self.revision}" if self.revision else self.hub.describe()
        return " + ".join(map(str, self.files))

    def record(self) -> dict[str, Any]:
        """Where the pairs came from, for the run's records: the files, or the Hub dataset with
        the revision read."""
        if self.hub is not None:
            return {"format": "hub", "hub": self.hub.hub, "config": self.hub.config, "split": self.hub.split,
                    "revision": self.hub.revision, "resolved_revision": self.revision,
                    **({"src_column": self.hub.src_column, "tgt_column": self.hub.tgt_column} if self.hub.src_column else {})}
        return {"format": self.format, "files": [str(f) for f in self.files]}


SplitValue = str | SplitConfig  # a split as the config gives it: a path, or a file or Hub dataset by its settings


def infer_format(value: str, format: str = "auto") -> str:
    if format != "auto":
        return format
    name = value.lower()
    if name.endswith(".zip"):
        return "moses"
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    if name.endswith((".tsv", ".tab")):
        return "tsv"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".tmx"):
        return "tmx"
    return "text"


def split_source(value: SplitValue, src_lang: str, tgt_lang: str, format: str = "auto") -> Source:
    """The files of a split (a prefix for text files, a file path otherwise), checked to exist;
    a Hub dataset checked to be in the cache (see `hub.resolve`)."""
    if isinstance(value, SplitConfig):
        if value.hub is not None:
            from seq2seq_cli.data.hub import resolve

            return Source("hub", (), value, resolve(value))
        value = value.path or ""
    fmt = infer_format(value, format)
    if fmt != "text":
        path = Path(value)
        if not path.is_file():
            raise UserError(f"{path}: {_not_a_file(path)} (expected a {fmt} file of source and target pairs)")
        return Source(fmt, (path,))
    files = []
    for lang in (src_lang, tgt_lang):
        path = Path(f"{value}.{lang}")
        if not path.is_file():
            path = next((p for p in (Path(f"{path}{z}") for z in COMPRESSED) if p.is_file()), path)
        if not path.is_file():
            raise UserError(f"{path}: {_not_a_file(path)} (expected {value}.{src_lang} and {value}.{tgt_lang}, "
                            "optionally .gz or .xz)")
        files.append(path)
    return Source("text", tuple(files))


def _not_a_file(path: Path) -> str:
    """What `path`, which is not a regular file, is: 'file not found', 'is a directory', or 'not a
    regular file (a FIFO)', a link named as such."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "file not found (a link to a missing file)" if path.is_symlink() else "file not found"
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    link = f"a link to {os.path.realpath(path)}, " if path.is_symlink() else ""
    if stat.S_ISDIR(mode):
        return f"is a directory ({link.removesuffix(', ')})" if link else "is a directory"
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    return f"not a regular file ({link}{kind})"


def corpus_sources(config) -> list[Source]:
    """The files of each training corpus, checked to exist; with a list of corpora a missing
    one is reported naming the config entry. `config` is a `seq2seq_cli.config.Config`."""
    d = config.data
    if not isinstance(d.train, list):
        return [split_source(d.train, d.src_lang, d.tgt_lang, d.format)]
    sources = []
    for i, corpus in enumerate(d.train):
        try:
            src_lang, tgt_lang = d.pair_of(corpus)
            sources.append(split_source(corpus, src_lang, tgt_lang, d.format))
        except UserError as exc:
            raise UserError(f"{config.where('data', 'train', i)}: {exc}") from None
    return sources


def quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


LINES = pa.schema([("text", pa.string())])
LINES_VERSION = 1  # of the Arrow copies of text files in RUN/cache/lines
CHUNK = 1 << 20  # bytes read at a time (at most MAX_LINE_BYTES: a longer line is then never inside one chunk)


def _lines(data: bytes, path: Path, first: bool) -> pa.RecordBatch:
    """The lines of `data` (whole lines, the last one's "\n" left out) as a record batch: a line
    ends at "\n" only, a CR before it dropped (Windows' line ends); a CR anywhere else is text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        check_utf8(path)  # raises with the file, line and byte of the first invalid UTF-8
        raise UserError(f"{path}: invalid UTF-8 ({exc})") from None
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    if first and lines[0].startswith(BOM):
        lines[0] = lines[0][1:]
    return pa.record_batch([pa.array(lines, pa.string())], schema=LINES)


def _line_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The lines of a UTF-8 text file (gzip or xz too) in file order, a megabyte at a time;
    a byte-order mark at the start skipped."""
    rest, first, before = b"", True, 0
    try:
        with open_bytes(path) as f:
            while chunk := f.read(CHUNK):
                data = rest + chunk
                end = data.rfind(b"\n")
                # a line within one chunk is no longer than MAX_LINE_BYTES: only the one begun in `rest` may be
                first_end = data.find(b"\n")
                if first_end > MAX_LINE_BYTES or (first_end < 0 and len(data) > MAX_LINE_BYTES):
                    raise line_too_long(str(path), before + 1)
                if end < 0:
                    rest = data
                    continue
                rest = data[end + 1 :]
                yield _lines(data[:end], path, first)
                before += data.count(b"\n", 0, end + 1)
                first = False
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:  # e.g. a damaged .gz file
        raise UserError(f"{path}: could not be read ({exc})") from None
    if rest:
        yield _lines(rest, path, first)


def _load_lines(path: Path, cache_dir: Path | None):
    """One row per line (`text` column), in file order: row i is line i + 1. Kept as Arrow in
    `cache_dir`/lines, one copy per version of the file (`file_key`: a file rewritten under its
    old modification time is read again), or held in memory without a cache directory."""
    quiet_datasets()
    empty = UserError(f"{path}: empty file (expected one sentence per line)")
    if cache_dir is None:
        return cached_dataset(None, LINES, lambda: _line_batches(path), empty)
    name = f"{path.name}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}-"
    key = hashlib.sha256(json.dumps([LINES_VERSION, *file_key(path)]).encode()).hexdigest()[:16]
    target = cache_dir / "lines" / f"{name}{key}.arrow"
    fresh = not target.is_file()
    if fresh:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temps(target.parent, f".{name}")
    dataset = cached_dataset(target, LINES, lambda: _line_batches(path), empty,
                             target.with_name(f".{name}{os.getpid()}.{key}.tmp"))
    for old in target.parent.iterdir() if fresh else ():  # the copies of the file's earlier versions
        if old.name.startswith(name) and old.name.endswith(".arrow") and old != target:
            old.unlink(missing_ok=True)
    return dataset


def _parse_tsv(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    src, tgt, err = [], [], []
    for line in batch["text"]:
        parts = line.split("\t")
        if len(parts) == 2:
            src.append(parts[0])
            tgt.append(parts[1])
            err.append("")
        else:
            src.append("")
            tgt.append("")
            err.append(f"expected 2 tab-separated columns (source, target), found {len(parts)}")
    return {"src": src, "tgt": tgt, "_err": err}


def _parse_jsonl(batch: dict[str, list[str]], src_field: str, tgt_field: str) -> dict[str, list[str]]:
    src, tgt, err = [], [], []
    for line in batch["text"]:
        problem, pair = "", ("", "")
        try:
            obj = json.loads(line)
        except ValueError as exc:
            problem = f"expected a JSON object, got invalid JSON ({exc})"
            obj = None
        if obj is not None and not isinstance(obj, dict):
            problem = f"expected a JSON object, got {type(obj).__name__}"
        elif obj is not None:
            node = obj
            if src_field not in obj and isinstance(obj.get("translation"), dict):
                node = obj["translation"]
            s, t = node.get(src_field), node.get(tgt_field)
            missing = [name for name, v in ((src_field, s), (tgt_field, t)) if not isinstance(v, str)]
            if missing:
                fields = ", ".join(repr(m) for m in missing)
                problem = f'expected string field(s) {fields} (at the top level or under "translation")'
            elif isinstance(s, str) and isinstance(t, str):
                bad = next(((name, u) for name, v in ((src_field, s), (tgt_field, t)) if (u := lone_surrogate(v))), None)
                if bad is not None:
                    problem = (f"field {bad[0]!r} holds a lone surrogate ({bad[1]}), which is no character; "
                               "expected text that UTF-8 can encode")
                else:
                    pair = (s, t)
        src.append(pair[0])
        tgt.append(pair[1])
        err.append(problem)
    return {"src": src, "tgt": tgt, "_err": err}


def _first_error(ds, path: Path) -> None:
    """Raise the first per-line problem a parse step recorded in the `_err` column."""
    bad = pc.not_equal(ds.data.column("_err"), "")
    index = pc.index(bad, True).as_py()
    if index >= 0:
        raise UserError(f"{path}:{index + 1}: {ds[index]['_err']}")


def read_parallel(
    value: SplitValue, src_lang: str, tgt_lang: str, cache_dir: Path | None = None, *, format: str = "auto",
    src_field: str | None = None, tgt_field: str | None = None, num_proc: int = 1,
):
    """Read a split into a `datasets.Dataset` with columns `src` and `tgt`, one row per line.

    Raises UserError for a missing file, invalid UTF-8 (file, line, byte), differing line
    counts, a TSV row without exactly two columns, a JSONL line that is not a JSON object or
    lacks a field.
    """
    datasets = quiet_datasets()
    source = split_source(value, src_lang, tgt_lang, format)
    proc = num_proc if num_proc > 1 else None
    if source.hub is not None:
        from seq2seq_cli.data.hub import read_hub

        return read_hub(source.hub, src_lang, tgt_lang, num_proc, cache_dir)
    if source.format == "text":
        src_file, tgt_file = source.files
        # each side's pages go once it is loaded, so the read's peak holds one side, not both
        src, tgt = (_released(_load_lines(f, cache_dir)) for f in source.files)
        if len(src) != len(tgt):
            raise UserError(
                f"{src_file} has {len(src)} lines but {tgt_file} has {len(tgt)}; "
                "source and target files must be aligned line by line"
            )
        return _released(datasets.concatenate_datasets([src.rename_column("text", "src"), tgt.rename_column("text", "tgt")],
                                                       axis=1))
    (path,) = source.files
    if source.format == "moses":
        from seq2seq_cli.data.moses import read_moses

        return read_moses(path, src_lang, tgt_lang, cache_dir)
    if source.format == "tmx":
        from seq2seq_cli.data.tmx import read_tmx

        return read_tmx(path, src_lang, tgt_lang, cache_dir)
    lines = _load_lines(path, cache_dir)
    if source.format == "tsv":
        parsed = lines.map(_parse_tsv, batched=True, batch_size=READ_BATCH, remove_columns=["text"], num_proc=proc)
    else:
        fields = {"src_field": src_field or src_lang, "tgt_field": tgt_field or tgt_lang}
        parsed = lines.map(_parse_jsonl, batched=True, batch_size=READ_BATCH, remove_columns=["text"],
                           fn_kwargs=fields, num_proc=proc)
    _first_error(parsed, path)
    return _released(parsed.remove_columns("_err"))


def _released(dataset):
    """`dataset`, with this process's resident pages of its Arrow files dropped: building and
    checking them faulted in every page, which would otherwise stay in the RSS of whatever
    comes next (a tokenizer trained on a sample, the encoding) as the whole corpus."""
    release_dataset(dataset)
    return dataset


def read_split(config, value: SplitValue):
    """`read_parallel` of one split with the config's data settings (format, fields, processes),
    datasets' own cache in RUN/cache. `config` is a `seq2seq_cli.config.Config`."""
    d = config.data
    src_lang, tgt_lang = d.pair_of(value)
    return read_parallel(value, src_lang, tgt_lang, RunLayout(config.run_path).cache, format=d.format,
                         src_field=d.src_field, tgt_field=d.tgt_field, num_proc=d.num_proc)
