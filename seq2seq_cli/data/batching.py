"""Token-budget batches of an encoded corpus: length-bucketed, shuffled per epoch from the
seed, and collated into padded tensors.

Batches hold at most `max_tokens` source or target tokens, padding included, with pairs of
similar length together; their order is shuffled each epoch from the seed, so an epoch's
batches are a pure function of (seed, epoch).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import numpy as np

from seq2seq_cli.data.indices import CHUNK, index_dtype
from seq2seq_cli.ids import BOS, EOS, PAD

if TYPE_CHECKING:  # translating needs neither pyarrow nor the encoded corpora; planning batches no torch
    import pyarrow as pa
    import torch
    from torch import Tensor

    from seq2seq_cli.data.encoding import EncodedCorpus


def batch_bounds(longest: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where each batch starts among the sorted pairs (`longest`: each pair's longer side, in
    that order), and len(longest) at the end. Greedily, the batch starting at s holds the
    largest k >= 1 pairs with max(longest[s:s+k]) * k <= max_tokens. That product never
    decreases with k, so each batch's size is one search over a window of the next pairs: one
    more than a batch can hold, max_tokens // longest[s] + 1 of them (a window that all fits,
    which only pairs of length 0 make possible, is doubled)."""
    n = len(longest)
    bounds = [0]
    counts = np.arange(1, 1, dtype=np.int64)
    s = 0
    while s < n:
        width = max(2, max_tokens // max(int(longest[s]), 1) + 1)
        while True:
            width = min(width, n - s)
            if len(counts) < width:
                counts = np.arange(1, 2 * width + 1, dtype=np.int64)
            cost = np.maximum.accumulate(longest[s : s + width]) * counts[:width]
            k = int(np.searchsorted(cost, max_tokens, side="right"))
            if k < width or s + width == n:
                break
            width *= 2
        s += max(k, 1)
        bounds.append(s)
    return np.array(bounds, dtype=np.int64)


class BatchPlan(Sequence[np.ndarray]):
    """One epoch's batches without an object per batch: the pairs' indices in length order
    (`order`, one array), where each batch starts in it (`bounds`, one more than there are
    batches) and the order in which the batches are taken (`shuffle`, or None: as they lie).
    plan[i] is batch i's pair indices (a view of `order`), plan[a:b] a list of them."""

    __slots__ = ("order", "bounds", "shuffle")

    def __init__(self, order: np.ndarray, bounds: np.ndarray, shuffle: np.ndarray | None = None) -> None:
        self.order, self.bounds, self.shuffle = order, bounds, shuffle

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = operator.index(i)
        if not -n <= j < n:
            raise IndexError(f"batch {j} of {n}")
        j %= n
        k = int(self.shuffle[j]) if self.shuffle is not None else j
        return self.order[self.bounds[k] : self.bounds[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        order, bounds = self.order, self.bounds.tolist()
        for k in (self.shuffle.tolist() if self.shuffle is not None else range(len(self))):
            yield order[bounds[k] : bounds[k + 1]]

    def rows(self) -> np.ndarray:
        """Every pair index of the epoch (a pair drawn twice, twice), in length order rather
        than the batches' order."""
        return self.order


MAX_BUCKETS = 1 << 22  # (source, target) length pairs a counting sort is used for


def length_order(
    src_lens: np.ndarray, tgt_lens: np.ndarray, rng: np.random.Generator | None = None, rows: np.ndarray | None = None,
) -> np.ndarray:
    """The pairs (0..n-1, or the corpus rows `rows`) sorted by source length, then target
    length, then a random tie-break: the permutation `rng.permutation(n)` would give (made by
    shuffling an int32 arange, from the same draws), or without `rng` their position.

    A counting sort over the (source, target) length pairs, which are few: the pairs are
    taken in tie-break order a slice at a time and each is written straight to its place, so
    that nothing the size of the corpus is made but the result and the tie-break (an argsort
    would add an int64 result and its temporaries). -> int32 indices where they fit."""
    n = len(rows) if rows is not None else len(src_lens)
    out_type = index_dtype(len(src_lens))
    if not n:
        return np.zeros(0, dtype=out_type)
    pos_type = index_dtype(n)
    ranked: np.ndarray | None = None  # ranked[r]: the pair whose tie-break rank is r
    if rng is not None:
        tie = np.arange(n, dtype=pos_type)
        rng.shuffle(tie)  # == rng.permutation(n), the same draws
        ranked = np.empty(n, dtype=pos_type)
        for a in range(0, n, CHUNK):
            ranked[tie[a : a + CHUNK]] = np.arange(a, min(a + CHUNK, n), dtype=pos_type)
        del tie
    smin, smax = int(src_lens.min()), int(src_lens.max())
    tmin, tmax = int(tgt_lens.min()), int(tgt_lens.max())
    span = tmax - tmin + 1
    buckets = (smax - smin + 1) * span
    if buckets > MAX_BUCKETS:  # lengths too far apart for a counting sort: three sorts
        keys = (np.arange(n) if ranked is None else np.argsort(ranked), *(
            (tgt_lens, src_lens) if rows is None else (tgt_lens[rows], src_lens[rows])))
        order = np.lexsort(keys)
        return (order if rows is None else rows[order]).astype(out_type, copy=False)
    key_type = np.uint16 if buckets <= 1 << 16 else np.int32  # a radix sort for the first

    def pairs_and_keys(a: int) -> tuple[np.ndarray, np.ndarray]:
        """The pairs of tie-break ranks a, a+1, ... (one slice) and their length keys."""
        pair = np.arange(a, min(a + CHUNK, n), dtype=pos_type) if ranked is None else ranked[a : a + CHUNK]
        row = pair if rows is None else rows[pair]
        key = np.subtract(src_lens[row], smin, dtype=np.int64) * span + np.subtract(tgt_lens[row], tmin, dtype=np.int64)
        return row, key.astype(key_type)

    counts = np.zeros(buckets, dtype=np.int64)
    for a in range(0, n, CHUNK):
        counts += np.bincount(pairs_and_keys(a)[1], minlength=buckets)
    next_free = np.cumsum(counts) - counts  # where the next pair of each length key goes
    order = np.empty(n, dtype=out_type)
    for a in range(0, n, CHUNK):
        row, key = pairs_and_keys(a)
        by_key = np.argsort(key, kind="stable")  # the slice's pairs by key, in tie-break order
        sorted_keys = key[by_key]
        within = np.arange(len(key)) - np.searchsorted(sorted_keys, sorted_keys, side="left")
        order[next_free[sorted_keys] + within] = row[by_key]
        next_free += np.bincount(key, minlength=buckets)
    return order


def plan_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, rng: np.random.Generator | None = None,
    rows: np.ndarray | None = None,
) -> BatchPlan:
    """`token_batches` of the pairs (0..n-1, or the corpus rows `rows`, whose lengths are
    src_lens[rows] and tgt_lens[rows])."""
    order = length_order(src_lens, tgt_lens, rng, rows)
    longest = np.empty(len(order), dtype=np.result_type(src_lens, tgt_lens))
    for a in range(0, len(order), CHUNK):
        index = order[a : a + CHUNK]
        np.maximum(src_lens[index], tgt_lens[index], out=longest[a : a + CHUNK])
    bounds = batch_bounds(longest, max_tokens)
    del longest
    shuffle = rng.permutation(len(bounds) - 1) if rng is not None else None
    return BatchPlan(order, bounds, shuffle)


def token_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, rng: np.random.Generator | None = None
) -> BatchPlan:
    """Group pair indices into batches of similar length with batch_size * longest <= max_tokens.

    Pairs are sorted by source then target length (ties broken at random when `rng` is
    given); with `rng` the order of the batches is shuffled too. A single pair longer than
    max_tokens forms a batch of its own.
    """
    return plan_batches(src_lens, tgt_lens, max_tokens, rng)


def epoch_batches(corpus: EncodedCorpus, max_tokens: int, seed: int, epoch: int, one_pair: bool = False) -> BatchPlan:
    """The batches of one training epoch: a pure function of (seed, epoch), so a resumed run
    sees exactly the batches an uninterrupted one would. Of several weighted corpora, the
    epoch holds the rows `corpora.epoch_rows` draws (one corpus of weight 1: all, as one split).
    A row drawn more than once (a weight or a temperature above 1) goes into a different batch
    each time: the copies are batched apart (`copy_groups`), where sorting by length would put
    them side by side in one batch. `one_pair` (data.pair_batches: one): each batch holds the
    rows of one language pair."""
    rng = np.random.default_rng([seed, epoch])
    if corpus.parts is None:
        return plan_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, rng)
    from seq2seq_cli.data.corpora import copy_groups, epoch_rows

    rows = epoch_rows(corpus.parts, seed, epoch)
    several = len(dict.fromkeys(p.pair for p in corpus.parts)) > 1
    groups = copy_groups(corpus.parts, rows, by_pair=one_pair and several)
    if len(groups) == 1:  # every row once, in one group: as one split
        return plan_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, rng, rows)
    del rows  # the groups hold copies: the epoch's rows are not kept twice while planning
    order = np.empty(sum(len(g) for g in groups), dtype=index_dtype(len(corpus.src_lens)))  # as length_order's
    bounds, start = [np.zeros(1, dtype=np.int64)], 0
    groups.reverse()
    while groups:  # in order, each group let go once planned
        plan = plan_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, rng, groups.pop())
        order[start : start + len(plan.order)] = plan.order
        bounds.append(plan.bounds[1:].astype(np.int64) + start)
        start += len(plan.order)
    bounds_all = np.concatenate(bounds)
    return BatchPlan(order, bounds_all, rng.permutation(len(bounds_all) - 1))


def pad_batch(seqs: list[list[int]], prefix: list[int], suffix: list[int]) -> Tensor:
    """Right-pad prefix+seq+suffix for each sequence -> (B, T) long tensor."""
    import torch

    width = max(len(s) for s in seqs) + len(prefix) + len(suffix)
    out = np.full((len(seqs), width), PAD, dtype=np.int64)
    for row, s in enumerate(seqs):
        full = prefix + s + suffix
        out[row, : len(full)] = full
    return torch.from_numpy(out)


def _pad_flat(lens: np.ndarray, values: np.ndarray, bos: bool, eos: bool, first: int = BOS) -> Tensor:
    """Sequences given as lengths and concatenated values -> (B, T) with optional start
    token (`first`, BOS unless the model starts from another id) and EOS."""
    import torch

    lens = lens.astype(np.int64)
    start = int(bos)
    out = np.full((len(lens), int(lens.max(initial=0)) + start + int(eos)), PAD, dtype=np.int64)
    rows = np.repeat(np.arange(len(lens)), lens)
    cols = np.arange(len(values)) - np.repeat(np.cumsum(lens) - lens, lens) + start
    out[rows, cols] = values
    if bos:
        out[:, 0] = first
    if eos:
        out[np.arange(len(lens)), lens + start] = EOS
    return torch.from_numpy(out)


def _take(table: pa.Table, column: str, index: np.ndarray) -> pa.Array:
    """Rows `index` of a column, in that order, taken chunk by chunk: a take on the whole
    chunked column would first concatenate it, reading every page of the memory map."""
    import pyarrow as pa

    col = table.column(column)
    starts = np.cumsum([0] + [len(c) for c in col.chunks])
    chunk = np.searchsorted(starts, index, side="right") - 1
    order = np.argsort(chunk, kind="stable")
    idx, chunk = index[order], chunk[order]
    bounds = np.flatnonzero(np.diff(chunk)) + 1
    parts = [
        col.chunk(int(c[0])).take(pa.array(i - starts[c[0]])) for c, i in zip(np.split(chunk, bounds), np.split(idx, bounds))
    ]
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

    from seq2seq_cli.data.corpora import row_prefixes

    s = corpus.sampling
    assert s is not None
    table = corpus.table
    texts = [_take(table, c, index).to_pylist() for c in ("src", "tgt")]
    fixed = [_take(table, c, index).to_pylist() for c in ("src_ids", "tgt_ids")]
    empty: list[list[int]] = [[]] * len(index)
    prefixes = [row_prefixes(corpus, index), empty]  # a corpus tag goes in front of the source
    out = []
    for side, (sp, texts_, fixed_, limit) in enumerate(
        ((s.src_sp, texts[0], fixed[0], s.max_src_len), (s.tgt_sp, texts[1], fixed[1], s.max_tgt_len))
    ):
        spm.set_random_generator_seed(int(np.random.SeedSequence([*key, side]).generate_state(1)[0]))
        sampled = sp.encode(texts_, enable_sampling=True, alpha=s.alpha, nbest_size=s.nbest, num_threads=1)
        sampled = [p + list(x) if x else x for p, x in zip(prefixes[side], sampled)]
        out.append([x if 0 < len(x) <= limit else f for x, f in zip(sampled, fixed_)])
    return out[0], out[1]


@dataclass(frozen=True)
class Batch:
    """One training or validation batch: src (B, S) ids+EOS, tgt_in (B, T) start+ids, tgt_out
    (B, T) ids+EOS, and the non-pad token counts of src and tgt_out (known from the lengths,
    so nobody has to count them on the tensors). `tgt_rows` (N,): the flat positions (in B*T)
    of tgt_out that hold a target, N = tgt_tokens, also known from the lengths: the output
    layer and the loss take those rows with an index, which on a GPU needs no host sync
    (a boolean mask would)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    src_tokens: int
    tgt_tokens: int
    tgt_rows: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with its tensors on `device`; to a GPU with `non_blocking`, from pinned
        memory, so the copy overlaps the work already queued: its tensors packed into one
        pinned buffer and copied at once (`packed_copy`)."""
        import torch

        parts = [self.src, self.tgt_in, self.tgt_out] + ([] if self.tgt_rows is None else [self.tgt_rows])
        kind = torch.device(device).type
        moved = parts if kind == "cpu" else packed_copy(parts, device, non_blocking and kind == "cuda")
        rows = moved[3] if len(moved) == 4 else None
        return Batch(moved[0], moved[1], moved[2], self.src_tokens, self.tgt_tokens, rows)


def packed_copy(parts: list[Tensor], device: torch.device | str, pin: bool) -> list[Tensor]:
    """`parts` (int64 tensors: a batch's ids and target rows) on `device`, as views of one buffer
    copied there at once; `pin`: the buffer is pinned host memory and the copy does not block.
    Pinning costs about a millisecond a call whatever the size (an H100 host, torch 2.11), so a
    batch pins once."""
    import torch

    sizes = [t.numel() for t in parts]
    staged = torch.empty(sum(sizes), dtype=parts[0].dtype, pin_memory=pin)
    torch.cat([t.reshape(-1) for t in parts], out=staged)
    moved = staged.to(device, non_blocking=pin).split(sizes)
    return [m.view(t.shape) for m, t in zip(moved, parts)]


def target_rows(lengths: np.ndarray, width: int) -> Tensor:
    """lengths (B,): targets per row (EOS counted) of a (B, width) batch -> (N,) flat positions
    of those targets, row by row: row i's first lengths[i] positions."""
    import torch

    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.repeat(np.arange(len(lengths), dtype=np.int64) * width, lengths)
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return torch.from_numpy(starts + within)


def collate(corpus: EncodedCorpus, index: np.ndarray, sample_key: tuple[int, ...] | None = None) -> Batch:
    """The pairs `index` of `corpus` as a `Batch` (EOS ends the source and the decoder's
    output, the corpus's `decoder_start` id, BOS or Marian's pad, starts its input).

    With `sample_key` (seed, epoch, batch) and subword sampling on, the batch is re-segmented
    by sampling, deterministically from the key."""
    index = np.asarray(index)
    if sample_key is not None and corpus.sampling is not None:
        src, tgt = _sample(corpus, index, sample_key)
        if corpus.release is not None:
            corpus.release()
        tgt_out = pad_batch(tgt, [], [EOS])
        n = np.array([len(t) + 1 for t in tgt], dtype=np.int64)
        return Batch(pad_batch(src, [], [EOS]), pad_batch(tgt, [corpus.decoder_start], []), tgt_out,
                     sum(len(s) + 1 for s in src), int(n.sum()), target_rows(n, tgt_out.size(1)))
    src_lens, src_vals = _gather(corpus.table, "src_ids", index)
    tgt_lens, tgt_vals = _gather(corpus.table, "tgt_ids", index)
    if corpus.release is not None:
        corpus.release()
    tgt_out = _pad_flat(tgt_lens, tgt_vals, False, True)
    return Batch(_pad_flat(src_lens, src_vals, False, True), _pad_flat(tgt_lens, tgt_vals, True, False, corpus.decoder_start),
                 tgt_out, int(src_lens.sum()) + len(index), int(tgt_lens.sum()) + len(index),
                 target_rows(tgt_lens.astype(np.int64) + 1, tgt_out.size(1)))
