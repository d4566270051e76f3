"""Decoding speed: ours vs HF Transformers MarianMTModel.generate vs CTranslate2, one run.

Same shapes for every system (random weights; ours and CTranslate2 share the very same
weights through the exporter), the same batch of sources, and a forced output length
(EOS banned before it, forced at it), so every system emits the same number of tokens.

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
from pathlib import Path

import torch

from shapes import add_shape_arguments, hf_marian, our_model

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.search import search


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(ap)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--out-len", type=int, default=24)
    ap.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--systems", nargs="+", default=["ours", "hf", "ct2"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    ours = our_model(args, dropout=0.0).eval()
    g = torch.Generator().manual_seed(0)
    body = torch.randint(4, args.vocab, (args.sentences, args.src_len), generator=g)
    src = torch.cat([body, torch.full((args.sentences, 1), 3)], dim=1)  # + EOS
    results: dict[str, dict[str, float]] = {}

    for beam in args.beams:
        row = results.setdefault(f"beam{beam}", {})
        if "ours" in args.systems:
            m = ours.to(dev, dtype)
            opts = DecodeConfig(beam_size=beam, min_len=args.out_len, max_len_a=0, max_len_b=args.out_len)
            s = src.to(dev)
            out = search(m, s, opts)
            assert all(len(h[0].tokens) == args.out_len for h in out)
            row["ours"] = args.sentences / timed(lambda: search(m, s, opts), args.repeats)
        if "hf" in args.systems:
            hf = hf_marian(args, dropout=0.0).eval().to(dev, dtype)
            s = src.to(dev)
            mask = torch.ones_like(s)

            def gen():
                with torch.no_grad():
                    return hf.generate(input_ids=s, attention_mask=mask, num_beams=beam, do_sample=False,
                                       min_new_tokens=args.out_len, max_new_tokens=args.out_len)

            assert gen().shape[1] == args.out_len + 1  # decoder start + forced length
            row["hf"] = args.sentences / timed(gen, args.repeats)
        if "ct2" in args.systems and args.device == "cpu":
            import ctranslate2

            from seq2seq_cli.export import convert_ctranslate2

            vocab = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, args.vocab)]
            with tempfile.TemporaryDirectory() as tmp:
                convert_ctranslate2(ours.float().cpu(), vocab, vocab, Path(tmp) / "ct2")
                ct = ctranslate2.Translator(str(Path(tmp) / "ct2"), device="cpu", intra_threads=args.threads, inter_threads=1)
            tokens = [[vocab[i] for i in r] for r in body.tolist()]

            def ct_run():
                return ct.translate_batch(tokens, beam_size=beam, min_decoding_length=args.out_len,
                                          max_decoding_length=args.out_len, max_batch_size=args.sentences)

            assert all(len(r.hypotheses[0]) == args.out_len for r in ct_run())
            row["ct2"] = args.sentences / timed(ct_run, args.repeats)
        for k, v in list(row.items()):
            if not k.startswith("ours") and "ours" in row:
                row[f"ours/{k}"] = row["ours"] / v
    print(json.dumps({"args": vars(args), "sentences_per_s": results}, indent=1))


if __name__ == "__main__":
    main()
