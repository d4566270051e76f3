"""Parallel corpora: read through HF `datasets` (local files only), check, encode, batch.

A split is two aligned text files, PREFIX.SRC_LANG and PREFIX.TGT_LANG, one sentence per line.
Batches hold at most `max_tokens` source or target tokens, padding included, with pairs of
similar length together; their order is shuffled each epoch from the seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from torch import Tensor

from seq2seq_cli.errors import UserError
from seq2seq_cli.tokenizer import BOS, EOS, PAD


@dataclass
class EncodedCorpus:
    """Encoded pairs of one split: source ids (EOS not included) and target ids (no BOS/EOS)."""

    src: list[list[int]]
    tgt: list[list[int]]
    dropped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lens(self) -> np.ndarray:
        """Encoder input lengths (EOS counted)."""
        return np.fromiter((len(s) + 1 for s in self.src), dtype=np.int64, count=len(self.src))

    @property
    def tgt_lens(self) -> np.ndarray:
        """Decoder input/output lengths (BOS or EOS counted)."""
        return np.fromiter((len(t) + 1 for t in self.tgt), dtype=np.int64, count=len(self.tgt))


def _first_bad_utf8(path: Path) -> tuple[int, int, str]:
    """(line number, byte offset in the line, reason) of the first invalid UTF-8 in a file."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return number, exc.start, exc.reason
    return 0, 0, "unknown"


def split_files(prefix: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    return Path(f"{prefix}.{src_lang}"), Path(f"{prefix}.{tgt_lang}")


def read_parallel(prefix: str, src_lang: str, tgt_lang: str, cache_dir: Path | None = None):
    """Read a split into a `datasets.Dataset` with columns `src` and `tgt`.

    Raises UserError for a missing file, invalid UTF-8 (file, line, byte) or differing line counts.
    """
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    src_file, tgt_file = split_files(prefix, src_lang, tgt_lang)
    for f in (src_file, tgt_file):
        if not f.is_file():
            raise UserError(f"{f}: file not found (expected {prefix}.{src_lang} and {prefix}.{tgt_lang})")
    columns = {}
    for name, f in (("src", src_file), ("tgt", tgt_file)):
        try:
            ds = datasets.load_dataset(
                "text", data_files=str(f), split="train", cache_dir=str(cache_dir) if cache_dir else None
            )
        except Exception as exc:  # datasets wraps decoding errors in its own exception types
            cause = exc
            while cause is not None and not isinstance(cause, UnicodeDecodeError):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            line, offset, reason = _first_bad_utf8(f)
            raise UserError(f"{f}:{line}: invalid UTF-8 at byte {offset} of the line ({reason})") from None
        columns[name] = ds
    if len(columns["src"]) != len(columns["tgt"]):
        raise UserError(
            f"{src_file} has {len(columns['src'])} lines but {tgt_file} has {len(columns['tgt'])}; "
            "source and target files must be aligned line by line"
        )
    return datasets.concatenate_datasets(
        [columns["src"].rename_column("text", "src"), columns["tgt"].rename_column("text", "tgt")], axis=1
    )


def encode_corpus(dataset, src_sp, tgt_sp, max_src_len: int | None = None, max_tgt_len: int | None = None) -> EncodedCorpus:
    """Encode a `src`/`tgt` dataset with SentencePiece; drop (and count) pairs that are empty
    or longer than the limits (in subwords)."""

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return {"src_ids": src_sp.encode(batch["src"]), "tgt_ids": tgt_sp.encode(batch["tgt"])}

    encoded = dataset.map(encode, batched=True, batch_size=2000, remove_columns=["src", "tgt"])
    src_all, tgt_all = encoded["src_ids"], encoded["tgt_ids"]
    src, tgt = [], []
    dropped = {"empty": 0, "too_long": 0}
    for s, t in zip(src_all, tgt_all):
        if not s or not t:
            dropped["empty"] += 1
        elif (max_src_len and len(s) > max_src_len) or (max_tgt_len and len(t) > max_tgt_len):
            dropped["too_long"] += 1
        else:
            src.append(s)
            tgt.append(t)
    return EncodedCorpus(src, tgt, dropped)


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


def collate(corpus: EncodedCorpus, index: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """-> src (B, S) ids+EOS, tgt_in (B, T) BOS+ids, tgt_out (B, T) ids+EOS."""
    src = [corpus.src[i] for i in index]
    tgt = [corpus.tgt[i] for i in index]
    return pad_batch(src, [], [EOS]), pad_batch(tgt, [BOS], []), pad_batch(tgt, [], [EOS])
