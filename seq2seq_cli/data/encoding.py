"""Parallel corpora encoded: SentencePiece ids, filtered, cached as Arrow.

Splits are read and checked line by line by `formats` (text, TSV, JSONL, gzip). Encoded
splits are cached as Arrow under RUN/cache/encoded/, keyed by a fingerprint of the input
files, the tokenizer model(s) and the filter settings, and memory-mapped for training: only
the length arrays live in memory, a batch's rows are gathered from Arrow when it is
collated (`batching`).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seq2seq_cli.data.formats import Source, quiet_datasets, read_split, split_source
from seq2seq_cli.data.pages import PageRelease, release_pages
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import remove_dead_temps
from seq2seq_cli.ids import BOS
from seq2seq_cli.layout import RunLayout

CACHE_VERSION = 1
ENCODE_BATCH = 1000
PAIRS_FILE = "pairs.arrow"
BUILDING = ".building-"  # RUN/cache/encoded/.building-PID.SPLIT-FINGERPRINT.tmp while a split is encoded


class Drop(enum.IntEnum):
    """Why a pair is dropped: the code in the `_drop` column while encoding (duplicates are
    found afterwards, across rows). `key` names it in counts, the cache's stats and metrics."""

    KEPT = 0
    EMPTY = 1
    TOO_LONG = 2
    RATIO = 3
    DUPLICATE = 4

    @property
    def key(self) -> str:
        return self.name.lower()


@dataclass
class Sampling:
    """Subword regularisation of training batches (SentencePiece sampling / BPE dropout)."""

    src_sp: Any
    tgt_sp: Any
    alpha: float
    nbest: int
    max_src_len: int
    max_tgt_len: int


@dataclass
class EncodedCorpus:
    """Encoded pairs of one split, in an Arrow table with columns `src_ids` (EOS not included)
    and `tgt_ids` (no BOS/EOS), and `src`/`tgt` text when read from files. The length arrays
    count EOS (source) or BOS/EOS (target). `decoder_start` is the id that starts the
    decoder's input (the model's `decoder_start_id`: bos, or pad in Marian models)."""

    table: pa.Table
    src_lens: np.ndarray
    tgt_lens: np.ndarray
    dropped: dict[str, int] = field(default_factory=dict)
    sampling: Sampling | None = None
    from_cache: bool = False
    cache_path: Path | None = None
    release: Callable[[], None] | None = None  # drops the memory map's pages from this process
    decoder_start: int = BOS
    parts: list[Any] | None = None  # several weighted corpora (`corpora.Part`s, in row order); None: one split
    prefix: list[int] = field(default_factory=list)  # the ids put in front of each source (a corpus tag)

    def __len__(self) -> int:
        return len(self.src_lens)

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]], dropped: dict[str, int] | None = None) -> EncodedCorpus:
        ids = pa.list_(pa.int32())
        table = pa.table({"src_ids": pa.array(src, type=ids), "tgt_ids": pa.array(tgt, type=ids)})
        lens = [np.array([len(x) + 1 for x in seqs], dtype=np.int32) for seqs in (src, tgt)]
        return cls(table, lens[0], lens[1], dict(dropped or {}))


@dataclass(frozen=True)
class Filters:
    """What drops a training pair (lengths in subwords, EOS not counted)."""

    max_src_len: int | None = None
    max_tgt_len: int | None = None
    max_len_ratio: float | None = None
    dedup: bool = False


def _encode_batch(
    batch: dict[str, list[str]], src_sp, tgt_sp, filters: Filters, release_dir: str | None = None,
    prefix: list[int] | None = None,
) -> dict[str, list]:
    if release_dir:  # pages of the memory-mapped input already read (per process: map workers too)
        release_pages(release_dir)
    src_ids, tgt_ids = src_sp.encode(batch["src"]), tgt_sp.encode(batch["tgt"])
    if prefix:  # a corpus tag: its id in front of each source that has one (an empty source stays empty)
        src_ids = [prefix + s if s else s for s in src_ids]
    drop, hashes = [], []
    for s, t, text_s, text_t in zip(src_ids, tgt_ids, batch["src"], batch["tgt"]):
        ls, lt = len(s), len(t)
        if not ls or not lt:
            code = Drop.EMPTY
        elif (filters.max_src_len and ls > filters.max_src_len) or (filters.max_tgt_len and lt > filters.max_tgt_len):
            code = Drop.TOO_LONG
        elif filters.max_len_ratio and max(ls, lt) > filters.max_len_ratio * min(ls, lt):
            code = Drop.RATIO
        else:
            code = Drop.KEPT
        drop.append(int(code))
        if filters.dedup:
            digest = hashlib.blake2b(f"{text_s}\t{text_t}".encode(), digest_size=8).digest()
            hashes.append(int.from_bytes(digest, "little", signed=True))
        else:
            hashes.append(0)
    return {
        "src_ids": src_ids, "tgt_ids": tgt_ids,
        "src_len": [len(s) + 1 for s in src_ids], "tgt_len": [len(t) + 1 for t in tgt_ids],
        "_drop": drop, "_hash": hashes,
    }


def _encode(dataset, src_sp, tgt_sp, filters: Filters, num_proc: int = 1, cache_file: Path | None = None,
            release_dir: Path | None = None, prefix: list[int] | None = None):
    """Batched `datasets.map` that adds ids, lengths, a drop code and a pair hash to each row."""
    datasets = quiet_datasets()
    ids = datasets.List(datasets.Value("int32")) if hasattr(datasets, "List") else datasets.Sequence(datasets.Value("int32"))
    features = datasets.Features({
        "src": datasets.Value("string"), "tgt": datasets.Value("string"), "src_ids": ids, "tgt_ids": ids,
        "src_len": datasets.Value("int32"), "tgt_len": datasets.Value("int32"),
        "_drop": datasets.Value("int8"), "_hash": datasets.Value("int64"),
    })
    return dataset.map(
        _encode_batch, batched=True, batch_size=ENCODE_BATCH, features=features,
        fn_kwargs={"src_sp": src_sp, "tgt_sp": tgt_sp, "filters": filters,
                   "release_dir": str(release_dir) if release_dir else None, "prefix": prefix or None},
        num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(cache_file) if cache_file else None,
        keep_in_memory=cache_file is None, load_from_cache_file=False,
    )


def column_values(table, name: str, dtype, release: Callable[[], None] | None = None, every: int = 64) -> np.ndarray:
    """One column of a (memory-mapped) Arrow table as a numpy array, read chunk by chunk with
    `release` called every `every` chunks: reading even a narrow column faults in the pages
    around it, which for a memory-mapped file would otherwise stay resident all at once."""
    col = table.column(name)
    out = np.empty(len(col), dtype=dtype)
    start = 0
    for i, chunk in enumerate(col.chunks):
        out[start : start + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        start += len(chunk)
        if release is not None and i % every == every - 1:
            release()
    return out


def _keep(encoded, dedup: bool, release: Callable[[], None] | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of the rows that survive the filters, and how many each reason dropped."""
    drop = column_values(encoded.data, "_drop", encoded.data.column("_drop").type.to_pandas_dtype(), release)
    keep = drop == int(Drop.KEPT)
    dropped = {code.key: int((drop == int(code)).sum()) for code in (Drop.EMPTY, Drop.TOO_LONG, Drop.RATIO)}
    dropped[Drop.DUPLICATE.key] = 0
    if dedup:
        kept = np.flatnonzero(keep)
        hashes = encoded.data.column("_hash").to_numpy()[kept]
        _, first = np.unique(hashes, return_index=True)
        unique = np.zeros(len(kept), dtype=bool)
        unique[first] = True
        keep[kept[~unique]] = False
        dropped[Drop.DUPLICATE.key] = int((~unique).sum())
    return np.flatnonzero(keep), dropped


def _corpus(table: pa.Table, dropped: dict[str, int], release: Callable[[], None] | None = None) -> EncodedCorpus:
    return EncodedCorpus(
        table, column_values(table, "src_len", np.int32, release), column_values(table, "tgt_len", np.int32, release), dropped,
    )


def _open_pairs(path: Path) -> tuple[pa.Table, PageRelease]:
    """The kept pairs' Arrow stream, memory-mapped, and what drops its resident pages. Read
    record batch by record batch with the pages dropped as it goes: reading the whole stream
    at once would fault in pages all over the file and hold them together."""
    source = pa.memory_map(str(path))
    release = PageRelease(path.parent)
    reader = pa.ipc.open_stream(source)
    batches = []
    for i, batch in enumerate(reader):
        batches.append(batch)
        if i % 64 == 63:
            release()
    release()
    return pa.Table.from_batches(batches, schema=reader.schema), release


def encode_corpus(dataset, src_sp, tgt_sp, max_src_len: int | None = None, max_tgt_len: int | None = None) -> EncodedCorpus:
    """Encode a `src`/`tgt` dataset in memory; drop (and count) pairs that are empty or longer
    than the limits (in subwords)."""
    encoded = _encode(dataset, src_sp, tgt_sp, Filters(max_src_len, max_tgt_len))
    keep, dropped = _keep(encoded, False)
    return _corpus(encoded.select(keep).flatten_indices(keep_in_memory=True).data.table, dropped)


def _write_kept(encoded, keep: np.ndarray, path: Path, release: Callable[[], None]) -> None:
    """Stream the rows `keep` of `encoded`, without the drop code and hash columns, to an
    Arrow file one record batch at a time, releasing the pages read as it goes."""
    mask = np.zeros(len(encoded), dtype=bool)
    mask[keep] = True
    table = encoded.data.table if hasattr(encoded.data, "table") else encoded.data
    table = table.drop_columns(["_drop", "_hash"]).replace_schema_metadata(None)
    start = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for i, batch in enumerate(table.to_batches(max_chunksize=ENCODE_BATCH)):
            writer.write_batch(batch.filter(pa.array(mask[start : start + len(batch)])))
            start += len(batch)
            if i % 64 == 63:
                release()


def _fingerprint(source: Source, src_sp, tgt_sp, settings: dict[str, Any]) -> str:
    h = hashlib.sha256()
    files = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in source.files]
    h.update(json.dumps({"version": CACHE_VERSION, "format": source.format, "files": files, **settings}).encode())
    h.update(_model_bytes(src_sp))
    h.update(_model_bytes(tgt_sp))
    return h.hexdigest()[:20]


def _model_bytes(tok: Any) -> bytes:
    """What determines a tokenizer's ids: the SentencePiece model, and the vocabulary file's
    mapping for a `VocabTokenizer`."""
    if hasattr(tok, "vocab") and hasattr(tok, "sp"):
        return tok.sp.serialized_model_proto() + json.dumps(tok.vocab, sort_keys=True).encode()
    return tok.serialized_model_proto()


def _empty_line(source: Source, index: int, side: str, langs: tuple[str, str] | None = None) -> UserError:
    """The on_empty: error message for pair `index` (0-based), naming the file that holds `side`."""
    path = source.files[0 if side == "source" or len(source.files) == 1 else 1]
    line = index + 1
    if source.format == "tmx" and langs is not None:  # a unit of a TMX file: the line of its <tu>
        from seq2seq_cli.data.tmx import unit_line

        line = unit_line(path, index, *langs)
    return UserError(f"{path}:{line}: empty {side} sentence (data.on_empty: error; set skip to drop such pairs)")


def _empty_error(encoded, source: Source, langs: tuple[str, str]) -> None:
    """on_empty: error -> raise for the first pair with an empty side, naming its file and line."""
    index = pc.index(pc.equal(encoded.data.column("_drop"), int(Drop.EMPTY)), True).as_py()
    if index < 0:
        return
    row = encoded[index]
    raise _empty_line(source, index, "source" if not row["src_ids"] else "target", langs)


def check_no_empty_lines(raw, value: str, d) -> None:
    """data.on_empty: error -> raise for the first pair whose source or target text is blank,
    naming its file and line (checked on the text, before a tokenizer is trained)."""
    source = split_source(value, d.src_lang, d.tgt_lang, d.format)
    first = {
        side: pc.index(pc.equal(pc.utf8_trim_whitespace(raw.data.column(column)), ""), True).as_py()
        for side, column in (("source", "src"), ("target", "tgt"))
    }
    found = {side: index for side, index in first.items() if index >= 0}
    if found:
        side = min(found, key=lambda s: (found[s], s != "source"))  # the earliest pair; its source first
        raise _empty_line(source, found[side], side, (d.src_lang, d.tgt_lang))


def encoded_split(
    config, value: str, src_sp, tgt_sp, training: bool, log: Callable[[str], None] = lambda _: None,
    cached: Path | None = None, label: str | None = None, prefix: list[int] | None = None,
) -> EncodedCorpus:
    """The encoded, filtered pairs of a split, from RUN/cache/encoded/ when the input files,
    tokenizer model(s) and filter settings are unchanged, else encoded (batched `datasets.map`,
    data.num_proc processes) and cached there. The data filters apply to training; validation
    drops only empty pairs and those longer than the model's positions (EOS or start counted).
    `cached` names a cache another process made of the same split (rank 0 under torchrun, from
    its copy of the files), read as it is. `label` names the cache (one per label: train,
    valid, or train.N for corpus N of several); `prefix` (a tag's id) goes in front of every
    source, counted by the length filters."""
    quiet_datasets()
    d, t = config.data, config.tokenizer
    source = split_source(value, d.src_lang, d.tgt_lang, d.format)
    fits = config.model.max_positions - 1
    filters = Filters(d.max_src_len, d.max_tgt_len, d.max_len_ratio, d.dedup) if training else Filters(fits, fits)
    settings = {"filters": filters.__dict__, "on_empty": d.on_empty, "src_lang": d.src_lang, "tgt_lang": d.tgt_lang,
                "src_field": d.src_field, "tgt_field": d.tgt_field}
    if prefix:
        settings["prefix"] = list(prefix)
    label = label or ("train" if training else "valid")
    root = RunLayout(config.run_path).encoded
    path = cached or root / f"{label}-{_fingerprint(source, src_sp, tgt_sp, settings)}"
    from_cache = (path / "stats.json").is_file()
    if from_cache:
        log(f"reusing encoded {source.describe()} from {path}")
    else:
        # what a killed encoding left behind (named by its process id) goes; a live one's stays
        remove_dead_temps(root, BUILDING)
        build = root / f"{BUILDING}{os.getpid()}.{path.name}.tmp"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        try:
            raw = read_split(config, value)
            encoded = _encode(raw, src_sp, tgt_sp, filters, d.num_proc, build / "encoded.arrow", RunLayout(config.run_path).cache,
                              prefix)
            # Each step that reads `datasets`' Arrow files faults in pages all over them: they
            # are dropped after every step, so that the steps' pages do not add up.
            release = PageRelease(RunLayout(config.run_path).cache)
            release()
            if d.on_empty == "error":
                _empty_error(encoded, source, (d.src_lang, d.tgt_lang))
            keep, dropped = _keep(encoded, filters.dedup, release)
            release()
            (build / "dataset").mkdir()
            _write_kept(encoded, keep, build / "dataset" / PAIRS_FILE, release)
            (build / "dataset" / "stats.json").write_text(json.dumps({"pairs": len(keep), "dropped": dropped}))
            del encoded, raw
            for old in root.glob(f"{label}-*"):  # one cache per split is kept: older ones are stale
                if not old.name.startswith(BUILDING):
                    shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(build / "dataset", path)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    stats = json.loads((path / "stats.json").read_text())
    pairs, release_kept = _open_pairs(path / PAIRS_FILE)
    corpus = _corpus(pairs, stats["dropped"], release_kept)
    corpus.from_cache, corpus.cache_path = from_cache, path
    corpus.release = release_kept
    corpus.release()  # reading the length columns mapped pages all over the file
    corpus.decoder_start = config.model.decoder_start_id
    corpus.prefix = list(prefix or [])
    if training and t.sampling:
        corpus.sampling = Sampling(src_sp, tgt_sp, t.alpha, t.nbest, d.max_src_len, d.max_tgt_len)
    return corpus


def describe_drops(corpus: EncodedCorpus, config) -> str:
    """What the filters dropped from a training split, in words."""
    d, dropped = config.data, corpus.dropped
    # the length limits always apply to training (data.max_src_len/max_tgt_len are required)
    parts = [f"{dropped.get('empty', 0)} empty", f"{dropped.get('too_long', 0)} over {d.max_src_len}/{d.max_tgt_len} subwords"]
    if d.max_len_ratio:
        parts.append(f"{dropped.get('ratio', 0)} over length ratio {d.max_len_ratio:g}")
    if d.dedup:
        parts.append(f"{dropped.get('duplicate', 0)} duplicates")
    return "dropped " + ", ".join(parts)
