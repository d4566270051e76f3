"""Parallel corpora: encode, filter, cache, batch.

Splits are read and checked line by line by `formats` (text, TSV, JSONL, gzip). Encoded
splits are cached as Arrow under RUN/cache/encoded/, keyed by a fingerprint of the input
files, the tokenizer model(s) and the filter settings, and memory-mapped for training: only
the length arrays live in memory, a batch's rows are gathered from Arrow when it is
collated. Batches hold at most `max_tokens` source or target tokens, padding included, with
pairs of similar length together; their order is shuffled each epoch from the seed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import Tensor

from seq2seq_cli.errors import UserError
from seq2seq_cli.formats import Source, quiet_datasets, read_parallel, read_split, split_source  # noqa: F401 (read_parallel: re-exported)
from seq2seq_cli.ids import BOS, EOS, PAD

CACHE_VERSION = 1
DROP_REASONS = ("empty", "too_long", "ratio", "duplicate")  # codes 1.. in the `_drop` column
ENCODE_BATCH = 1000
PAIRS_FILE = "pairs.arrow"


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
    count EOS (source) or BOS/EOS (target)."""

    table: pa.Table
    src_lens: np.ndarray
    tgt_lens: np.ndarray
    dropped: dict[str, int] = field(default_factory=dict)
    sampling: Sampling | None = None
    from_cache: bool = False
    cache_path: Path | None = None
    release: Callable[[], None] | None = None  # drops the memory map's pages from this process

    def __len__(self) -> int:
        return len(self.src_lens)

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]], dropped: dict[str, int] | None = None) -> EncodedCorpus:
        ids = pa.list_(pa.int32())
        table = pa.table({"src_ids": pa.array(src, type=ids), "tgt_ids": pa.array(tgt, type=ids)})
        lens = [np.array([len(x) + 1 for x in seqs], dtype=np.int32) for seqs in (src, tgt)]
        return cls(table, lens[0], lens[1], dict(dropped or {}))


# --------------------------------------------------------------------------- encoding


class PageRelease:
    """Drop this process's resident pages of the memory-mapped files under a directory
    (madvise DONTNEED; Linux). The data stays in the file and the page cache and is read back
    on the next access, so a training process's RSS does not grow with the part of the corpus
    it has already visited. Only read-only file mappings listed in /proc/self/maps are touched."""

    def __init__(self, directory: Path) -> None:
        self.ranges: list[tuple[int, int]] = []
        advice = getattr(mmap, "MADV_DONTNEED", None)
        root = str(directory.resolve()) + os.sep
        try:
            with open("/proc/self/maps", encoding="utf-8") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].rstrip("\n").startswith(root) and "w" not in fields[1]:
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        self.ranges.append((start, end))
        except OSError:
            pass
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if self.ranges and advice is not None else None
        self._advice = advice

    def __call__(self) -> None:
        if self._madvise is not None:
            for start, end in self.ranges:
                self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), self._advice)




@dataclass(frozen=True)
class Filters:
    """What drops a training pair (lengths in subwords, EOS not counted)."""

    max_src_len: int | None = None
    max_tgt_len: int | None = None
    max_len_ratio: float | None = None
    dedup: bool = False


_RELEASES: dict[tuple[int, str], PageRelease] = {}


def _encode_batch(batch: dict[str, list[str]], src_sp, tgt_sp, filters: Filters, release_dir: str | None = None) -> dict[str, list]:
    if release_dir:  # pages of the memory-mapped input already read (per process: map workers too)
        key = (os.getpid(), release_dir)
        if key not in _RELEASES:
            _RELEASES[key] = PageRelease(Path(release_dir))
        _RELEASES[key]()
    src_ids, tgt_ids = src_sp.encode(batch["src"]), tgt_sp.encode(batch["tgt"])
    drop, hashes = [], []
    for s, t, text_s, text_t in zip(src_ids, tgt_ids, batch["src"], batch["tgt"]):
        ls, lt = len(s), len(t)
        if not ls or not lt:
            code = 1
        elif (filters.max_src_len and ls > filters.max_src_len) or (filters.max_tgt_len and lt > filters.max_tgt_len):
            code = 2
        elif filters.max_len_ratio and max(ls, lt) > filters.max_len_ratio * min(ls, lt):
            code = 3
        else:
            code = 0
        drop.append(code)
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
            release_dir: Path | None = None):
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
                   "release_dir": str(release_dir) if release_dir else None},
        num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(cache_file) if cache_file else None,
        keep_in_memory=cache_file is None, load_from_cache_file=False,
    )


def _keep(encoded, dedup: bool) -> tuple[np.ndarray, dict[str, int]]:
    """Indices of the rows that survive the filters, and how many each reason dropped."""
    drop = encoded.data.column("_drop").to_numpy()
    keep = drop == 0
    dropped = {reason: int((drop == code).sum()) for code, reason in enumerate(DROP_REASONS[:3], start=1)}
    dropped["duplicate"] = 0
    if dedup:
        kept = np.flatnonzero(keep)
        hashes = encoded.data.column("_hash").to_numpy()[kept]
        _, first = np.unique(hashes, return_index=True)
        unique = np.zeros(len(kept), dtype=bool)
        unique[first] = True
        keep[kept[~unique]] = False
        dropped["duplicate"] = int((~unique).sum())
    return np.flatnonzero(keep), dropped


def _corpus(ds, dropped: dict[str, int]) -> EncodedCorpus:
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    return EncodedCorpus(
        table, ds.data.column("src_len").to_numpy().astype(np.int32), ds.data.column("tgt_len").to_numpy().astype(np.int32),
        dropped,
    )


def encode_corpus(dataset, src_sp, tgt_sp, max_src_len: int | None = None, max_tgt_len: int | None = None) -> EncodedCorpus:
    """Encode a `src`/`tgt` dataset in memory; drop (and count) pairs that are empty or longer
    than the limits (in subwords)."""
    encoded = _encode(dataset, src_sp, tgt_sp, Filters(max_src_len, max_tgt_len))
    keep, dropped = _keep(encoded, False)
    return _corpus(encoded.select(keep).flatten_indices(keep_in_memory=True), dropped)


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
    h.update(src_sp.serialized_model_proto())
    h.update(tgt_sp.serialized_model_proto())
    return h.hexdigest()[:20]


def _empty_line(source: Source, index: int, side: str) -> UserError:
    """The on_empty: error message for pair `index` (0-based), naming the file that holds `side`."""
    path = source.files[0 if side == "source" or len(source.files) == 1 else 1]
    return UserError(f"{path}:{index + 1}: empty {side} sentence (data.on_empty: error; set skip to drop such pairs)")


def _empty_error(encoded, source: Source) -> None:
    """on_empty: error -> raise for the first pair with an empty side, naming its file and line."""
    index = pc.index(pc.equal(encoded.data.column("_drop"), 1), True).as_py()
    if index < 0:
        return
    row = encoded[index]
    raise _empty_line(source, index, "source" if not row["src_ids"] else "target")


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
        raise _empty_line(source, found[side], side)


def encoded_split(
    config, value: str, src_sp, tgt_sp, training: bool, log: Callable[[str], None] = lambda _: None
) -> EncodedCorpus:
    """The encoded, filtered pairs of a split, from RUN/cache/encoded/ when the input files,
    tokenizer model(s) and filter settings are unchanged, else encoded (batched `datasets.map`,
    data.num_proc processes) and cached there. Filters other than emptiness apply to training."""
    datasets = quiet_datasets()
    d, t = config.data, config.tokenizer
    source = split_source(value, d.src_lang, d.tgt_lang, d.format)
    filters = Filters(d.max_src_len, d.max_tgt_len, d.max_len_ratio, d.dedup) if training else Filters()
    settings = {"filters": filters.__dict__, "on_empty": d.on_empty, "src_lang": d.src_lang, "tgt_lang": d.tgt_lang,
                "src_field": d.src_field, "tgt_field": d.tgt_field}
    label = "train" if training else "valid"
    root = config.run_path / "cache" / "encoded"
    path = root / f"{label}-{_fingerprint(source, src_sp, tgt_sp, settings)}"
    from_cache = (path / "stats.json").is_file()
    if from_cache:
        log(f"reusing encoded {source.describe()} from {path}")
    else:
        build = root / f"{path.name}.building-{os.getpid()}"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        try:
            raw = read_split(config, value)
            encoded = _encode(raw, src_sp, tgt_sp, filters, d.num_proc, build / "encoded.arrow", config.run_path / "cache")
            if d.on_empty == "error":
                _empty_error(encoded, source)
            keep, dropped = _keep(encoded, filters.dedup)
            (build / "dataset").mkdir()
            _write_kept(encoded, keep, build / "dataset" / PAIRS_FILE, PageRelease(config.run_path / "cache"))
            (build / "dataset" / "stats.json").write_text(json.dumps({"pairs": len(keep), "dropped": dropped}))
            del encoded, raw
            for old in root.glob(f"{label}-*"):  # one cache per split is kept: older ones are stale
                if "building" not in old.name:
                    shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(build / "dataset", path)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    stats = json.loads((path / "stats.json").read_text())
    corpus = _corpus(datasets.Dataset.from_file(str(path / PAIRS_FILE)), stats["dropped"])
    corpus.from_cache, corpus.cache_path = from_cache, path
    corpus.release = PageRelease(path)
    corpus.release()  # reading the length columns mapped pages all over the file
    if training and t.sampling:
        corpus.sampling = Sampling(src_sp, tgt_sp, t.alpha, t.nbest, d.max_src_len, d.max_tgt_len)
    return corpus


def describe_drops(corpus: EncodedCorpus, config) -> str:
    d, dropped = config.data, corpus.dropped
    parts = [f"{dropped.get('empty', 0)} empty"]
    if "too_long" in dropped:
        parts.append(f"{dropped['too_long']} over {d.max_src_len}/{d.max_tgt_len} subwords")
    if d.max_len_ratio:
        parts.append(f"{dropped.get('ratio', 0)} over length ratio {d.max_len_ratio:g}")
    if d.dedup:
        parts.append(f"{dropped.get('duplicate', 0)} duplicates")
    return "dropped " + ", ".join(parts)


# --------------------------------------------------------------------------- batching


def token_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, rng: np.random.Generator | None = None
) -> list[np.ndarray]:
    """Group pair indices into batches of similar length with batch_size * longest <= max_tokens.

    Pairs are sorted by source then target length (ties broken at random when `rng` is
    given); with `rng` the order of the batches is shuffled too. A single pair longer than
    max_tokens forms a batch of its own.
    """
    n = len(src_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = np.lexsort((tie, tgt_lens, src_lens))
    del tie
    longest = np.maximum(src_lens, tgt_lens)[order]
    batches: list[np.ndarray] = []
    start, cur_max = 0, 0
    for i in range(n):
        new_max = max(cur_max, int(longest[i]))
        if i > start and new_max * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, new_max = i, int(longest[i])
        cur_max = new_max
    if n:
        batches.append(order[start:])
    if rng is not None:
        perm = rng.permutation(len(batches))
        batches = [batches[i] for i in perm]
    return batches


def epoch_batches(corpus: EncodedCorpus, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches of one training epoch: a pure function of (seed, epoch), so a resumed run
    sees exactly the batches an uninterrupted one would."""
    rng = np.random.default_rng([seed, epoch])
    return token_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, rng)


def pad_batch(seqs: list[list[int]], prefix: list[int], suffix: list[int]) -> Tensor:
    """Right-pad prefix+seq+suffix for each sequence -> (B, T) long tensor."""
    width = max(len(s) for s in seqs) + len(prefix) + len(suffix)
    out = np.full((len(seqs), width), PAD, dtype=np.int64)
    for row, s in enumerate(seqs):
        full = prefix + s + suffix
        out[row, : len(full)] = full
    return torch.from_numpy(out)


def _pad_flat(lens: np.ndarray, values: np.ndarray, bos: bool, eos: bool) -> Tensor:
    """Sequences given as lengths and concatenated values -> (B, T) with optional BOS/EOS."""
    lens = lens.astype(np.int64)
    start = int(bos)
    out = np.full((len(lens), int(lens.max(initial=0)) + start + int(eos)), PAD, dtype=np.int64)
    rows = np.repeat(np.arange(len(lens)), lens)
    cols = np.arange(len(values)) - np.repeat(np.cumsum(lens) - lens, lens) + start
    out[rows, cols] = values
    if bos:
        out[:, 0] = BOS
    if eos:
        out[np.arange(len(lens)), lens + start] = EOS
    return torch.from_numpy(out)


def _take(table: pa.Table, column: str, index: np.ndarray) -> pa.Array:
    """Rows `index` of a column, in that order, taken chunk by chunk: a take on the whole
    chunked column would first concatenate it, reading every page of the memory map."""
    col = table.column(column)
    starts = np.cumsum([0] + [len(c) for c in col.chunks])
    chunk = np.searchsorted(starts, index, side="right") - 1
    order = np.argsort(chunk, kind="stable")
    idx, chunk = index[order], chunk[order]
    bounds = np.flatnonzero(np.diff(chunk)) + 1
    parts = [col.chunk(int(c[0])).take(pa.array(i - starts[c[0]])) for c, i in zip(np.split(chunk, bounds), np.split(idx, bounds))]
    rows = pa.concat_arrays(parts) if parts else pa.array([], type=col.type)
    return rows.take(pa.array(np.argsort(order)))


def _gather(table: pa.Table, column: str, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, concatenated ids) of the rows `index` of a list column."""
    rows = _take(table, column, index)
    return rows.value_lengths().to_numpy(zero_copy_only=False), rows.flatten().to_numpy(zero_copy_only=False)


def _sample(corpus: EncodedCorpus, index: np.ndarray, key: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]]]:
    """Sampled segmentations of the rows `index`, a pure function of `key` (seed, epoch,
    batch): SentencePiece's generator is seeded from it and encodes on one thread. A sample
    longer than the length limit falls back to the cached segmentation."""
    import sentencepiece as spm

    s = corpus.sampling
    assert s is not None
    table = corpus.table
    texts = [_take(table, c, index).to_pylist() for c in ("src", "tgt")]
    fixed = [_take(table, c, index).to_pylist() for c in ("src_ids", "tgt_ids")]
    out = []
    for side, (sp, texts_, fixed_, limit) in enumerate(
        ((s.src_sp, texts[0], fixed[0], s.max_src_len), (s.tgt_sp, texts[1], fixed[1], s.max_tgt_len))
    ):
        spm.set_random_generator_seed(int(np.random.SeedSequence([*key, side]).generate_state(1)[0]))
        sampled = sp.encode(texts_, enable_sampling=True, alpha=s.alpha, nbest_size=s.nbest, num_threads=1)
        out.append([x if 0 < len(x) <= limit else f for x, f in zip(sampled, fixed_)])
    return out[0], out[1]


def collate(corpus: EncodedCorpus, index: np.ndarray, sample_key: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """-> src (B, S) ids+EOS, tgt_in (B, T) BOS+ids, tgt_out (B, T) ids+EOS.

    With `sample_key` (seed, epoch, batch) and subword sampling on, the batch is re-segmented
    by sampling, deterministically from the key."""
    index = np.asarray(index)
    if sample_key is not None and corpus.sampling is not None:
        src, tgt = _sample(corpus, index, sample_key)
        if corpus.release is not None:
            corpus.release()
        return pad_batch(src, [], [EOS]), pad_batch(tgt, [BOS], []), pad_batch(tgt, [], [EOS])
    src_lens, src_vals = _gather(corpus.table, "src_ids", index)
    tgt_lens, tgt_vals = _gather(corpus.table, "tgt_ids", index)
    if corpus.release is not None:
        corpus.release()
    return _pad_flat(src_lens, src_vals, False, True), _pad_flat(tgt_lens, tgt_vals, True, False), _pad_flat(tgt_lens, tgt_vals, False, True)
