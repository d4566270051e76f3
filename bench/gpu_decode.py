"""Decoding a file: `seq2seq translate` against HF `MarianMTModel.generate` on the same weights.

Ours is timed twice: the whole command in a fresh process (`python -m seq2seq_cli translate`,
imports, loading, tokenising, decoding and writing included), and in this process
(`Translator.load`, then `Translator.translate`: loading and decoding timed apart). HF runs in
this process on `seq2seq export --format hf` of the same run: `MarianTokenizer` +
`MarianMTModel.generate` (beam search, batches of --hf-batch sentences sorted by length,
`max_new_tokens` = a * longest source + b of each batch, the run's decode.max_len_a and _b),
in --hf-dtype; load (and one warm-up batch) timed apart from decoding. Both outputs are scored
with sacreBLEU against the references.

    python bench/gpu_decode.py runs/bible-es-en --hf-dir runs/bible-es-en-hf --device cuda --json decode.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from seq2seq_cli.decode.evaluate import score
from seq2seq_cli.fileio import read_lines, write_lines


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def error_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def ours_process(args: argparse.Namespace, src: Path, out: Path) -> dict:
    """The command, in a fresh process, timed from outside."""
    cmd = [sys.executable, "-m", "seq2seq_cli", "translate", "--model", str(args.run), "--input", str(src),
           "--output", str(out), "--beam-size", str(args.beam), "--device", args.device, "--no-progress"]
    if args.precision:
        cmd += ["--precision", args.precision]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    result = {"command": " ".join(cmd), "wall_s": wall, "returncode": proc.returncode}
    if proc.returncode != 0:
        result["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return result


def ours_in_process(args: argparse.Namespace, sources: list[str]) -> tuple[dict, list[str]]:
    from seq2seq_cli.decode.translate import Translator

    overrides: dict[str, object] = {"beam_size": args.beam}
    if args.precision:
        overrides["precision"] = args.precision
    start = time.perf_counter()
    translator = Translator.load(args.run, args.device, overrides)
    translator.translate(sources[:8])  # warm-up: CUDA context, kernels
    sync(args.device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    hyps = translator.translate(sources)
    sync(args.device)
    return {"load_and_warmup_s": load_s, "decode_s": time.perf_counter() - start}, hyps


def hf_generate(args: argparse.Namespace, sources: list[str]) -> tuple[dict, list[str]]:
    import yaml
    from transformers import MarianMTModel, MarianTokenizer

    decode = yaml.safe_load((args.run / "config.yaml").read_text(encoding="utf-8"))["decode"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.hf_dtype]
    start = time.perf_counter()
    tokenizer = MarianTokenizer.from_pretrained(args.hf_dir)
    model = MarianMTModel.from_pretrained(args.hf_dir, dtype=dtype).to(args.device).eval()
    load_s = time.perf_counter() - start

    def translate(lines: list[str]) -> list[str]:
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        out = [""] * len(lines)
        for i in range(0, len(order), args.hf_batch):
            rows = order[i : i + args.hf_batch]
            enc = tokenizer([lines[r] for r in rows], return_tensors="pt", padding=True, truncation=True).to(args.device)
            width = enc["input_ids"].shape[1]
            with torch.inference_mode():
                gen = model.generate(**enc, num_beams=args.beam, do_sample=False, length_penalty=1.0,
                                     max_new_tokens=math.ceil(decode["max_len_a"] * width + decode["max_len_b"]))
            for r, text in zip(rows, tokenizer.batch_decode(gen, skip_special_tokens=True)):
                out[r] = text
        return out

    start = time.perf_counter()
    translate(sources[:8])
    sync(args.device)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    hyps = translate(sources)
    sync(args.device)
    return {"load_s": load_s, "warmup_s": warmup_s, "decode_s": time.perf_counter() - start,
            "dtype": args.hf_dtype, "batch": args.hf_batch}, hyps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="run directory")
    ap.add_argument("--hf-dir", type=Path, required=True, help="`seq2seq export --format hf` of the run")
    ap.add_argument("--src", type=Path, default=Path("data/bible-es-en/test.es"))
    ap.add_argument("--ref", type=Path, default=Path("data/bible-es-en/test.en"))
    ap.add_argument("--limit", type=int, help="only the first N lines")
    ap.add_argument("--repeat", type=int, default=1, help="translate the lines this many times over (longer timings)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", help="ours: --precision of translate (decode.precision), when this version has it")
    ap.add_argument("--hf-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--hf-batch", type=int, default=128)
    ap.add_argument("--systems", nargs="+", default=["process", "ours", "hf"], choices=["process", "ours", "hf"])
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    sources, refs = read_lines(args.src), read_lines(args.ref)
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    sources, refs = sources * args.repeat, refs * args.repeat
    n = len(sources)
    result: dict = {"run": str(args.run), "hf_dir": str(args.hf_dir), "sentences": n, "repeat": args.repeat,
                    "beam": args.beam, "device": args.device, "precision": args.precision, "torch": torch.__version__}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src.txt"
        write_lines(src, sources)
        if "process" in args.systems:
            out = Path(tmp) / "ours.txt"
            try:
                r = ours_process(args, src, out)
                if r["returncode"] == 0:
                    r["sentences_per_s"] = n / r["wall_s"]
                    r["bleu"] = round(score(read_lines(out), refs).bleu, 2)
            except Exception as exc:  # record and go on with the other systems
                r = {"error": error_line(exc)}
            result["ours_process"] = r
            print("ours (process):", json.dumps(r), flush=True)

    def in_process(name: str, label: str, system) -> None:
        """Time one in-process system on the sources; its figures (or its error) go in result[name]."""
        try:
            r, hyps = system(args, sources)
            r["sentences_per_s"] = n / r["decode_s"]
            setup = r.get("load_and_warmup_s", 0.0) + r.get("load_s", 0.0) + r.get("warmup_s", 0.0)
            r["sentences_per_s_with_load"] = n / (r["decode_s"] + setup)
            s = score(hyps, refs)
            r.update(bleu=round(s.bleu, 2), chrf=round(s.chrf, 2), bleu_signature=s.bleu_signature)
        except Exception as exc:  # record and go on with the other systems
            r = {"error": error_line(exc)}
        result[name] = r
        print(f"{label}:", json.dumps(r), flush=True)

    if "ours" in args.systems:
        in_process("ours", "ours (in process)", ours_in_process)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if "hf" in args.systems:
        in_process("hf", "hf generate", hf_generate)

    hf_speed = result.get("hf", {}).get("sentences_per_s")
    if hf_speed:
        result["ratios"] = {
            "ours/hf (decoding only)": result.get("ours", {}).get("sentences_per_s", 0) / hf_speed,
            "ours process/hf with load": (result.get("ours_process", {}).get("sentences_per_s", 0)
                                          / result["hf"]["sentences_per_s_with_load"]),
        }
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result.get("ratios", {})), flush=True)
    failed = [k for k in ("ours_process", "ours", "hf") if "error" in result.get(k, {})]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (see {args.json})")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
