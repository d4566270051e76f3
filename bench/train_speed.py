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

On a GPU (the shape of the GPU issue; `bench/gpu.sh speed` runs this):

    python bench/train_speed.py --device cuda --precision bf16 --d-model 512 --layers 6 --heads 8 \
        --ffn 2048 --vocab 32000 --batch 256 --len 64 --compile ours hf --json speed.json

`--compile SYSTEMS` adds a `torch.compile`d copy of those systems ("ours+compile", ...) next to
the eager ones. A system that fails to build, compile or run (out of memory, say) is dropped
and its error recorded; the others go on.

MFU (model FLOPs utilisation) = model FLOP/s / peak FLOP/s. Model FLOPs per update come from
`seq2seq_cli.model.info.flop_estimate`, the estimate `seq2seq info` prints, for one sentence pair of
S = T = --len tokens, times --batch; the same count for every system (all three compute the
same products). Only matrix products count, a multiply-add = 2 FLOPs; with D = d_model,
H heads of size Dk = Dv = D/H, F = FFN size, V = vocabulary, N layers per side:

    linear(n, a, b)  = 2 n a b
    attention(q, k)  = 2 q k H (Dk + Dv)                       Q K^T and weights x V
    proj(n)          = linear(n, D, 3 D) + linear(n, D, D)     W_Q, W_K, W_V, W_O
    ffn(n)           = linear(n, D, F) + linear(n, F, D)
    forward(S, T)    = N [proj(S) + attention(S, S) + ffn(S)]                      encoder
                     + N linear(S, D, 2 D)                                          cross-attention K, V
                     + N [proj(T) + attention(T, T) + 2 linear(T, D, D)
                          + attention(T, S) + ffn(T)]                                decoder
                     + linear(T, D, V)                                              output layer
    update           = 3 forward(S, T) x batch             the backward multiplies twice per forward product

Attention is counted over the full score matrices (causal masking included, as the kernels
compute them). At the GPU shape (D 512, N 6, H 8, F 2048, V 32000, S = T = 64) this is 7.89
GFLOP forward and 23.66 GFLOP per sentence pair and update, 184.8 MFLOP per token
(source + target): 558,518 tokens/s is 1.03e14 FLOP/s, 10.4% of 989 TFLOP/s.
`--peak-tflops` defaults to the dense bf16 peak of the GPU when its name is known (H100 and
H200: 989; A100: 312); on a CPU no MFU is reported unless it is given.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from shapes import add_shape_arguments, hf_marian, our_model, shape_config

from seq2seq_cli.config import TrainConfig
from seq2seq_cli.device import autocast
from seq2seq_cli.model.info import flop_estimate
from seq2seq_cli.train.loss import label_smoothed_nll
from seq2seq_cli.train.setup import make_optimizer

# Dense (no sparsity) bf16/fp16 tensor-core peaks, TFLOP/s, by a piece of the device name.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


class TorchTransformer(torch.nn.Module):
    """torch.nn.Transformer with tied embeddings x sqrt(d) and sinusoidal positions."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, ffn: int) -> None:
        super().__init__()
        from seq2seq_cli.model.transformer import sinusoidal_table

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


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Seconds of one call; on CUDA the queued work before and the step's own are waited for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def update_flops(args: argparse.Namespace) -> int:
    """Model FLOPs of one update: 3 x forward of `batch` sentence pairs of --len + --len tokens."""
    return args.batch * flop_estimate(shape_config(args), args.vocab, args.len, args.len).training


def peak_tflops(args: argparse.Namespace, device: torch.device) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def describe_error(exc: BaseException) -> str:
    """The exception's last line (type and message), for the record."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(ap)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="timed rounds (one update of every system each)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--systems", nargs="+", default=["ours", "hf", "nn"], choices=["ours", "hf", "nn"])
    ap.add_argument("--compile", nargs="*", default=[], choices=["ours", "hf", "nn"], metavar="SYSTEM",
                    help="also time a torch.compile'd copy of these systems (ours, hf, nn)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="autocast dtype of the forward pass; fp16 scales the loss (GradScaler)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak FLOP/s (TFLOP/s) for MFU; default: the GPU's dense bf16 peak when known, none on CPU")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the result here")
    ap.add_argument("--adamw", choices=["fused", "plain"], default="fused",
                    help="plain: torch's per-parameter AdamW for every system (what the trainer used before)")
    ap.add_argument("--profile", metavar="SYSTEM", help="print a torch.profiler table of SYSTEM's updates instead")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.len), generator=g).to(device)
    tgt = torch.randint(4, args.vocab, (args.batch, args.len + 1), generator=g).to(device)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    tokens = args.batch * args.len * 2
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")

    def trainer(model: torch.nn.Module, logits_fn: Callable[[torch.nn.Module], torch.Tensor],
                compiled: bool) -> Callable[[], None]:
        model.to(device)
        if args.adamw == "fused":
            opt = make_optimizer(model, TrainConfig(max_steps=1, lr=1e-4, betas=(0.9, 0.98)), device)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), foreach=False)
        model.train()
        forward = torch.compile(model) if compiled else model

        def step() -> None:
            with autocast(device, args.precision):
                logits = logits_fn(forward)
            loss, _, n = label_smoothed_nll(logits, tgt_out, 0.1)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss / n).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()

        return step

    def build(name: str) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
        if name == "ours":
            return our_model(args, dropout=0.1), lambda m: m(src, tgt_in)
        if name == "hf":
            mask = torch.ones_like(src)
            return hf_marian(args, dropout=0.1), lambda m: m(input_ids=src, attention_mask=mask,
                                                            decoder_input_ids=tgt_in).logits
        torch.manual_seed(0)
        return TorchTransformer(args.vocab, args.d_model, args.heads, args.layers, args.ffn), lambda m: m(src, tgt_in)

    label = {"ours": "ours", "hf": "hf", "nn": "nn.Transformer"}
    steps: dict[str, Callable[[], None]] = {}
    errors: dict[str, str] = {}
    wanted = [(label[s], s, False) for s in args.systems] + [(f"{label[s]}+compile", s, True) for s in args.compile]
    for name, system, compiled in wanted:
        try:
            model, logits_fn = build(system)
            steps[name] = trainer(model, logits_fn, compiled)
        except Exception as exc:  # out of memory, say: record it and time the others
            errors[name] = f"build: {describe_error(exc)}"
            print(f"{name}: {errors[name]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    if args.profile:
        step = steps[args.profile]
        for _ in range(args.warmup):
            step()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.steps):
                step()
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=30))
        return

    def run(name: str, step: Callable[[], None]) -> float | None:
        """One update of a system, timed; None (and the system dropped) when it fails."""
        try:
            return timed(step, device)
        except Exception as exc:  # out of memory, a compile error: record it, go on with the others
            errors[name] = describe_error(exc)
            print(f"{name}: {errors[name]}", flush=True)
            del steps[name]
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    warmup_s: dict[str, float] = {}
    for _ in range(args.warmup):
        for name, step in list(steps.items()):
            if (t := run(name, step)) is not None:
                warmup_s[name] = warmup_s.get(name, 0.0) + t
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in list(steps.items()):
            if (t := run(name, step)) is not None:
                times[name].append(t)
    times = {name: t for name, t in times.items() if name in steps and t}

    out = {name: tokens / statistics.median(t) for name, t in times.items()}
    ratios = {f"ours/{k}": out["ours"] / v for k, v in out.items() if k != "ours" and "ours" in out}
    flops = update_flops(args)
    peak = peak_tflops(args, device)
    result: dict[str, object] = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tokens_per_s": out, "ratios": ratios, "errors": errors,
        "median_update_s": {name: statistics.median(t) for name, t in times.items()},
        "warmup_s": warmup_s,  # compile time included for the compiled systems
        "flops_per_update": flops, "flops_per_token": flops / tokens,
        "peak_tflops": peak,
        "mfu": {name: flops * (tps / tokens) / (peak * 1e12) for name, tps in out.items()} if peak else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
