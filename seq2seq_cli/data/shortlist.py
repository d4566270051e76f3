"""A lexical shortlist: for each source subword, the target subwords likely to translate it.

Decoding with `--shortlist` scores at each step only the target subwords the sentence's source
subwords list, plus the most frequent target subwords, instead of the whole vocabulary (as
Marian's `--shortlist` and CTranslate2's vocabulary map do, though those take the union of a
whole batch's lists, so that a sentence's output depends on the sentences decoded with it; here
each sentence keeps its own). On a small model the output
layer is half of a decoding step's work, so a shortlist makes a step that much cheaper; the
search itself is unchanged, over fewer candidates.

The shortlist is built from the training pairs: for a source subword s and a target subword
t, the Dice coefficient 2 c(s, t) / (c(s) + c(t)) over pairs (c counts the pairs holding a
subword, or both); each source subword keeps its `BEST` target subwords by that score, and
the `FREQUENT` commonest target subwords are always candidates. The end of sentence and the
unknown subword are candidates too.

It is written to RUN/shortlist.tsv in CTranslate2's vocabulary-map format, one line per
source subword, `piece<TAB>piece piece ...`, the always-candidates first on a line whose key
is empty, and last a line `<shortlist-end:lines=N><TAB></s>` saying how many lines came before
it, so that a file cut short is known (its key is no source subword: CTranslate2 never uses
it); `export --format ctranslate2` ships it as the model's vmap.txt.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text
from seq2seq_cli.ids import EOS, PAD, UNK

BEST = 50  # target subwords kept per source subword
FREQUENT = 100  # commonest target subwords, always candidates
END = "<shortlist-end:lines="  # the key of a file's last line, "<shortlist-end:lines=N>": N lines came before it
MAX_PAIRS = 2_000_000  # pairs counted (the first ones); the counts settle long before
CHUNK = 20_000  # pairs per sparse product


@dataclass
class Shortlist:
    """Target candidates per source id (CSR: `targets[offsets[s]:offsets[s+1]]`) and the ids
    that are always candidates."""

    offsets: Tensor  # (Vs + 1,) int64
    targets: Tensor  # (nnz,) int64
    always: Tensor  # (F,) int64, sorted

    def candidates(self, src: Tensor) -> Tensor:
        """Source ids (any shape; padding and unknown ids included) -> the sorted target ids a
        batch of them may produce (C,)."""
        ids = src.reshape(-1).cpu().unique()
        ids = ids[(ids >= 0) & (ids < self.offsets.numel() - 1)]
        starts, ends = self.offsets[ids], self.offsets[ids + 1]
        counts = ends - starts
        total = int(counts.sum())
        if total:
            # the positions starts[i] .. ends[i]-1 of every source id, concatenated
            base = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts)
            found = self.targets[base + torch.arange(total)]
            return torch.cat([self.always, found]).unique()
        return self.always

    def per_sentence(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids (B, S), padded with PAD -> the sorted union of the sentences' candidates
        (C,), and which of them each sentence's own ids give (B, C) bool: a search scores the
        union once and each sentence only its own, so that its output is the one it gets alone."""
        own = [self.candidates(row[row != PAD]) for row in src.cpu()]
        vocab = torch.cat(own).unique()
        allowed = torch.zeros(len(own), vocab.numel(), dtype=torch.bool)
        for b, ids in enumerate(own):
            allowed[b, torch.searchsorted(vocab, ids)] = True
        return vocab, allowed


def build(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], src_size: int, tgt_size: int,
          best: int = BEST, frequent: int = FREQUENT) -> Shortlist:
    """The shortlist of encoded (source ids, target ids) pairs (EOS not included)."""
    cooc: Tensor | None = None
    src_count = torch.zeros(src_size, dtype=torch.float64)
    tgt_count = torch.zeros(tgt_size, dtype=torch.float64)
    tgt_freq = torch.zeros(tgt_size, dtype=torch.float64)
    chunk: list[tuple[Sequence[int], Sequence[int]]] = []

    def flush() -> None:
        nonlocal cooc
        s = _presence(chunk, 0, src_size)
        t = _presence(chunk, 1, tgt_size)
        src_count.add_(torch.sparse.sum(s, 0).to_dense())
        tgt_count.add_(torch.sparse.sum(t, 0).to_dense())
        tgt_freq.add_(torch.bincount(torch.as_tensor(np.concatenate([np.asarray(p[1], dtype=np.int64) for p in chunk]
                                                                    + [np.zeros(0, np.int64)])),
                                     minlength=tgt_size).double())
        with warnings.catch_warnings():  # "sparse CSR support is in beta", about its intermediate
            warnings.simplefilter("ignore", UserWarning)
            product = torch.sparse.mm(s.t().coalesce(), t).coalesce()  # (Vs, Vt) pairs holding both
        cooc = product if cooc is None else (cooc + product).coalesce()
        chunk.clear()

    for n, pair in enumerate(pairs):
        if n == MAX_PAIRS:
            break
        chunk.append(pair)
        if len(chunk) == CHUNK:
            flush()
    if chunk:
        flush()
    always = torch.cat([tgt_freq.topk(min(frequent, tgt_size)).indices, torch.tensor([EOS, UNK])]).unique()
    if cooc is None or cooc._nnz() == 0:
        return Shortlist(torch.zeros(src_size + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), always)
    rows, cols = cooc.indices()
    both = cooc.values()
    dice = 2 * both / (src_count[rows] + tgt_count[cols])
    order = torch.argsort(dice, descending=True, stable=True)
    order = order[torch.argsort(rows[order], stable=True)]  # by source id, best first within each
    rows, cols = rows[order], cols[order]
    per_row = torch.bincount(rows, minlength=src_size)
    first = torch.cumsum(per_row, 0) - per_row
    rank = torch.arange(rows.numel()) - first[rows]
    keep = rank < best
    rows, cols = rows[keep], cols[keep]
    kept = torch.bincount(rows, minlength=src_size)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(kept, 0)])
    return Shortlist(offsets, cols, always)


def _presence(chunk: list[tuple[Sequence[int], Sequence[int]]], side: int, size: int) -> Tensor:
    """(pairs, size) sparse 0/1 matrix: which ids each pair's `side` holds."""
    rows, cols = [], []
    for i, pair in enumerate(chunk):
        ids = np.unique(np.asarray(pair[side], dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < size)]
        rows.append(np.full(ids.size, i, dtype=np.int64))
        cols.append(ids)
    r = torch.as_tensor(np.concatenate(rows)) if rows else torch.zeros(0, dtype=torch.int64)
    c = torch.as_tensor(np.concatenate(cols)) if cols else torch.zeros(0, dtype=torch.int64)
    return torch.sparse_coo_tensor(torch.stack([r, c]), torch.ones(r.numel(), dtype=torch.float64),
                                   (len(chunk), size), check_invariants=False).coalesce()


def write(shortlist: Shortlist, path: Path, src_piece: Sequence[str], tgt_piece: Sequence[str]) -> None:
    """Write `shortlist` to `path` (atomically) in CTranslate2's vocabulary-map format, ended by
    the END line that says how many lines come before it."""
    lines = ["\t" + " ".join(tgt_piece[i] for i in shortlist.always.tolist())]
    offsets = shortlist.offsets.tolist()
    targets = shortlist.targets.tolist()
    for s in range(len(offsets) - 1):
        if offsets[s + 1] > offsets[s] and src_piece[s].strip():
            lines.append(src_piece[s] + "\t" + " ".join(tgt_piece[t] for t in targets[offsets[s]:offsets[s + 1]]))
    lines.append(f"{END}{len(lines)}>\t{tgt_piece[EOS]}")
    atomic_write_text(path, "\n".join(lines) + "\n")


def read(path: Path, src_ids: dict[str, int], tgt_ids: dict[str, int]) -> Shortlist:
    """Read a shortlist file; UserError naming the file and line where it is not one of this
    run's vocabularies, or not whole: empty, cut short (no END line counting the lines before
    it, or a last line without its newline), a blank line (which CTranslate2 reads as no
    always-candidates), a first line that is not the always-candidates with the end of
    sentence among them, a source subword without targets. CTranslate2 is given the file
    only once it is read here: it crashes on a file cut short."""
    per_source: dict[int, list[int]] = {}
    always: list[int] = [EOS, UNK]
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the shortlist ({exc})") from None
    lines = text.splitlines()
    again = "delete it and seq2seq train --resume writes it again"
    if not text.strip():
        raise UserError(f"{path}: the shortlist is empty; {again}")
    if not text.endswith("\n"):
        raise UserError(f"{path}, line {len(lines)}: cut short (the last line has no newline); {again}")
    blank = end = None
    first_ok = False
    for n, line in enumerate(lines, 1):
        if not line:
            blank = blank or n
            continue
        key, tab, values = line.partition("\t")
        if not tab:
            raise UserError(f"{path}, line {n}: expected a source subword, a tab and target subwords")
        if key.startswith(END):
            end = end or (n, key)
            continue
        targets = []
        for piece in values.split():
            if piece not in tgt_ids:
                raise UserError(f"{path}, line {n}: {piece!r} is not in the run's target vocabulary")
            targets.append(tgt_ids[piece])
        if n == 1:
            first_ok = not key and EOS in targets
        if not key:
            always += targets
        elif key in src_ids:
            if not targets:
                raise UserError(f"{path}, line {n}: {key!r} has no target subwords after its tab")
            per_source.setdefault(src_ids[key], []).extend(targets)
        else:
            raise UserError(f"{path}, line {n}: {key!r} is not in the run's source vocabulary")
    if not first_ok:
        raise UserError(f"{path}, line 1: expected the always-candidates first (a tab, then target subwords, "
                        "the end of sentence among them)")
    _check_whole(path, lines, blank, end, again)
    counts = [0] * (max(src_ids.values(), default=-1) + 1)
    flat: list[int] = []
    for s in sorted(per_source):
        counts[s] = len(per_source[s])
        flat += per_source[s]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0)])
    return Shortlist(offsets, torch.tensor(flat, dtype=torch.int64), torch.tensor(always, dtype=torch.int64).unique())


def _check_whole(path: Path, lines: list[str], blank: int | None, end: tuple[int, str] | None, again: str) -> None:
    """The shortlist `path` (its `lines`, the first blank one, its END line) is whole."""
    if blank is not None:
        raise UserError(f"{path}, line {blank}: a blank line (CTranslate2 reads it as no always-candidates)")
    if end is None:
        raise UserError(f"{path}: cut short: no end line ({END}N>) after its {len(lines)} lines (or written "
                        f"before shortlists had one); {again}")
    n, key = end
    stated = key.removeprefix(END).removesuffix(">")
    if n != len(lines) or stated != str(n - 1):
        raise UserError(f"{path}, line {n}: the end line says {stated} lines come before it, but {n - 1} do"
                        + ("" if n == len(lines) else f" and {len(lines) - n} follow it") + f"; {again}")
