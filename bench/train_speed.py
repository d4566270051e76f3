"""Training throughput: ours vs HF Transformers MarianMTModel vs torch.nn.Transformer, one run.

Random init, the same shapes, fixed-length batches of random tokens; for every system the
same update: our label-smoothed cross-entropy, gradient clipping and AdamW as our trainer
builds it (`make_optimizer`: the fused kernel, also HF Trainer's default optimizer);
tokens/s counts source + target tokens.
The systems are timed interleaved (one update of each per round, the median per-update time
per system), so a change in the machine's load hits every system alike.

    python bench/train_speed.py                     # CPU shape of the training issue
    python bench/train_speed.py --adamw plain       # torch's per-parameter AdamW instead
    python bench/train_speed.py --profile ours      # where one system's time goes
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from shapes import add_shape_arguments, hf_marian, our_model

from seq2seq_cli.config import TrainConfig
from seq2seq_cli.loss import label_smoothed_nll
from seq2seq_cli.train import make_optimizer


class TorchTransformer(torch.nn.Module):
    """torch.nn.Transformer with tied embeddings x sqrt(d) and sinusoidal positions."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, ffn: int) -> None:
        super().__init__()
        from seq2seq_cli.model import sinusoidal_table

        self.emb = torch.nn.Embedding(vocab, d, padding_idx=0)
        self.register_buffer("pe", sinusoidal_table(512, d))
        self.net = torch.nn.Transformer(d, heads, layers, layers, ffn, dropout=0.1, batch_first=True)
        self.scale = math.sqrt(d)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        s = self.emb(src) * self.scale + self.pe[: src.size(1)]
        t = self.emb(tgt) * self.scale + self.pe[: tgt.size(1)]
        mask = self.net.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.net(s, t, tgt_mask=mask, tgt_is_causal=True)
        return F.linear(h, self.emb.weight)


def timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(ap)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (one update of every system each)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--systems", nargs="+", default=["ours", "hf", "nn"])
    ap.add_argument("--adamw", choices=["fused", "plain"], default="fused",
                    help="plain: torch's per-parameter AdamW for every system (what the trainer used before)")
    ap.add_argument("--profile", metavar="SYSTEM", help="print a torch.profiler table of SYSTEM's updates instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.len), generator=g)
    tgt = torch.randint(4, args.vocab, (args.batch, args.len + 1), generator=g)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    tokens = args.batch * args.len * 2

    def trainer(model: torch.nn.Module, logits_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        if args.adamw == "fused":
            opt = make_optimizer(model, TrainConfig(max_steps=1, lr=1e-4, betas=(0.9, 0.98)), torch.device("cpu"))
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), foreach=False)
        model.train()

        def step() -> None:
            loss, _, n = label_smoothed_nll(logits_fn(), tgt_out, 0.1)
            opt.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        return step

    steps: dict[str, Callable[[], None]] = {}
    if "ours" in args.systems:
        m = our_model(args, dropout=0.1)
        steps["ours"] = trainer(m, lambda: m(src, tgt_in))
    if "hf" in args.systems:
        hf = hf_marian(args, dropout=0.1)
        mask = torch.ones_like(src)
        steps["hf"] = trainer(hf, lambda: hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in).logits)
    if "nn" in args.systems:
        torch.manual_seed(0)
        nn_model = TorchTransformer(args.vocab, args.d_model, args.heads, args.layers, args.ffn)
        steps["nn.Transformer"] = trainer(nn_model, lambda: nn_model(src, tgt_in))

    if args.profile:
        step = steps[args.profile]
        for _ in range(args.warmup):
            step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
        return

    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            times[name].append(timed(step))
    out = {name: tokens / statistics.median(t) for name, t in times.items()}
    ratios = {f"ours/{k}": out["ours"] / v for k, v in out.items() if k != "ours" and "ours" in out}
    print(json.dumps({"args": vars(args), "tokens_per_s": out, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
