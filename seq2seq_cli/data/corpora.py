"""Several training corpora mixed by weight, and corpus tags.

`data.train` may list corpora, each with a `weight` and an optional `tag`. Each is read,
encoded and cached on its own (RUN/cache/encoded/train.N-...); training sees one corpus, their
rows one after the other, with the `Part`s that say where each lies. An epoch holds
round(weight x pairs kept) pairs of each corpus (rounded half up): every pair floor(weight)
times, and the remaining fraction drawn without replacement from a stream of permutations of
the corpus, so that weight 0.5 takes a different half each epoch and every pair once in two
epochs. The draw is a pure function of (seed, epoch): a resumed run sees the same epochs, and
under torchrun every process deals out the same batches.

A tag is one piece of the source tokenizer (a SentencePiece user-defined symbol, which
`seq2seq tokenize` adds for every tag of data.train, or an entry of an imported model's
vocabulary such as OPUS-MT's `>>fra<<`): its id goes in front of every source of its corpus,
and `translate --tag` puts it in front of every line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from seq2seq_cli.data.encoding import EncodedCorpus, describe_drops, encoded_split
from seq2seq_cli.data.indices import CHUNK, index_dtype
from seq2seq_cli.data.tokenizer import source_prefix
from seq2seq_cli.errors import UserError

DRAW_STREAM = 0x5EED  # keeps the draws' generators apart from the batch order's (seed, epoch)


@dataclass(frozen=True)
class Part:
    """One corpus of several: where its kept pairs lie in the combined corpus, its weight and
    tag, and what reading it found."""

    path: str
    weight: float
    tag: str | None
    start: int  # its first row in the combined corpus
    count: int  # pairs kept after the filters
    dropped: dict[str, int] = field(default_factory=dict)
    prefix: tuple[int, ...] = ()  # the tag's id, or nothing
    source: dict[str, Any] = field(default_factory=dict)  # where its pairs came from: files, or a Hub dataset's revision
    pair: str = ""  # its languages, 'es-en', in a run of several pairs

    @property
    def read(self) -> int:
        """Pairs read from the file(s), kept or dropped."""
        return self.count + sum(self.dropped.values())

    @property
    def per_epoch(self) -> int:
        """round(weight x pairs kept), half up (a product past float's range counted as 2**63:
        more than any memory holds, which `train` refuses before drawing)."""
        drawn = self.weight * self.count + 0.5
        return int(math.floor(drawn)) if math.isfinite(drawn) else 2**63

    def record(self) -> dict[str, Any]:
        """This corpus's counts for metrics.jsonl."""
        return {"path": self.path, "weight": self.weight, "tag": self.tag, "read": self.read, "kept": self.count,
                **{f"dropped_{k}": v for k, v in self.dropped.items()}, "drawn_per_epoch": self.per_epoch,
                **({"source": self.source} if self.source else {}), **({"pair": self.pair} if self.pair else {})}


def _permutation(n: int, seed: int, corpus: int, cycle: int) -> np.ndarray:
    """rng.permutation(n) of the corpus's generator for `cycle`, made as int32 where it fits
    (shuffling an arange of either type draws the same permutation)."""
    perm = np.arange(n, dtype=index_dtype(n))
    np.random.default_rng([seed, DRAW_STREAM, corpus, cycle]).shuffle(perm)
    return perm


def draw(part: Part, number: int, seed: int, epoch: int, out: np.ndarray) -> None:
    """Write into `out` (part.per_epoch long) the local indices of corpus `number` (0-based) in
    epoch `epoch`: every pair floor(weight) times, then the fraction's share, positions
    [epoch * r, (epoch + 1) * r) of the stream of permutations P_0 P_1 ... of the corpus (a
    pair repeated where two permutations meet is taken from the next one instead)."""
    n = part.count
    full, rest = divmod(part.per_epoch, n) if n else (0, 0)
    for k in range(full):
        out[k * n : (k + 1) * n] = np.arange(n, dtype=out.dtype)
    if rest:
        cycle, offset = divmod(epoch * rest, n)
        tail = _permutation(n, seed, number, cycle)[offset : offset + rest]
        out[full * n : full * n + len(tail)] = tail
        if len(tail) < rest:
            head = _permutation(n, seed, number, cycle + 1)
            out[full * n + len(tail) :] = head[~np.isin(head, tail)][: rest - len(tail)]


def epoch_rows(parts: list[Part], seed: int, epoch: int) -> np.ndarray:
    """The rows of the combined corpus that make up epoch `epoch`, corpus by corpus (the
    batches shuffle them); a row drawn twice appears twice. int32 where the rows fit, written
    corpus by corpus into one array."""
    end = max((p.start + p.count for p in parts), default=0)
    rows = np.empty(sum(p.per_epoch for p in parts), dtype=index_dtype(end))
    at = 0
    for k, p in enumerate(parts):
        mine = rows[at : at + p.per_epoch]
        draw(p, k, seed, epoch, mine)
        mine += p.start
        at += p.per_epoch
    return rows


def copy_groups(parts: list[Part], rows: np.ndarray, by_pair: bool = False) -> list[np.ndarray]:
    """`rows` (an epoch's, as `epoch_rows` lays them out) in groups that hold no row twice:
    group k holds the k-th copy of each row (a corpus of weight w gives its pairs to groups
    0 .. floor(w) - 1, and the fraction's share to the next), so that batching each group on
    its own puts the copies of a pair in different batches. With `by_pair`, a group also holds
    one language pair only. One group (the rows as they are) where every row is drawn once and
    no pairs are apart."""
    groups: dict[tuple[str, int], list[np.ndarray]] = {}
    at = 0
    for p in parts:
        stretch = rows[at : at + p.per_epoch]
        at += p.per_epoch
        full = p.per_epoch // p.count if p.count else 0
        cuts = [stretch[k * p.count : (k + 1) * p.count] for k in range(full)] + [stretch[full * p.count :]]
        for k, cut in enumerate(cuts):
            if len(cut):
                groups.setdefault((p.pair if by_pair else "", k), []).append(cut)
    if len(groups) <= 1:
        return [rows]
    return [np.concatenate(cut) for cut in groups.values()]


def drawn_per_corpus(parts: list[Part], rows: np.ndarray) -> list[int]:
    """How many of `rows` (an epoch's, or a batch's) belong to each corpus (counted a slice at
    a time, with no temporary the size of an epoch)."""
    starts = np.array([p.start for p in parts])
    counts = np.zeros(len(parts), dtype=np.int64)
    for a in range(0, len(rows), CHUNK):
        which = np.searchsorted(starts, rows[a : a + CHUNK], side="right") - 1
        counts += np.bincount(which, minlength=len(parts))
    return counts.tolist()


def row_prefixes(corpus: EncodedCorpus, index: np.ndarray) -> list[list[int]]:
    """The tag ids in front of the sources of rows `index`."""
    if corpus.parts is None:
        return [list(corpus.prefix)] * len(index)
    starts = np.array([p.start for p in corpus.parts])
    which = np.searchsorted(starts, index, side="right") - 1
    return [list(corpus.parts[w].prefix) for w in which]


def combine(corpora: list[EncodedCorpus], parts: list[Part]) -> EncodedCorpus:
    """One corpus of the rows of `corpora`, one after the other (their Arrow tables
    concatenated without copying), with `parts` saying where each lies."""
    tables = [c.table.replace_schema_metadata(None) for c in corpora]
    releases = [c.release for c in corpora if c.release is not None]

    def release() -> None:
        for r in releases:
            r()

    first = corpora[0]
    return EncodedCorpus(
        pa.concat_tables(tables), np.concatenate([c.src_lens for c in corpora]),
        np.concatenate([c.tgt_lens for c in corpora]),
        {k: sum(c.dropped.get(k, 0) for c in corpora) for k in first.dropped},
        sampling=first.sampling, from_cache=all(c.from_cache for c in corpora), release=release,
        decoder_start=first.decoder_start, parts=parts,
    )


def pair_factors(parts: list[Part], pairs: list[tuple[str, str]], temperature: float) -> list[float]:
    """What each corpus's weight is multiplied by so that the language pairs are drawn with
    temperature: pair p, with n_p pairs per epoch by the weights alone (of N in all), takes
    N x q_p^(1/T) / sum(q^(1/T)) of an epoch, q_p = n_p / N. One pair: 1 for every corpus."""
    drawn: dict[tuple[str, str], float] = {}
    for part, pair in zip(parts, pairs):
        drawn[pair] = drawn.get(pair, 0.0) + part.weight * part.count
    if len(drawn) < 2:
        return [1.0] * len(parts)
    total = sum(drawn.values())
    tempered = {pair: (n / total) ** (1.0 / temperature) for pair, n in drawn.items()}
    norm = sum(tempered.values())
    return [total * tempered[pair] / norm / drawn[pair] for pair in pairs]


def encode_corpora(
    config, src_sp, tgt_sp, log: Callable[[str], None], cached: list[Path | None] | None = None,
) -> tuple[EncodedCorpus, list[Path | None]]:
    """The training corpora of a list `data.train`, each encoded (and cached) on its own with
    its language token and tag, combined into one corpus with its `Part`s (their weights times
    the temperature's factor of their language pair, `pair_factors`); each is logged with its
    counts. `cached`: the caches another process made of each corpus (rank 0 under torchrun),
    read as they are. -> the combined corpus, and the cache of each corpus."""
    d = config.data
    corpora, parts, start, paths = [], [], 0, []
    pairs = [d.pair_of(entry) for entry in d.corpora]
    for i, entry in enumerate(d.corpora):
        prefix = source_prefix(config, src_sp, i, entry)
        corpus = encoded_split(config, entry, src_sp, tgt_sp, training=True, log=log, label=f"train.{i}",
                               prefix=prefix, cached=cached[i] if cached else None)
        paths.append(corpus.cache_path)
        if not len(corpus):
            raise UserError(f"{config.where('data', 'train', i)}: {entry}: no training pairs left after "
                            f"filtering ({describe_drops(corpus, config)})")
        parts.append(Part(str(entry), entry.weight, entry.tag, start, len(corpus), dict(corpus.dropped), tuple(prefix),
                          corpus.source))
        corpora.append(corpus)
        start += len(corpus)
    factors = pair_factors(parts, pairs, d.temperature)
    several = len(set(pairs)) > 1
    for i, (entry, part, factor) in enumerate(zip(d.corpora, list(parts), factors)):
        if several:
            part = parts[i] = replace(part, weight=part.weight * factor, pair="-".join(pairs[i]))
        if not part.per_epoch:
            raise UserError(f"{config.where('data', 'train', i, 'weight')}: weight {entry.weight:g} draws no pair of the "
                            f"{part.count} kept in an epoch (round(weight x pairs kept) = 0); give a weight of at least "
                            f"{0.5 / part.count:.2g}, or leave the corpus out")
        tagged = f", tag {entry.tag}" if entry.tag else ""
        token = f", {prefix_text(src_sp, part.prefix)}" if part.prefix else ""
        pair = f" ({pairs[i][0]} -> {pairs[i][1]}{token})" if several else ""
        tempered = f" x {factor:.3g} (temperature {d.temperature:g})" if several else ""
        revision = corpora[i].source.get("resolved_revision")
        log(f"train: corpus {i} {entry}{pair}{f' @ {revision}' if revision else ''}: {part.read} pairs read, {part.count} "
            f"kept ({describe_drops(corpora[i], config)}); weight {entry.weight:g}{tempered}{tagged}: {part.per_epoch} "
            "pairs per epoch")
    return combine(corpora, parts), paths


def prefix_text(sp, ids: tuple[int, ...]) -> str:
    """The pieces of a source prefix, as text: '>>es<<'."""
    return " ".join(sp.id_to_piece(i) for i in ids)
