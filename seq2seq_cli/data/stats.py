"""What one encoded split looks like, kept beside its cache (`encoding`): its subword lengths
and length ratios as histograms (of the pairs read and of those kept), and every dropped pair
with the filter that dropped it, in `dropped.tsv.gz`. Both are read a record batch at a
time: nothing here holds the corpus's text in memory."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq_cli.data.filters import Drop
from seq2seq_cli.layout import DROPPED

MAX_LEN = 1024  # lengths from here up share the last bin
RATIO_BINS = np.linspace(-3.0, 3.0, 61)  # log2(source / target subwords), the ends open
DROPPED_FILE = DROPPED  # beside each split's cache, as in the run
DROPPED_HEADER = "pair\tfilter\tsource\ttarget\n"
BATCH = 1000


def _flat(text: str) -> str:
    return " ".join(text.replace("\t", " ").splitlines())


def length_histograms(src_lens: np.ndarray, tgt_lens: np.ndarray) -> dict[str, list[int]]:
    """Counts of each subword length per side (EOS not counted; the last bin MAX_LEN and
    over) and of log2(source / target) in RATIO_BINS (pairs with an empty side left out)."""
    s = np.clip(src_lens.astype(np.int64) - 1, 0, MAX_LEN)
    t = np.clip(tgt_lens.astype(np.int64) - 1, 0, MAX_LEN)
    both = (s > 0) & (t > 0)
    ratio = np.clip(np.log2(s[both] / t[both]), RATIO_BINS[0], RATIO_BINS[-1])
    return {"source": np.bincount(s, minlength=MAX_LEN + 1).tolist(), "target": np.bincount(t, minlength=MAX_LEN + 1).tolist(),
            "ratio": np.histogram(ratio, RATIO_BINS)[0].tolist()}


def split_stats(drop: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> dict[str, Any]:
    """The length histograms of a split's pairs read and kept: `drop` is each row's final drop
    code, `src` and `tgt` its lengths (EOS counted)."""
    kept = drop == int(Drop.KEPT)
    return {"read": int(len(drop)), "lengths": {"read": length_histograms(src, tgt),
                                                "kept": length_histograms(src[kept], tgt[kept])}}


def write_dropped(table, drop: np.ndarray, path: Path, release: Callable[[], None] | None = None) -> int:
    """Write every dropped row of `table` (columns src, tgt) to `path` (gzip TSV: the pair's
    number from 1, its filter, source, target; tabs and line breaks in the text become
    spaces) -> the number written."""
    names = {int(code): code.key for code in Drop}
    count, start = 0, 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=5) as out:
        out.write(DROPPED_HEADER)
        for i, batch in enumerate(table.select(["src", "tgt"]).to_batches(max_chunksize=BATCH)):
            codes = drop[start : start + len(batch)]
            rows = np.flatnonzero(codes != int(Drop.KEPT))
            if len(rows):
                src, tgt = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                for r in rows:
                    out.write(f"{start + r + 1}\t{names[int(codes[r])]}\t{_flat(src[r] or '')}\t{_flat(tgt[r] or '')}\n")
                count += len(rows)
            start += len(batch)
            if release is not None and i % 64 == 63:
                release()
    return count


def percentiles(counts: list[int], qs: tuple[float, ...] = (50, 90, 99)) -> dict[str, int]:
    """Percentiles (and the maximum) of the lengths a histogram counts."""
    c = np.asarray(counts, dtype=np.int64)
    total = int(c.sum())
    if not total:
        return {**{f"p{q:g}": 0 for q in qs}, "max": 0}
    cum = np.cumsum(c)
    out = {f"p{q:g}": int(np.searchsorted(cum, q / 100 * total)) for q in qs}
    out["max"] = int(np.flatnonzero(c)[-1])
    return out


def add_histograms(a: dict[str, list[int]] | None, b: dict[str, list[int]]) -> dict[str, list[int]]:
    """The histograms of two splits together."""
    if a is None:
        return {k: list(v) for k, v in b.items()}
    return {k: (np.asarray(a[k]) + np.asarray(b[k])).tolist() for k in b}
