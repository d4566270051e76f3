"""Test BLEU of every checkpoint of a run against the training time it was saved at.

One process loads each step checkpoint of RUN in turn (`Translator.load`, as `seq2seq
translate` does), translates the split's source with the given beam and scores it with
`seq2seq_cli.decode.evaluate.score` (sacreBLEU, with its signature). A checkpoint's time is the
`elapsed_s` of its step's validation record in RUN/metrics.jsonl (training time since the run
began, validations included). Writes the points as JSON and a plot of BLEU against minutes.

    python bench/bleu_curve.py runs/bible-es-en --split test --beam 5 --out-json curve.json --out-png curve.png
"""

from __future__ import annotations

import argparse
import json
import re
import time
import traceback
from pathlib import Path

import yaml

from seq2seq_cli.decode.evaluate import score
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.fileio import read_lines

# What the GPU issue compares against: HF MarianMTModel from scratch, same data and recipe.
HF_POINTS = [(6.5, 24.75), (8.8, 27.34)]
TARGET_BLEU = 30.0


def step_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, weights file) of RUN/checkpoints/step-N.safetensors, by step."""
    found = []
    for p in (run / "checkpoints").glob("step-*.safetensors"):
        if m := re.fullmatch(r"step-(\d+)\.safetensors", p.name):
            found.append((int(m.group(1)), p))
    return sorted(found)


def validation_times(run: Path) -> dict[int, float]:
    """step -> elapsed_s of that step's validation record (the last one, if a step was resumed)."""
    times: dict[int, float] = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if "valid_loss" in rec and "elapsed_s" in rec:
            times[int(rec["step"])] = float(rec["elapsed_s"])
    return times


def split_files(run: Path, split: str) -> tuple[Path, Path]:
    """The source and reference files of `split` (train, valid or test) in the run's config."""
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    data = config["data"]
    prefix = data.get(split)
    if not prefix:
        raise SystemExit(f"{run / 'config.yaml'}: data.{split} is not set; pass --src and --ref")
    return Path(f"{prefix}.{data['src_lang']}"), Path(f"{prefix}.{data['tgt_lang']}")


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ok = [p for p in points if p.get("bleu") is not None]
    ax.plot([p["minutes"] for p in ok], [p["bleu"] for p in ok], "o-", label="ours")
    ax.plot(*zip(*HF_POINTS), "s--", color="grey", label="HF MarianMTModel (issue figures)")
    ax.axhline(TARGET_BLEU, color="red", linestyle=":", label=f"target {TARGET_BLEU:g}")
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("test BLEU")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="run directory")
    ap.add_argument("--split", default="test", help="split of the run's config: test, valid or train")
    ap.add_argument("--src", type=Path, help="source file instead of the split's")
    ap.add_argument("--ref", type=Path, help="reference file instead of the split's")
    ap.add_argument("--limit", type=int, help="only the first N lines")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", help="decode precision (DecodeConfig.precision), when this version has it")
    ap.add_argument("--deadline-s", type=float,
                    help="start no checkpoint after this many seconds; checkpoints are then taken newest first")
    ap.add_argument("--out-json", type=Path, required=True)
    ap.add_argument("--out-png", type=Path)
    args = ap.parse_args()

    src, ref = split_files(args.run, args.split) if args.src is None or args.ref is None else (args.src, args.ref)
    sources, refs = read_lines(src), read_lines(ref)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    times = validation_times(args.run)
    overrides: dict[str, object] = {"beam_size": args.beam}
    if args.precision:
        overrides["precision"] = args.precision

    points: list[dict] = []
    signature = None
    began = time.perf_counter()
    checkpoints = step_checkpoints(args.run)
    if args.deadline_s is not None:  # the final model first, then back in time, as long as time allows
        checkpoints.reverse()
    for step, path in checkpoints:
        if args.deadline_s is not None and time.perf_counter() - began > args.deadline_s:
            points.append({"step": step, "checkpoint": str(path), "skipped": "deadline"})
            print(f"step {step}: skipped (deadline of {args.deadline_s:.0f} s)", flush=True)
            continue
        point: dict = {"step": step, "checkpoint": str(path), "elapsed_s": times.get(step)}
        point["minutes"] = point["elapsed_s"] / 60 if point["elapsed_s"] is not None else None
        try:
            start = time.perf_counter()
            translator = Translator.load(path, args.device, overrides)
            hyps = translator.translate(sources)
            scores = score(hyps, refs)
            point.update(bleu=round(scores.bleu, 2), chrf=round(scores.chrf, 2), decode_s=time.perf_counter() - start)
            signature = scores.bleu_signature
            print(f"step {step}: {point['minutes'] or 0:.2f} min, BLEU {scores.bleu:.2f}, "
                  f"chrF {scores.chrf:.2f} ({point['decode_s']:.1f} s)", flush=True)
            del translator
        except Exception as exc:  # one bad checkpoint must not cost the others
            point["error"] = traceback.format_exception_only(type(exc), exc)[-1].strip()
            print(f"step {step}: {point['error']}", flush=True)
        points.append(point)

    points.sort(key=lambda p: p["step"])
    result = {
        "run": str(args.run), "split": args.split, "src": str(src), "ref": str(ref), "sentences": len(sources),
        "beam": args.beam, "device": args.device, "precision": args.precision, "bleu_signature": signature,
        "points": points, "hf_points_minutes_bleu": HF_POINTS, "target_bleu": TARGET_BLEU,
    }
    args.out_json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.out_png:
        plot([p for p in points if p.get("minutes") is not None and "bleu" in p], args.out_png,
             f"{args.run.name}: {args.split} BLEU, beam {args.beam}, {len(sources)} sentences")
    if not any("bleu" in p for p in points):
        raise SystemExit(f"{args.run}: no checkpoint could be scored")


if __name__ == "__main__":
    main()
