"""The co-occurrence filter (`data/cooccurrence.py`): a pair's score from the sketch is, to
within 0.001 for 99% of pairs, the score counted exactly (leave-one-out Dice, weighted by
log(N / f)); misaligned pairs of the shipped corpus fall below the default share of the median
and real pairs do not; a corpus too small to count, or written without spaces, loses nothing;
`tokenize` drops, counts and lists what it found, and `cooccurrence: null` turns it off."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from collections import Counter

import numpy as np
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config import FiltersConfig
from seq2seq_cli.data.cooccurrence import MIN_PAIRS, WORD_BITS, Counts, low_pairs, words

ES = (SHIPPED / "train.es").read_text(encoding="utf-8").splitlines()[:4000]
EN = (SHIPPED / "train.en").read_text(encoding="utf-8").splitlines()[:4000]
runner = CliRunner()


def word_set(text: str) -> set[str]:
    return set(re.findall(r"[^\W\d_]+", text.lower()))


def exact_scores(pairs: list[tuple[str, str]]) -> list[float]:
    """The definition, counted with dictionaries of words."""
    sides = [(word_set(s), word_set(t)) for s, t in pairs]
    fs = Counter(w for s, _ in sides for w in s)
    ft = Counter(w for _, t in sides for w in t)
    both = Counter((a, b) for s, t in sides for a in s for b in t)
    n = len(pairs)
    out = []
    for s, t in sides:
        means = []
        for mine, theirs, f, g, key in ((s, t, fs, ft, lambda a, b: (a, b)), (t, s, ft, fs, lambda a, b: (b, a))):
            weights = {a: math.log(n / f[a]) for a in mine if f[a] > 1}
            if not theirs or sum(weights.values()) == 0:
                break
            best = {a: max(min(2 * (both[key(a, b)] - 1) / max(f[a] + g[b] - 2, 1), 1.0) for b in theirs) for a in weights}
            means.append(sum(best[a] * w for a, w in weights.items()) / sum(weights.values()))
        out.append(min(means) if len(means) == 2 else math.nan)
    return out


def shares_a_counter(pairs: list[tuple[str, str]]) -> set[int]:
    """Pairs with a word whose hashed counter another word of its side also uses."""
    import zlib

    out = set()
    for side in (0, 1):
        slots: dict[int, set[str]] = {}
        for pair in pairs:
            for w in word_set(pair[side]):
                slots.setdefault(zlib.crc32(w.encode()) & ((1 << WORD_BITS) - 1), set()).add(w)
        shared = {w for ws in slots.values() if len(ws) > 1 for w in ws}
        out |= {i for i, pair in enumerate(pairs) if word_set(pair[side]) & shared}
    return out


def batches_of(pairs: list[tuple[str, str]]):
    def batches():
        for start in range(0, len(pairs), 1000):
            chunk = pairs[start : start + 1000]
            yield np.arange(start, start + len(chunk)), [s for s, _ in chunk], [t for _, t in chunk]

    return batches


def misaligned(n: int, seed: int = 3) -> tuple[list[tuple[str, str]], set[int]]:
    """The first `n` shipped pairs, 2% of them given the target of a pair far away."""
    rng = random.Random(seed)
    pairs = list(zip(ES[:n], EN[:n]))
    bad = set(rng.sample(range(n), n // 50))
    for i in bad:
        pairs[i] = (pairs[i][0], EN[(i + n // 2) % n])
    return pairs, bad


def test_the_sketch_scores_as_exact_counts_do():
    pairs = list(zip(ES[:400], EN[:400]))
    counts = Counts()
    counts.add([(words(s), words(t)) for s, t in pairs])
    got = np.array([counts.score(words(s), words(t)) for s, t in pairs])
    want = np.array(exact_scores(pairs))
    alone = [i for i in range(len(pairs)) if i not in shares_a_counter(pairs)]
    assert len(alone) > 300 and np.isfinite(want[alone]).sum() > 300
    # the sketch may count a word pair a little over (two counters shared with other pairs)
    same = np.isclose(got[alone], want[alone], rtol=0, atol=1e-3, equal_nan=True)
    assert same.mean() >= 0.99, [pairs[i] for i in np.array(alone)[~same]][:3]
    assert np.isnan(got[alone]).tolist() == np.isnan(want[alone]).tolist() and np.nanmax(np.abs(got - want)) < 0.1


def test_misaligned_pairs_fall_below_the_default_share_and_real_ones_do_not():
    pairs, bad = misaligned(4000)
    share = FiltersConfig().cooccurrence
    dropped = set(low_pairs(batches_of(pairs), np.arange(len(pairs)), share).tolist())
    assert len(dropped & bad) >= 0.8 * len(bad), (len(dropped & bad), len(bad))
    assert len(dropped - bad) <= 0.01 * (len(pairs) - len(bad)), len(dropped - bad)
    # only the rows given are scored, counted and dropped
    rows = np.array(sorted(set(range(len(pairs))) - set(list(bad)[:10])))
    assert not set(low_pairs(batches_of(pairs), rows, share).tolist()) & set(list(bad)[:10])


def test_a_small_corpus_or_one_without_spaces_loses_nothing():
    pairs, _ = misaligned(4000)
    assert low_pairs(batches_of(pairs), np.arange(MIN_PAIRS - 1), 0.33).size == 0
    rng = random.Random(1)
    chinese = [(s, "".join(rng.choice("我你他的是不了在人有这中大来上国个到说们为子和") for _ in range(12))) for s, _ in pairs]
    assert low_pairs(batches_of(chinese), np.arange(len(chinese)), 0.33).size == 0


def _config(tmp_path, corpus, **filters) -> str:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update({"train": str(corpus), "valid": str(SHIPPED / "valid"), "test": None, "max_src_len": 200,
                        "max_tgt_len": 200, "filters": {"langid": False, **filters}})
    raw["model"]["max_positions"] = 256
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def test_tokenize_drops_counts_and_lists_pairs_whose_words_do_not_go_together(tmp_path):
    pairs, bad = misaligned(2500)
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    r = runner.invoke(app, ["tokenize", "-c", _config(tmp_path, corpus)])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert "cooccurrence" in report["filters"]["on"]
    assert report["read"] == len(pairs) == report["kept"] + sum(report["dropped"].values())
    with gzip.open(tmp_path / "run" / "dropped.tsv.gz", "rt", encoding="utf-8") as f:
        found = {int(row.split("\t")[1]) - 1 for row in f.read().splitlines()[1:] if row.split("\t")[2] == "cooccurrence"}
    assert len(found) == report["dropped"]["cooccurrence"] and len(found & bad) >= 0.7 * len(bad)
    assert len(found - bad) <= 0.01 * len(pairs)
    assert any(line.split()[:1] == ["cooccurrence"] and line.split()[-2] == str(len(found)) for line in r.stdout.splitlines())
    r = runner.invoke(app, ["tokenize", "-c", _config(tmp_path, corpus, cooccurrence=None)])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert report["dropped"]["cooccurrence"] == 0 and "cooccurrence" not in report["filters"]["on"]
