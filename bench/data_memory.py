"""Training memory against corpus size, and encoding throughput.

1. Peak RSS of `seq2seq train` (50 steps, a small model, the same config and the same
   SentencePiece model) on the shipped training corpus and on that corpus repeated 20 times.
   Each run is a fresh process with a fresh run directory, so the peak includes reading,
   checking and encoding the corpus into the Arrow cache; a second run on the same directory
   (cache reused) is measured too. Training memory should not grow with the corpus.
2. Encoding throughput: the shipped corpus repeated to 1M pairs, read + checked + encoded +
   filtered + cached (`encoding.encoded_split`, SentencePiece already trained), in pairs/s.

    .venv/bin/python bench/data_memory.py [--repeat 20] [--steps 50] [--pairs 1000000] [--num-proc 1 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "bible-es-en"

# Runs `seq2seq train` as a child and prints the child's peak RSS (KiB) as the last line.
MEASURE = """
import resource, subprocess, sys
rc = subprocess.run([sys.executable, "-m", "seq2seq_cli", "train", "--config", sys.argv[1], "--no-progress"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
if rc.returncode:
    sys.exit(rc.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def repeat_corpus(out: Path, times: int | None = None, pairs: int | None = None) -> str:
    """Write train.es/train.en repeating the shipped training split; return the prefix."""
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("es", "en"):
        lines = (SHIPPED / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        count = pairs if pairs is not None else len(lines) * (times or 1)
        with open(out / f"train.{lang}", "w", encoding="utf-8") as f:
            f.writelines(itertools.islice(itertools.cycle(lines), count))
    return str(out / "train")


def write_config(tmp: Path, name: str, train: str, spm_model: Path, steps: int) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["name"], raw["run_dir"] = name, str(tmp / "runs" / name)
    # the corpus repeats the shipped one, all duplicates: the cleaning filters are off, so that this measures
    # reading and encoding alone (what the filters cost: bench/noise.py)
    raw["data"].update({"train": train, "valid": None, "test": None, "max_src_len": 128, "max_tgt_len": 128,
                        "filters": False})
    raw["tokenizer"].update({"src_model": str(spm_model), "vocab_size": 4000})
    raw["model"].update({"d_model": 64, "ffn_size": 128, "heads": 2})
    raw["train"].update({"max_steps": steps, "valid_every": 10_000, "log_every": 10, "threads": 2, "max_tokens": 2048})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def peak_rss_mib(config: Path) -> float:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(config)], cwd=REPO, check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="size of the large corpus, in copies of the shipped one")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=1_000_000, help="pairs for the encoding throughput; 0 = skip")
    ap.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from seq2seq_cli.config import Config, DataConfig, FiltersConfig, TokenizerConfig, TrainConfig
    from seq2seq_cli.data.tokenizer import load_tokenizers
    from seq2seq_cli.run.tokenizing import train_tokenizer

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        small = repeat_corpus(tmp / "x1", 1)
        large = repeat_corpus(tmp / f"x{args.repeat}", args.repeat)
        # One SentencePiece model (vocab 4000) trained on the shipped corpus, supplied to every run.
        tok = Config(name="spm", run_dir=str(tmp / "spm"), data=DataConfig(train=small, src_lang="es", tgt_lang="en"),
                     tokenizer=TokenizerConfig(vocab_size=4000), train=TrainConfig(max_steps=1))
        (spm_model,) = train_tokenizer(tok)

        results = {}
        for label, train in (("x1", small), (f"x{args.repeat}", large)):
            config = write_config(tmp, label, train, spm_model, args.steps)
            cold = peak_rss_mib(config)
            # second run: same run directory, cache reused (checkpoints moved aside so it trains again)
            run = tmp / "runs" / label
            for f in (run / "checkpoints").glob("*"):
                f.unlink()
            (run / "metrics.jsonl").unlink()
            warm = peak_rss_mib(config)
            pairs = sum(1 for _ in open(f"{train}.es", encoding="utf-8"))
            results[label] = {"pairs": pairs, "peak_rss_mib_encoding": cold, "peak_rss_mib_cached": warm}
            print(f"{label}: {pairs:,} pairs, peak RSS {cold:.0f} MiB (encoding in the run), {warm:.0f} MiB (cache reused)",
                  flush=True)
        big = results[f"x{args.repeat}"]
        for key in ("peak_rss_mib_encoding", "peak_rss_mib_cached"):
            print(f"ratio x{args.repeat}/x1 ({key}): {big[key] / results['x1'][key]:.3f}")

        million = repeat_corpus(tmp / "million", pairs=args.pairs) if args.pairs else ""
        src_sp, tgt_sp = load_tokenizers(tok.run_path, True)
        from seq2seq_cli.data.encoding import encoded_split

        for proc in args.num_proc if args.pairs else []:
            cfg = Config(name="enc", run_dir=str(tmp / f"enc{proc}"),
                         data=DataConfig(train=million, src_lang="es", tgt_lang="en", num_proc=proc, max_src_len=256,
                                         max_tgt_len=256, filters=FiltersConfig(enabled=False)),
                         train=TrainConfig(max_steps=1))
            start = time.perf_counter()
            corpus = encoded_split(cfg, million, src_sp, tgt_sp, training=True)
            seconds = time.perf_counter() - start
            results[f"encode_num_proc_{proc}"] = {"pairs": args.pairs, "seconds": seconds, "pairs_per_s": args.pairs / seconds}
            print(f"encode {args.pairs:,} pairs, num_proc {proc}: {seconds:.1f} s, {args.pairs / seconds:,.0f} pairs/s "
                  f"({len(corpus):,} kept)", flush=True)
        print(json.dumps(results))


if __name__ == "__main__":
    main()
