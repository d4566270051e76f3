"""Decoding speed: ours vs HF Transformers MarianMTModel.generate vs CTranslate2, one run.

Same shapes for every system (random weights; ours and CTranslate2 share the very same
weights through the exporter), the same batch of sources, and a forced output length
(EOS banned before it, forced at it), so every system emits the same number of tokens.
The systems are timed in turns (one call of each per round) and the median is kept.

    python bench/decode_speed.py                       # CPU shape of the decoding issue
    python bench/decode_speed.py --device cuda --d-model 512 --layers 6 --vocab 32000 \
        --sentences 128 --out-len 32 --dtype bf16      # GPU shape
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from shapes import add_shape_arguments, hf_marian, our_model

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.onednn import for_decoding
from seq2seq_cli.decode.search import search


def interleaved(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each system, timed in turns (one call of each per round),
    so that load from other processes falls on every system alike."""
    for fn in runs.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def profile_table(fn: Callable[[], object], rows: int = 12) -> str:
    """Where one call's time goes, by operator (torch profiler, self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(ap)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--out-len", type=int, default=24)
    ap.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--systems", nargs="+", default=["ours", "hf", "ct2"])
    ap.add_argument("--profile", action="store_true", help="also print where our search spends its time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    ours = our_model(args, dropout=0.0).eval()
    g = torch.Generator().manual_seed(0)
    body = torch.randint(4, args.vocab, (args.sentences, args.src_len), generator=g)
    src = torch.cat([body, torch.full((args.sentences, 1), 3)], dim=1)  # + EOS
    results: dict[str, dict[str, float]] = {}
    hf = hf_marian(args, dropout=0.0).eval().to(dev, dtype) if "hf" in args.systems else None
    ct = None
    if "ct2" in args.systems and args.device == "cpu":
        import ctranslate2

        from seq2seq_cli.convert.export import convert_ctranslate2

        vocab = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, args.vocab)]
        with tempfile.TemporaryDirectory() as tmp:
            convert_ctranslate2(ours.float().cpu(), vocab, vocab, Path(tmp) / "ct2")
            ct = ctranslate2.Translator(str(Path(tmp) / "ct2"), device="cpu", intra_threads=args.threads, inter_threads=1)
        tokens = [[vocab[i] for i in r] for r in body.tolist()]
    m, s = for_decoding(ours.to(dev, dtype)), src.to(dev)  # packed for oneDNN once, as the translator does

    for beam in args.beams:
        runs: dict[str, Callable[[], object]] = {}
        if "ours" in args.systems:
            opts = DecodeConfig(beam_size=beam, min_len=args.out_len, max_len_a=0, max_len_b=args.out_len)
            assert all(len(h[0].tokens) == args.out_len for h in search(m, s, opts))
            runs["ours"] = lambda opts=opts: search(m, s, opts)
            if args.profile:
                print(f"# beam {beam}: ours\n" + profile_table(runs["ours"]))
        if hf is not None:
            mask = torch.ones_like(s)

            def gen(beam: int = beam, mask: torch.Tensor = mask) -> torch.Tensor:
                with torch.no_grad():
                    return hf.generate(input_ids=s, attention_mask=mask, num_beams=beam, do_sample=False,
                                       min_new_tokens=args.out_len, max_new_tokens=args.out_len)

            assert gen().shape[1] == args.out_len + 1  # decoder start + forced length
            runs["hf"] = gen
        if ct is not None:

            def ct_run(beam=beam):
                return ct.translate_batch(tokens, beam_size=beam, min_decoding_length=args.out_len,
                                          max_decoding_length=args.out_len, max_batch_size=args.sentences)

            assert all(len(r.hypotheses[0]) == args.out_len for r in ct_run())
            runs["ct2"] = ct_run
        row = results.setdefault(f"beam{beam}", {})
        for name, seconds in interleaved(runs, args.repeats).items():
            row[name] = args.sentences / seconds
        for k, v in list(row.items()):
            if not k.startswith("ours") and "ours" in row:
                row[f"ours/{k}"] = row["ours"] / v
    print(json.dumps({"args": vars(args), "sentences_per_s": results}, indent=1))


if __name__ == "__main__":
    main()
