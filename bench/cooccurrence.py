"""How far a corpus's own word co-occurrence tells misaligned pairs from clean ones, with no model.

Each pair scores min(mean over target words of the best Dice coefficient with a source word,
the same from the source side), the Dice coefficients counted over the whole corpus (words:
letters only, lower case, each once per side). Prints, for shares of clean pairs lost, the
share of each kind of noise below that score. Reads the noisy corpus `bench/noise.py --keep
DIR` writes (DIR/noisy.tsv and DIR/noisy.kinds, one kind per pair).

    python bench/cooccurrence.py /tmp/noisy
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

WORD = re.compile(r"[^\W\d_]+")


def word_ids(texts) -> tuple[list[np.ndarray], int]:
    vocab: dict[str, int] = {}
    rows = [np.array(sorted({vocab.setdefault(w, len(vocab)) for w in WORD.findall(t.lower())}), dtype=np.int64)
            for t in texts]
    return rows, len(vocab)


def scores(pairs: list[tuple[str, str]]) -> np.ndarray:
    src, vs = word_ids(p[0] for p in pairs)
    tgt, vt = word_ids(p[1] for p in pairs)
    fs = np.bincount(np.concatenate(src), minlength=vs)
    ft = np.bincount(np.concatenate(tgt), minlength=vt)
    keys = [(s[:, None] * vt + t[None, :]).ravel() for s, t in zip(src, tgt)]
    unique, counts = np.unique(np.concatenate(keys), return_counts=True)
    out = np.zeros(len(pairs))
    for i, (s, t) in enumerate(zip(src, tgt)):
        if len(s) and len(t):
            k = keys[i]
            dice = (2 * counts[np.searchsorted(unique, k)] / (fs[k // vt] + ft[k % vt])).reshape(len(s), len(t))
            out[i] = min(dice.max(0).mean(), dice.max(1).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where bench/noise.py --keep wrote noisy.tsv and noisy.kinds")
    args = parser.parse_args()
    start = time.perf_counter()
    lines = (args.folder / "noisy.tsv").read_text(encoding="utf-8").splitlines()
    pairs = [tuple(line.split("\t", 1)) for line in lines]
    kinds = np.array((args.folder / "noisy.kinds").read_text(encoding="utf-8").split())
    score = scores(pairs)
    print(f"{len(pairs):,} pairs scored in {time.perf_counter() - start:.1f} s")
    clean = score[kinds == "clean"]
    names = sorted(set(kinds) - {"clean"})
    print("| clean pairs lost | " + " | ".join(names) + " |")
    for loss in (0.01, 0.02, 0.05):
        below = score < np.quantile(clean, loss)
        print(f"| {loss:.0%} | " + " | ".join(f"{below[kinds == k].mean():.1%}" for k in names) + " |")


if __name__ == "__main__":
    main()
