"""The epoch's batch plan alone, on synthetic lengths: time and memory of making it, as the
trainer does at the start of every epoch (`batching.epoch_batches`), against the first
version (kept below: a Python step per pair, an int64 order and a list of per-batch arrays).

Lengths: N pairs, source lengths log-normal (median 25 tokens, clipped to 1..128), target
lengths the source's times a log-normal ratio (median 1.1), as int32 like the encoded
corpus's length columns; 2048-token batches; one corpus, or three of N/3 pairs with weights
2, 1 and 0.5 (an epoch of 1.17 N pairs). Each case runs in a fresh process, which reports:
the seconds `epoch_batches` took; its peak resident memory above the process's before it
(VmHWM - VmRSS, the lengths already made); and what the plan it returns holds (VmRSS after
- before).

    PYTHONPATH=. .venv/bin/python bench/batch_plan.py [--pairs 10000000] [--versions first now]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def first_token_batches(src_lens, tgt_lens, max_tokens, rng=None):
    """token_batches as first written."""
    n = len(src_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = np.lexsort((tie, tgt_lens, src_lens))
    del tie
    longest = np.maximum(src_lens, tgt_lens)[order]
    batches = []
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


def first_epoch_rows(parts, seed, epoch):
    """corpora.epoch_rows as first written (int64, one array per corpus, then concatenated)."""
    out = []
    for number, part in enumerate(parts):
        n = part.count
        full, rest = divmod(part.per_epoch, n) if n else (0, 0)
        chunks = [np.arange(n, dtype=np.int64)] * full
        if rest:
            cycle, offset = divmod(epoch * rest, n)
            tail = np.random.default_rng([seed, 0x5EED, number, cycle]).permutation(n)[offset : offset + rest]
            if len(tail) < rest:
                head = np.random.default_rng([seed, 0x5EED, number, cycle + 1]).permutation(n)
                tail = np.concatenate([tail, head[~np.isin(head, tail)][: rest - len(tail)]])
            chunks.append(tail.astype(np.int64))
        out.append(part.start + np.concatenate(chunks))
    return np.concatenate(out)


def first_epoch_batches(corpus, max_tokens, seed, epoch):
    rng = np.random.default_rng([seed, epoch])
    if corpus.parts is None:
        return first_token_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, rng)
    rows = first_epoch_rows(corpus.parts, seed, epoch)
    return [rows[b] for b in first_token_batches(corpus.src_lens[rows], corpus.tgt_lens[rows], max_tokens, rng)]


def memory_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (writing 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def one_case(pairs: int, weighted: bool, version: str) -> dict:
    from seq2seq_cli.data.batching import epoch_batches
    from seq2seq_cli.data.corpora import Part

    gen = np.random.default_rng(0)
    src = np.clip(np.rint(gen.lognormal(np.log(25), 0.6, pairs)), 1, 128).astype(np.int32)
    tgt = np.clip(np.rint(src * gen.lognormal(np.log(1.1), 0.2, pairs)), 1, 128).astype(np.int32)
    parts = None
    if weighted:
        sizes = [pairs // 3 + (i < pairs % 3) for i in range(3)]
        starts = np.cumsum([0, *sizes])[:-1]
        parts = [Part(f"part{i}", w, None, int(s), n) for i, (w, s, n) in enumerate(zip((2, 1, 0.5), starts, sizes))]
    corpus = SimpleNamespace(src_lens=src, tgt_lens=tgt, parts=parts)
    make = first_epoch_batches if version == "first" else epoch_batches
    reset_peak()
    before = memory_kib()["VmRSS"]
    start = time.perf_counter()
    plan = make(corpus, 2048, 1, 0)
    seconds = time.perf_counter() - start
    after = memory_kib()
    epoch_pairs = sum(len(b) for b in plan)
    return {"version": version, "pairs": pairs, "corpora": 3 if weighted else 1, "epoch_pairs": epoch_pairs,
            "batches": len(plan), "seconds": round(seconds, 2), "peak_mib": round((after["VmHWM"] - before) / 1024, 1),
            "held_mib": round((after["VmRSS"] - before) / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[10_000_000])
    ap.add_argument("--versions", nargs="+", default=["first", "now"], choices=["first", "now"])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # pairs,weighted,version: one case, in this process
    args = ap.parse_args()
    if args.case:
        pairs, weighted, version = args.case.split(",")
        print(json.dumps(one_case(int(pairs), weighted == "1", version)))
        return
    for pairs in args.pairs:
        for weighted in (0, 1):
            for version in args.versions:
                out = subprocess.run([sys.executable, __file__, "--case", f"{pairs},{weighted},{version}"], cwd=REPO,
                                     check=True, capture_output=True, text=True).stdout
                print(out.strip(), flush=True)


if __name__ == "__main__":
    main()
