"""Data at scale: the shipped training split repeated to 1M and 10M pairs, from raw text to
the first update.

For each size, in a temporary directory (nothing is kept):

1. `seq2seq tokenize`: SentencePiece (8k pieces, joint) trained on a sample of
   `--sample` sentences (`tokenizer.input_sentence_size`), every line read and checked first.
2. `seq2seq train --set train.max_steps=1`, with that tokenizer, in a fresh run directory,
   once per `data.num_proc` value: time from the process start to the end of the first
   update (the run's `finished at step 1` line: reading, checking and encoding the corpus
   into the Arrow cache, building the model, one update, one checkpoint), the disk the
   encoding cache takes, and the peak RSS.
3. The same again on the run directory of the first `num_proc`, the cache reused (right
   after that first cold run): its time to the `train:` log line (written once the corpus is
   encoded) is the baseline that is subtracted from the cold runs' to give the encoding time
   alone (pairs/s).

Peak RSS is `ru_maxrss` of the `seq2seq` process (`os.wait4`): the largest process, not the
sum with the `data.num_proc` workers. `--weights W1 W2 ...` cuts the corpus into one part per
weight and gives `data.train` as a list of `{path, weight}` corpora; the default is one
corpus.

    PYTHONPATH=. .venv/bin/python bench/data_scale.py [--pairs 1000000 10000000] [--num-proc 1 2]
        [--sample 200000] [--weights 1] [--steps 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "bible-es-en"


def write_corpora(out: Path, pairs: int, weights: list[float]) -> list[str]:
    """The shipped training split repeated to `pairs` pairs, cut into len(weights) parts of
    (nearly) equal size, each a PREFIX.es/PREFIX.en pair -> the prefixes."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [pairs // len(weights) + (i < pairs % len(weights)) for i in range(len(weights))]
    prefixes = [str(out / f"part{i}") for i in range(len(weights))]
    for lang in ("es", "en"):
        lines = (SHIPPED / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        cycle = itertools.cycle(lines)
        for prefix, count in zip(prefixes, parts, strict=True):
            with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
                for _ in range(0, count, 100_000):
                    f.writelines(itertools.islice(cycle, min(100_000, count - _)))
    return prefixes


def write_config(tmp: Path, name: str, prefixes: list[str], weights: list[float], sample: int, steps: int,
                 spm_model: Path | None = None) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["name"], raw["run_dir"] = name, str(tmp / "runs" / name)
    train: str | list[dict] = (prefixes[0] if len(prefixes) == 1
                               else [{"path": p, "weight": w} for p, w in zip(prefixes, weights, strict=True)])
    # the corpus repeats the shipped one, all duplicates: the cleaning filters are off, so that this measures
    # reading and encoding alone (what the filters cost: bench/noise.py)
    raw["data"].update({"train": train, "valid": None, "test": None, "max_src_len": 128, "max_tgt_len": 128,
                        "filters": False})
    raw["tokenizer"].update({"vocab_size": 8000, "input_sentence_size": sample})
    if spm_model is not None:
        raw["tokenizer"]["src_model"] = str(spm_model)
    raw["model"].update({"d_model": 64, "ffn_size": 128, "heads": 2})
    raw["train"].update({"max_steps": steps, "valid_every": 10_000, "log_every": 10_000, "threads": 2, "max_tokens": 2048})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def run(*args: str) -> dict:
    """Run `seq2seq ARGS` -> {"seconds": wall time, "peak_rss_mib", "lines": {first word: seconds
    from the start}} (the time the last stderr line starting with that word came: the last
    `train:` line is written once every training corpus is encoded)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: dict[str, float] = {}
    text = []
    for line in proc.stderr:
        text.append(line)
        lines[line.split(":")[0].split(" ")[0]] = time.perf_counter() - start
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit("".join(text))
    return {"seconds": seconds, "peak_rss_mib": usage.ru_maxrss / 1024, "lines": lines}


def disk_mib(root: Path) -> float:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file()) / 2**20


def measure(tmp: Path, pairs: int, weights: list[float], sample: int, num_procs: list[int], steps: int) -> dict:
    prefixes = write_corpora(tmp / "corpus", pairs, weights)
    out: dict = {"pairs": pairs, "corpora": len(prefixes), "corpus_mib": disk_mib(tmp / "corpus")}
    print(f"{pairs:,} pairs in {len(prefixes)} corpora, {out['corpus_mib']:.0f} MiB of text", flush=True)

    tok_cfg = write_config(tmp, "tok", prefixes, weights, sample, steps)
    tok = run("tokenize", "--config", str(tok_cfg))
    out["tokenize_s"], out["tokenize_peak_rss_mib"] = tok["seconds"], tok["peak_rss_mib"]
    print(f"  tokenize (sample {sample:,}): {tok['seconds']:.1f} s, peak RSS {tok['peak_rss_mib']:.0f} MiB", flush=True)
    spm_model = tmp / "runs" / "tok" / "spm.model"

    for i, proc in enumerate(num_procs):
        cfg = write_config(tmp, f"p{proc}", prefixes, weights, sample, steps, spm_model)
        r = run("train", "--config", str(cfg), "--no-progress", "--set", f"data.num_proc={proc}")
        cache = disk_mib(tmp / "runs" / f"p{proc}" / "cache")
        out[f"num_proc_{proc}"] = {"first_update_s": r["lines"]["finished"], "encoded_at_s": r["lines"]["train"],
                                   "peak_rss_mib": r["peak_rss_mib"], "cache_mib": cache}
        print(f"  train, num_proc {proc}: first update after {r['lines']['finished']:.1f} s, "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB, cache {cache:.0f} MiB", flush=True)
        if i == 0:  # the cached run next, so that a run stopped early has its baseline
            out["cached"] = warm = rerun_cached(tmp, proc)
            print(f"  train, cache reused: first update after {warm['first_update_s']:.1f} s, "
                  f"peak RSS {warm['peak_rss_mib']:.0f} MiB", flush=True)
        print(f"  encoding, num_proc {proc}: {encoding(out, proc, pairs)}", flush=True)
    return out


def rerun_cached(tmp: Path, proc: int) -> dict:
    """The first run's config again on its run directory (its checkpoints and metrics removed):
    the encoded cache is reused."""
    run_dir = tmp / "runs" / f"p{proc}"
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "metrics.jsonl").unlink()
    warm = run("train", "--config", str(tmp / f"p{proc}.yaml"), "--no-progress", "--set", f"data.num_proc={proc}")
    return {"first_update_s": warm["lines"]["finished"], "encoded_at_s": warm["lines"]["train"],
            "peak_rss_mib": warm["peak_rss_mib"]}


def encoding(out: dict, proc: int, pairs: int) -> str:
    """The cold run's time to its `train:` line less the cached run's: the encoding alone."""
    entry = out[f"num_proc_{proc}"]
    seconds = entry["encoded_at_s"] - out["cached"]["encoded_at_s"]
    entry.update({"encode_s": seconds, "encode_pairs_per_s": pairs / seconds})
    return f"{seconds:.1f} s, {pairs / seconds:,.0f} pairs/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sample", type=int, default=200_000, help="tokenizer.input_sentence_size")
    ap.add_argument("--weights", type=float, nargs="+", default=[1.0], help="one corpus per weight")
    ap.add_argument("--steps", type=int, default=1, help="train.max_steps of the timed runs")
    args = ap.parse_args()
    results = []
    for pairs in args.pairs:
        with tempfile.TemporaryDirectory() as name:
            results.append(measure(Path(name), pairs, args.weights, args.sample, args.num_proc, args.steps))
    if len(results) > 1:
        for key in ("tokenize_peak_rss_mib",):
            print(f"ratio {key}: {results[-1][key] / results[0][key]:.3f}")
        for part in [f"num_proc_{p}" for p in args.num_proc] + ["cached"]:
            print(f"ratio peak RSS {part}: {results[-1][part]['peak_rss_mib'] / results[0][part]['peak_rss_mib']:.3f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
