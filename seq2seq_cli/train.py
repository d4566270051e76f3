"""`train(config) -> run_dir`: one loop, top to bottom.

text files -> tokenizer -> encoded pairs -> token-budget batches -> model -> label-smoothed
cross-entropy -> Adam with inverse-sqrt warmup -> checkpoints and metrics.jsonl.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from seq2seq_cli import checkpoint as ckpt
from seq2seq_cli.config import Config, TrainConfig, save_config
from seq2seq_cli.data import EncodedCorpus, check_no_empty_lines, collate, describe_drops, encoded_split, epoch_batches, read_parallel, token_batches
from seq2seq_cli.errors import UserError
from seq2seq_cli.formats import split_source
from seq2seq_cli.metrics import MetricsLog, plot_curves, read_metrics
from seq2seq_cli.model import Seq2SeqTransformer, build_model
from seq2seq_cli.tokenizer import PAD, load_tokenizers, model_paths, train_tokenizer


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is available; use train.device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when precision is auto or bf16, fp16 autocast for fp16; plain fp32 otherwise."""
    if precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def inverse_sqrt_lr(step: int, lr: float, warmup: int, init_lr: float) -> float:
    """Linear warmup from init_lr to lr over `warmup` steps, then lr * sqrt(warmup / step)."""
    if warmup and step < warmup:
        return init_lr + (lr - init_lr) * step / warmup
    return lr * math.sqrt(max(warmup, 1) / max(step, 1))


def learning_rate(step: int, t: TrainConfig) -> float:
    """The learning rate of update `step` (1-based): linear warmup, then the configured schedule."""
    if t.schedule == "inverse_sqrt" or (t.warmup_steps and step < t.warmup_steps):
        return inverse_sqrt_lr(step, t.lr, t.warmup_steps, t.warmup_init_lr)
    if t.schedule == "constant":
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))  # type: ignore[operator]
    return t.min_lr + (t.lr - t.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor, int]:
    """logits: (B, T, V), target: (B, T) -> (smoothed loss sum, nll sum, non-pad tokens).

    loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p; pad targets are ignored.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != PAD
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -lprobs.mean(dim=-1)  # (B, T)
    loss = ((1.0 - epsilon) * nll + epsilon * smooth)[keep].sum()
    return loss, nll[keep].sum(), int(keep.sum())


def read_split(config: Config, prefix: str):
    d = config.data
    return read_parallel(prefix, d.src_lang, d.tgt_lang, config.run_path / "cache", format=d.format,
                         src_field=d.src_field, tgt_field=d.tgt_field, num_proc=d.num_proc)


def accumulate_gradients(
    model: Seq2SeqTransformer, micro: list[tuple[Tensor, Tensor, Tensor]], config: Config, device: torch.device,
    scaler: torch.amp.GradScaler,
) -> dict[str, float] | None:
    """Forward and backward over the batches of one update (gradient accumulation).

    The gradient is that of the label-smoothed loss summed over every target token of the
    batches, divided by their number, as if they were one batch. -> sums for logging, or
    None (nothing applied) when a loss is not finite.
    """
    total = sum(int((tgt_out != PAD).sum()) for _, _, tgt_out in micro)
    sums = {"loss": 0.0, "nll": 0.0, "tokens": total, "src_tokens": 0}
    for src, tgt_in, tgt_out in micro:
        with autocast(device, config.train.precision):
            logits = model(src, tgt_in)
        loss, nll, _ = label_smoothed_nll(logits, tgt_out, config.train.label_smoothing)
        value = loss.item()
        if not math.isfinite(value):
            return None
        scaler.scale(loss / total).backward()
        sums["loss"] += value
        sums["nll"] += nll.item()
        sums["src_tokens"] += int((src != PAD).sum())
    return sums


def validation_bleu(model: Seq2SeqTransformer, src_sp, tgt_sp, valid_raw, config: Config, device: torch.device) -> tuple[float, str]:
    """Greedy translation of the validation sources scored with sacreBLEU -> (BLEU, signature)."""
    from seq2seq_cli.evaluate import score
    from seq2seq_cli.translate import Translator

    decode = config.decode.model_copy(update={"beam_size": 1, "sampling": False})
    model.eval()
    hyps = Translator(model, src_sp, tgt_sp, decode, device).translate(list(valid_raw["src"]))
    model.train()
    scores = score(hyps, list(valid_raw["tgt"]))
    return scores.bleu, scores.bleu_signature


@torch.no_grad()
def validate(model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device) -> dict[str, float]:
    model.eval()
    loss_sum = nll_sum = 0.0
    tokens = 0
    for index in token_batches(corpus.src_lens, corpus.tgt_lens, config.train.max_tokens):
        src, tgt_in, tgt_out = (t.to(device) for t in collate(corpus, index))
        with autocast(device, config.train.precision):
            logits = model(src, tgt_in)
        loss, nll, n = label_smoothed_nll(logits, tgt_out, config.train.label_smoothing)
        loss_sum, nll_sum, tokens = loss_sum + loss.item(), nll_sum + nll.item(), tokens + n
    model.train()
    nll_tok = nll_sum / max(tokens, 1)
    return {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_tok, "valid_ppl": math.exp(min(nll_tok, 50))}


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so both save `last` before exiting."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": repr(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def train(config: Config, resume: bool = False, log: Callable[[str], None] | None = None, progress: bool = True) -> Path:
    """Train the model a config describes; return the run directory."""
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    t = config.train
    run_dir = config.run_path
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(t.device)
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(t.seed)
    random.seed(t.seed)

    # Data (checked line by line before anything is trained), tokenizer, encoding (cached as
    # Arrow in RUN/cache, memory-mapped)
    d = config.data
    for split in (d.train, d.valid):  # a missing file is reported before anything else happens
        if split:
            split_source(split, d.src_lang, d.tgt_lang, d.format)
    valid_raw = read_split(config, d.valid) if d.valid else None
    if d.on_empty == "error":
        check_no_empty_lines(read_split(config, d.train), d.train, d)
    if not all(p.is_file() for p in model_paths(run_dir, config.tokenizer.joint)):
        log(f"no tokenizer in {run_dir}; training SentencePiece first")
        train_tokenizer(config)
    src_sp, tgt_sp = load_tokenizers(run_dir, config.tokenizer.joint)
    train_data = encoded_split(config, d.train, src_sp, tgt_sp, training=True, log=log)
    log(f"train: {len(train_data)} pairs from {d.train}; {describe_drops(train_data, config)}")
    if not len(train_data):
        raise UserError(f"{d.train}: no training pairs left after filtering ({describe_drops(train_data, config)})")
    valid_data = encoded_split(config, d.valid, src_sp, tgt_sp, training=False, log=log) if d.valid else None
    data_record = {"step": 0, "train_pairs": len(train_data), **{f"train_dropped_{k}": v for k, v in train_data.dropped.items()}}
    if valid_data is not None:
        data_record.update({"valid_pairs": len(valid_data), "valid_dropped_empty": valid_data.dropped["empty"]})

    # Model and optimiser
    model = build_model(config.model, src_sp.get_piece_size(), tgt_sp.get_piece_size(), config.tokenizer.joint).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay, fused=device.type == "cuda"
    )
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")  # fp16 overflow handling
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters on {device}")

    step = epoch = batch_in_epoch = 0
    best, since_best, elapsed_before = float("-inf"), 0, 0.0  # best validation score (higher is better)
    window = new_window()
    counters = {"skipped_nonfinite": 0, "fp16_overflows": 0}
    ckpt_dir = run_dir / ckpt.CHECKPOINT_DIR
    if resume:
        name, damaged = ckpt.find_resumable(ckpt_dir)
        for problem in damaged:
            log(f"warning: not resuming from damaged checkpoint {problem}")
        weights = ckpt_dir / f"{name}.safetensors"
        ckpt.check_compatible(weights, config, src_sp.get_piece_size(), tgt_sp.get_piece_size())
        ckpt.load_weights(model, weights, device)
        state = ckpt.load_train_state(ckpt_dir / f"{name}.state.pt")
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        best, since_best, elapsed_before = state["best"], state["since_best"], state["elapsed"]
        window, counters = state["window"], state["counters"]
        log(f"resumed from {weights} at step {step} (epoch {epoch + 1}, batch {batch_in_epoch})")
    save_config(config, run_dir / "config.yaml")
    metrics = MetricsLog(run_dir, step if resume else None, t.tensorboard)
    if not resume:
        metrics.write(data_record)

    def save(improved: bool) -> None:
        state = {
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng_state(),
            "best": best,
            "since_best": since_best,
            "elapsed": elapsed_before + time.time() - start,
            "window": window,
            "counters": counters,
        }
        ckpt.save_checkpoint(ckpt_dir, step, model, config, {"step": step, "epoch": epoch}, state,
                             best=improved, keep_last=t.keep_last)

    def run_validation() -> None:
        nonlocal best, since_best
        record: dict[str, Any] = {"step": step, "epoch": epoch + 1, "elapsed_s": elapsed_before + time.time() - start}
        improved = False
        if valid_data is not None:
            record.update(validate(model, valid_data, config, device))
            text = f"step {step}: valid loss {record['valid_loss']:.3f}, nll {record['valid_nll']:.3f}, ppl {record['valid_ppl']:.2f}"
            if t.valid_bleu:
                record["valid_bleu"], record["valid_bleu_signature"] = validation_bleu(model, src_sp, tgt_sp, valid_raw, config, device)
                text += f", BLEU {record['valid_bleu']:.2f} ({record['valid_bleu_signature']})"
            score = record["valid_bleu"] if t.best_metric == "bleu" else -record["valid_nll"]
            improved, since_best = score > best, 0 if score > best else since_best + 1
            best = max(best, score)
            log(text)
        metrics.write(record)
        save(improved)
        if t.plot:
            plot_curves(read_metrics(metrics.path), run_dir / "plots" / "curves.png")
        if t.patience and since_best >= t.patience:
            log(f"early stopping: no better validation {t.best_metric} in {since_best} validations")

    def out_of_budget() -> bool:
        return (
            (t.patience is not None and since_best >= t.patience)
            or (t.max_steps is not None and step >= t.max_steps)
            or (t.max_epochs is not None and epoch >= t.max_epochs)
            or (t.max_minutes is not None and (elapsed_before + time.time() - start) / 60 >= t.max_minutes)
        )

    start = time.time()
    window_start = time.time()
    model.train()
    bar = tqdm(total=t.max_steps, initial=step, disable=not progress, unit="step", dynamic_ncols=True, file=sys.stderr)
    validated_at = step
    params = list(model.parameters())
    consecutive_bad = 0
    try:
        with sigterm_as_interrupt():
            while not out_of_budget():
                batches = epoch_batches(train_data, t.max_tokens, t.seed, epoch)
                while batch_in_epoch < len(batches) and not out_of_budget():
                    micro = [
                        tuple(x.to(device, non_blocking=True) for x in collate(train_data, b, (t.seed, epoch, batch_in_epoch + k)))
                        for k, b in enumerate(batches[batch_in_epoch : batch_in_epoch + t.update_freq])
                    ]
                    batch_in_epoch += len(micro)
                    lr = learning_rate(step + 1, t)
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                    optimizer.zero_grad(set_to_none=True)
                    sums = accumulate_gradients(model, micro, config, device, scaler)
                    if sums is not None:
                        scaler.unscale_(optimizer)
                        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.clip_norm or float("inf"))
                        if scaler.is_enabled() and not torch.isfinite(grad_norm):
                            scaler.step(optimizer)  # skipped by the scaler, which lowers its scale
                            scaler.update()
                            counters["fp16_overflows"] += 1
                            continue
                    if sums is None or not torch.isfinite(grad_norm):
                        counters["skipped_nonfinite"] += 1
                        consecutive_bad += 1
                        log(f"warning: non-finite loss or gradients at step {step + 1}; batch skipped "
                            f"({counters['skipped_nonfinite']} so far)")
                        if consecutive_bad >= t.max_nonfinite:
                            raise UserError(
                                f"non-finite loss or gradients in {consecutive_bad} consecutive batches at step {step + 1}; "
                                f"stopped without saving, so {ckpt_dir / 'last.safetensors'} is the last good state; "
                                "lower train.lr, raise train.warmup_steps or set train.clip_norm"
                            )
                        continue
                    consecutive_bad = 0
                    scaler.step(optimizer)
                    scaler.update()
                    step += 1
                    for key in window:
                        window[key] += sums[key]
                    bar.update(1)
                    if step % t.log_every == 0:
                        now = time.time()
                        tps = (window["tokens"] + window["src_tokens"]) / max(now - window_start, 1e-9)
                        record = {
                            "step": step,
                            "epoch": epoch + 1,
                            "train_loss": window["loss"] / window["tokens"],
                            "train_nll": window["nll"] / window["tokens"],
                            "lr": lr,
                            "tokens_per_s": tps,
                            "elapsed_s": elapsed_before + now - start,
                            **counters,
                        }
                        metrics.write(record)
                        bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
                        window, window_start = new_window(), now
                    if step % t.valid_every == 0:
                        run_validation()
                        validated_at = step
                if batch_in_epoch >= len(batches):
                    epoch, batch_in_epoch = epoch + 1, 0
            if validated_at != step or not (ckpt_dir / "last.safetensors").is_file():
                run_validation()
    except KeyboardInterrupt:
        bar.close()
        save(improved=False)
        log(f"interrupted at step {step}; saved {ckpt_dir / 'last.safetensors'}. "
            f"Resume with: seq2seq train --config {run_dir / 'config.yaml'} --resume")
        raise
    finally:
        bar.close()
        metrics.close()
    log(f"finished at step {step} (epoch {epoch + 1}) in {(elapsed_before + time.time() - start) / 60:.1f} min; run in {run_dir}")
    return run_dir


def new_window() -> dict[str, float]:
    """Sums over the current logging interval (saved with checkpoints so resumed logs match)."""
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0}
