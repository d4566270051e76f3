"""Parallel corpora encoded: SentencePiece ids, filtered, cached as Arrow.

Splits are read and checked line by line by `formats` (text, TSV, JSONL, gzip). Encoded
splits are cached as Arrow under RUN/cache/encoded/, keyed by a fingerprint of the input
files, the tokenizer model(s) and the filter settings, and memory-mapped for training: only
the length arrays live in memory, a batch's rows are gathered from Arrow when it is
collated (`batching`).
"""

from __future__ import annotations

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

from seq2seq_cli.config import CorpusConfig
from seq2seq_cli.data.filters import DESCRIPTIONS, ORDER, Drop, Filters, check_batch, read_scores, training_filters
from seq2seq_cli.data.formats import Source, SplitValue, quiet_datasets, read_split, split_source
from seq2seq_cli.data.pages import PageRelease, release_pages
from seq2seq_cli.data.stats import DROPPED_FILE, split_stats, write_dropped
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import file_key, remove_dead_temps
from seq2seq_cli.ids import BOS
from seq2seq_cli.layout import RunLayout

CACHE_VERSION = 2
ENCODE_BATCH = 1000
PAIRS_FILE = "pairs.arrow"
BUILDING = ".building-"  # RUN/cache/encoded/.building-PID.SPLIT-FINGERPRINT.tmp while a split is encoded


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
    source: dict[str, Any] = field(default_factory=dict)  # where the pairs came from (`Source.record`)

    def __len__(self) -> int:
        return len(self.src_lens)

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]], dropped: dict[str, int] | None = None) -> EncodedCorpus:
        ids = pa.list_(pa.int32())
        table = pa.table({"src_ids": pa.array(src, type=ids), "tgt_ids": pa.array(tgt, type=ids)})
        lens = [np.array([len(x) + 1 for x in seqs], dtype=np.int32) for seqs in (src, tgt)]
        return cls(table, lens[0], lens[1], dict(dropped or {}))


def _encode_batch(
    batch: dict[str, list[str]], src_sp, tgt_sp, filters: Filters, release_dir: str | None = None,
    prefix: list[int] | None = None,
) -> dict[str, list]:
    if release_dir:  # pages of the memory-mapped input already read (per process: map workers too)
        release_pages(release_dir)
    src_ids, tgt_ids = src_sp.encode(batch["src"]), tgt_sp.encode(batch["tgt"])
    if prefix:  # a corpus tag: its id in front of each source that has one (an empty source stays empty)
        src_ids = [prefix + s if s else s for s in src_ids]
    drop, hashes = check_batch(batch["src"], batch["tgt"], src_ids, tgt_ids, filters)
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


def _arrow(encoded) -> pa.Table:
    """The pyarrow table under an encoded `datasets.Dataset`."""
    return encoded.data.table if hasattr(encoded.data, "table") else encoded.data


def _keep(encoded, dedup: str | bool, release: Callable[[], None] | None = None,
          scores: tuple[Any, float] | None = None,
          cooccurrence: float | None = None) -> tuple[np.ndarray, dict[str, int], np.ndarray]:
    """Indices of the rows that survive the filters, how many each filter dropped (every
    filter of `ORDER` named, 0 where none), and each row's drop code. Then, among the rows
    still kept: `cooccurrence` (the share of the median pair's co-occurrence score below which
    a pair goes), `scores` ((the corpus's scores, the lowest share to drop)), duplicates."""
    drop = column_values(encoded.data, "_drop", encoded.data.column("_drop").type.to_pandas_dtype(), release)
    drop = drop.astype(np.int8)
    if cooccurrence:
        from seq2seq_cli.data.cooccurrence import low_pairs, text_batches

        kept = np.flatnonzero(drop == int(Drop.KEPT))
        drop[low_pairs(text_batches(_arrow(encoded), ENCODE_BATCH, release), kept, cooccurrence)] = int(Drop.COOCCURRENCE)
    if scores is not None:
        values, share = np.asarray(scores[0], dtype=np.float64), scores[1]
        lowest = np.argsort(values, kind="stable")[: int(share * len(values))]
        mine = lowest[drop[lowest] == int(Drop.KEPT)]
        drop[mine] = int(Drop.SCORE)
    if dedup and dedup != "off":
        kept = np.flatnonzero(drop == int(Drop.KEPT))
        hashes = column_values(encoded.data, "_hash", np.int64, release)[kept]
        _, first = np.unique(hashes, return_index=True)
        unique = np.zeros(len(kept), dtype=bool)
        unique[first] = True
        drop[kept[~unique]] = int(Drop.DUPLICATE)
    counts = np.bincount(drop, minlength=len(Drop))
    dropped = {code.key: int(counts[int(code)]) for code in ORDER}
    return np.flatnonzero(drop == int(Drop.KEPT)), dropped, drop


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
    keep, dropped, _ = _keep(encoded, False)
    return _corpus(encoded.select(keep).flatten_indices(keep_in_memory=True).data.table, dropped)


def _write_kept(encoded, keep: np.ndarray, path: Path, release: Callable[[], None]) -> None:
    """Stream the rows `keep` of `encoded`, without the drop code and hash columns, to an
    Arrow file one record batch at a time, releasing the pages read as it goes."""
    mask = np.zeros(len(encoded), dtype=bool)
    mask[keep] = True
    table = _arrow(encoded).drop_columns(["_drop", "_hash"]).replace_schema_metadata(None)
    start = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for i, batch in enumerate(table.to_batches(max_chunksize=ENCODE_BATCH)):
            writer.write_batch(batch.filter(pa.array(mask[start : start + len(batch)])))
            start += len(batch)
            if i % 64 == 63:
                release()


def _fingerprint(source: Source, src_sp, tgt_sp, settings: dict[str, Any]) -> str:
    h = hashlib.sha256()
    files = [file_key(f) for f in source.files]
    h.update(json.dumps({"version": CACHE_VERSION, "format": source.format, "files": files, "source": source.record(),
                         **settings}).encode())
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
    if source.hub is not None:
        return UserError(f"hub dataset {source.describe()} row {index}: empty {side} sentence "
                         "(data.on_empty: error; set skip to drop such pairs)")
    path = source.files[0 if side == "source" or len(source.files) == 1 else 1]
    line = index + 1
    if source.format == "moses" and langs is not None:  # the member of the zip that holds the side
        from seq2seq_cli.data.moses import members

        return UserError(f"{path}:{members(path, *langs)[0 if side == 'source' else 1]}:{line}: empty {side} sentence "
                         "(data.on_empty: error; set skip to drop such pairs)")
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


def check_no_empty_lines(raw, value: SplitValue, d) -> None:
    """data.on_empty: error -> raise for the first pair whose source or target text is blank,
    naming its file and line (checked on the text, before a tokenizer is trained)."""
    langs = d.pair_of(value)
    source = split_source(value, langs[0], langs[1], d.format)
    first = {
        side: pc.index(pc.equal(pc.utf8_trim_whitespace(raw.data.column(column)), ""), True).as_py()
        for side, column in (("source", "src"), ("target", "tgt"))
    }
    found = {side: index for side, index in first.items() if index >= 0}
    if found:
        side = min(found, key=lambda s: (found[s], s != "source"))  # the earliest pair; its source first
        raise _empty_line(source, found[side], side, langs)


def _split_filters(config, value: SplitValue, training: bool) -> tuple[Filters, tuple[Any, float] | None]:
    """The filters of a split: the data settings for training, the model's limit for
    validation; and the score file that drops a share of a training corpus, with that share."""
    d = config.data
    if not training:
        fits = config.model.max_positions - 1
        return Filters(fits, fits), None
    filters = training_filters(d, d.pair_of(value))
    if isinstance(value, CorpusConfig) and value.scores is not None and value.drop_lowest > 0:
        return filters, (value.scores, value.drop_lowest)
    return filters, None


def encoded_split(
    config, value: SplitValue, src_sp, tgt_sp, training: bool, log: Callable[[str], None] = lambda _: None,
    cached: Path | None = None, label: str | None = None, prefix: list[int] | None = None,
) -> EncodedCorpus:
    """The encoded, filtered pairs of a split, from RUN/cache/encoded/ when the input files,
    tokenizer model(s) and filter settings are unchanged, else encoded (batched `datasets.map`,
    data.num_proc processes, the filters checked pair by pair) and cached there, with the
    split's length histograms and dropped pairs (`stats`). The data filters apply to training
    (and a corpus's score file, `CorpusConfig.scores`); validation drops only empty pairs and
    those longer than the model's positions (EOS or start counted). `cached` names a cache
    another process made of the same split (rank 0 under torchrun, from its copy of the files),
    read as it is. `label` names the cache (one per label: train, valid, or train.N for corpus
    N of several); `prefix` (a tag's id) goes in front of every source, counted by the length
    filters."""
    quiet_datasets()
    d, t = config.data, config.tokenizer
    src_lang, tgt_lang = d.pair_of(value)
    source = split_source(value, src_lang, tgt_lang, d.format)
    filters, scores = _split_filters(config, value, training)
    settings = {"filters": filters.__dict__, "on_empty": d.on_empty, "src_lang": src_lang, "tgt_lang": tgt_lang,
                "src_field": d.src_field, "tgt_field": d.tgt_field}
    if scores is not None:
        score_file = Path(scores[0])
        settings["scores"] = [*(file_key(score_file) if score_file.is_file() else [str(score_file.resolve())]), scores[1]]
    if prefix:
        settings["prefix"] = list(prefix)
    label = label or ("train" if training else "valid")
    root = RunLayout(config.run_path).encoded
    path = cached or root / f"{label}-{_fingerprint(source, src_sp, tgt_sp, settings)}"
    from_cache = (path / "stats.json").is_file()
    if from_cache:
        log(f"reusing encoded {source.describe()} from {path}")
    else:
        _build(config, value, source, src_sp, tgt_sp, filters, scores, prefix, root, path, label)
    stats = json.loads((path / "stats.json").read_text())
    pairs, release_kept = _open_pairs(path / PAIRS_FILE)
    corpus = _corpus(pairs, stats["dropped"], release_kept)
    corpus.from_cache, corpus.cache_path, corpus.source = from_cache, path, stats.get("source", {})
    corpus.release = release_kept
    corpus.release()  # reading the length columns mapped pages all over the file
    corpus.decoder_start = config.model.decoder_start_id
    corpus.prefix = list(prefix or [])
    if training and t.sampling:
        corpus.sampling = Sampling(src_sp, tgt_sp, t.alpha, t.nbest, d.max_src_len, d.max_tgt_len)
    return corpus


def _build(config, value: SplitValue, source: Source, src_sp, tgt_sp, filters: Filters, scores: tuple[Any, float] | None,
           prefix: list[int] | None, root: Path, path: Path, label: str) -> None:
    """Encode and filter a split into the cache directory `path` (built under a temporary name
    in `root`, renamed when complete; the label's older caches removed)."""
    d = config.data
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
            _empty_error(encoded, source, d.pair_of(value))
        if scores is not None:
            scores = (read_scores(scores[0], len(encoded), str(value)), scores[1])
        keep, dropped, drop = _keep(encoded, filters.dedup, release, scores, filters.cooccurrence)
        release()
        out = build / "dataset"
        out.mkdir()
        _write_kept(encoded, keep, out / PAIRS_FILE, release)
        data = encoded.data
        write_dropped(_arrow(encoded), drop, out / DROPPED_FILE, release)
        numbers = split_stats(drop, *(column_values(data, name, np.int32, release) for name in ("src_len", "tgt_len")))
        numbers.update({"pairs": len(keep), "dropped": dropped, "source": source.record(), "corpus": str(value)})
        (out / "stats.json").write_text(json.dumps(numbers))
        del encoded, raw, data
        for old in root.glob(f"{label}-*"):  # one cache per split is kept: older ones are stale
            if not old.name.startswith(BUILDING):
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(out, path)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def describe_drops(corpus: EncodedCorpus, config) -> str:
    """What the filters dropped from a training split, in words: the length limits always
    (they always apply to training), the others where they dropped a pair."""
    d, dropped = config.data, corpus.dropped
    parts = [f"{dropped.get('empty', 0)} empty", f"{dropped.get('too_long', 0)} over {d.max_src_len}/{d.max_tgt_len} subwords"]
    if d.max_len_ratio:
        parts.append(f"{dropped.get('ratio', 0)} over length ratio {d.max_len_ratio:g}")
    if d.dedup:
        parts.append(f"{dropped.get('duplicate', 0)} duplicates")
    named = {Drop.EMPTY, Drop.TOO_LONG} | ({Drop.RATIO} if d.max_len_ratio else set()) | ({Drop.DUPLICATE} if d.dedup else set())
    parts += [f"{dropped[code.key]} {DESCRIPTIONS[code]}" for code in ORDER if code not in named and dropped.get(code.key)]
    return "dropped " + ", ".join(parts)
