"""Pairs whose words do not go together: each pair scored by the co-occurrence of its words
across the corpus itself (no model), and the pairs far below the corpus's median dropped.

What it finds is what no rule sees: a source with another sentence's translation. Words are runs
of letters, lower-cased, each counted once per side. A pair's score: for each source word, its
best Dice coefficient with a word of the target, the pair's own co-occurrence left out
(2 (c - 1) / (f_s + f_t - 2)), averaged with weights log(N / f_s) (a rare word says more than
"the" or "y"); the same from the target side; the lower of the two. A word found in no other
pair weighs nothing, and a pair with no word seen elsewhere on a side is not scored (kept), so
a language written without spaces passes untouched.

Memory is fixed whatever the corpus's size: word pairs are counted in a count-min sketch (two
tables of 2^23 counters, the lower of the two read) and words in hashed tables: about 170 MB at
the peak.
Two passes over the pairs, one counting, one scoring.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator

import numpy as np

WORD = re.compile(r"[^\W\d_]+")
MIN_PAIRS = 2000  # fewer pairs say too little about which words go together: the filter keeps them all
WORD_BITS, PAIR_BITS = 20, 23
CHUNK = 4096  # pairs counted at a time
_WORD_MASK = np.uint64((1 << WORD_BITS) - 1)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_HASHES = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_SHIFT = np.uint64(64 - PAIR_BITS)

Batches = Callable[[], Iterator[tuple[np.ndarray, list[str], list[str]]]]


def words(text: str) -> np.ndarray:
    """The hashes of a text's words, each once."""
    return np.array(sorted({zlib.crc32(w.encode()) for w in WORD.findall(text.lower())}), dtype=np.uint64)


def _pair_keys(s: np.ndarray, t: np.ndarray, mult: np.uint64) -> np.ndarray:
    """The counter of each (source word, target word) in one table of the sketch, as a |s| x |t| grid."""
    return ((((s[:, None] * _MIX) + t[None, :]) * mult) >> _SHIFT).astype(np.int64)


def _count(table: np.ndarray, keys: np.ndarray) -> None:
    """table[k] += 1 for each k of keys (repeats counted): one pass of bincount, where np.add.at
    scatters one key at a time."""
    np.add(table, np.bincount(keys, minlength=len(table)), out=table, casting="unsafe")


class Counts:
    """How often each word (per side) and each pair of words (source, target) occurs across pairs."""

    def __init__(self) -> None:
        self.pairs = 0
        self.src = np.zeros(1 << WORD_BITS, dtype=np.int64)
        self.tgt = np.zeros(1 << WORD_BITS, dtype=np.int64)
        self.sketch = [np.zeros(1 << PAIR_BITS, dtype=np.int32) for _ in _HASHES]

    def add(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Count a chunk of pairs (each side's word hashes)."""
        self.pairs += len(pairs)
        for table, side in ((self.src, 0), (self.tgt, 1)):
            found = [pair[side] for pair in pairs]
            if found:
                _count(table, (np.concatenate(found) & _WORD_MASK).astype(np.int64))
        both = [(s, t) for s, t in pairs if len(s) and len(t)]
        for sketch, mult in zip(self.sketch, _HASHES):
            if both:
                _count(sketch, np.concatenate([_pair_keys(s, t, mult).ravel() for s, t in both]))

    def score(self, s: np.ndarray, t: np.ndarray) -> float:
        """The pair's score (NaN: not scored), the pair itself counted in the tables."""
        if not len(s) or not len(t):
            return float("nan")
        c = np.minimum.reduce([table[_pair_keys(s, t, mult)] for table, mult in zip(self.sketch, _HASHES)])
        fs, ft = self.src[(s & _WORD_MASK).astype(np.int64)], self.tgt[(t & _WORD_MASK).astype(np.int64)]
        dice = np.minimum(2.0 * (c - 1) / np.maximum(fs[:, None] + ft[None, :] - 2, 1), 1.0)
        n = max(self.pairs, 2)
        sides = []
        for best, f in ((dice.max(1), fs), (dice.max(0), ft)):
            weight = np.where(f > 1, np.log(n / np.maximum(f, 1)), 0.0)
            if weight.sum() > 0:
                sides.append(float((best * weight).sum() / weight.sum()))
        return min(sides) if len(sides) == 2 else float("nan")


def text_batches(table, size: int, release: Callable[[], None] | None = None) -> Batches:
    """`low_pairs`' reader of an Arrow table with `src` and `tgt` columns: the row numbers, sources
    and targets, `size` rows at a time (`release`, when given, called every 64 batches to drop
    the pages read from a memory-mapped table)."""

    def batches() -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
        start = 0
        for i, batch in enumerate(table.select(["src", "tgt"]).to_batches(max_chunksize=size)):
            yield np.arange(start, start + len(batch)), batch.column(0).to_pylist(), batch.column(1).to_pylist()
            start += len(batch)
            if release is not None and i % 64 == 63:
                release()

    return batches


def low_pairs(batches: Batches, rows: np.ndarray, share: float) -> np.ndarray:
    """The rows (of `rows`, the pairs still kept) whose score is below `share` of the median
    score of those rows; none when fewer than MIN_PAIRS. `batches()` yields (the row numbers,
    the sources, the targets) of the corpus in row order, once for counting, once for scoring."""
    if len(rows) < MIN_PAIRS:
        return np.empty(0, dtype=np.int64)
    rows = np.unique(rows)
    wanted = np.zeros(int(rows[-1]) + 1, dtype=bool)
    wanted[rows] = True

    def pairs() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for numbers, src, tgt in batches():
            for n, s, t in zip(numbers, src, tgt):
                if n < len(wanted) and wanted[n]:
                    yield words(s), words(t)

    counts = Counts()
    chunk: list[tuple[np.ndarray, np.ndarray]] = []
    for pair in pairs():
        chunk.append(pair)
        if len(chunk) == CHUNK:
            counts.add(chunk)
            chunk = []
    counts.add(chunk)
    values = np.full(len(rows), np.nan)
    for k, (s, t) in enumerate(pairs()):  # the rows in order
        values[k] = counts.score(s, t)
    if np.isnan(values).all():
        return np.empty(0, dtype=np.int64)
    return rows[values < share * np.nanmedian(values)]  # NaN compares False: kept
