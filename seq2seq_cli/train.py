"""`train(config) -> run_dir`: one loop, top to bottom.

text files -> tokenizer -> encoded pairs -> token-budget batches -> model -> label-smoothed
cross-entropy -> Adam with inverse-sqrt warmup -> checkpoints and metrics.jsonl.

Under `torchrun` the same loop runs in every process (see `distributed.py`): the batches of
each update are dealt out to the processes, gradients are summed across them (DDP), and
rank 0 alone writes the run directory.
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
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from seq2seq_cli import checkpoint as ckpt
from seq2seq_cli import distributed
from seq2seq_cli.distributed import Processes
from seq2seq_cli.config import Config, TrainConfig, save_config
from seq2seq_cli.data import EncodedCorpus, check_no_empty_lines, collate, describe_drops, encoded_split, epoch_batches, token_batches
from seq2seq_cli.errors import UserError
from seq2seq_cli.formats import read_split, split_source
from seq2seq_cli.metrics import MetricsLog, plot_curves, read_metrics
from seq2seq_cli.model import Seq2SeqTransformer, build_model
from seq2seq_cli.ids import PAD
from seq2seq_cli.tokenizer import load_tokenizers, model_paths, train_tokenizer


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


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """logits: (B, T, V), target: (B, T) -> (smoothed loss sum, nll sum, non-pad tokens), all
    0-dim tensors on the logits' device (reading them is left to the caller: no host sync here).

    loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p; pad targets are ignored.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != PAD  # (B, T)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -lprobs.mean(dim=-1)  # (B, T)
    loss = torch.where(keep, (1.0 - epsilon) * nll + epsilon * smooth, 0.0).sum()
    return loss, torch.where(keep, nll, 0.0).sum(), keep.sum()


def make_optimizer(model: nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay; the fused kernel (one pass over all parameters) where
    this build of torch has one for the device."""
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay, fused=fused)


def my_batches(update: list[np.ndarray], procs: Processes) -> tuple[list[np.ndarray], bool]:
    """This process's share of one update's batches: batches rank, rank + world, ...
    -> (batches, real). A process left without any (the short last update of an epoch) gets
    the update's first batch with `real` False: it runs it with weight 0, so that every
    process takes part in the gradient sum."""
    mine = update[procs.rank :: procs.world]
    return (mine, True) if mine else (update[:1], False)


def accumulate_gradients(
    model: nn.Module, micro: list[tuple[Tensor, Tensor, Tensor]], weight: float, config: Config,
    device: torch.device, scaler: torch.amp.GradScaler, procs: Processes,
) -> dict[str, float] | None:
    """Forward and backward over this process's batches of one update (gradient accumulation).

    The gradient is that of the label-smoothed loss summed over every target token of the
    update's batches on all processes, divided by their number, as if they were one batch:
    the token count is summed across processes, and DDP's averaging over the `world`
    processes is undone by scaling each loss by `world`. `weight` is 1, or 0 for a stand-in
    batch. The host reads the device once, after the last backward. -> sums over all
    processes for logging, or None (the update must be skipped) when a loss is not finite.
    """
    tokens = sum(float((tgt_out != PAD).sum()) for _, _, tgt_out in micro) * weight
    src_tokens = sum(float((src != PAD).sum()) for src, _, _ in micro) * weight
    counts = torch.tensor([tokens, src_tokens], dtype=torch.float64, device=device if procs.world > 1 else "cpu")
    total, all_src = distributed.sum_across(procs, counts).tolist()  # (NCCL sums device tensors only)
    loss_sum = torch.zeros((), device=device)
    nll_sum = torch.zeros((), device=device)
    divisor = max(total, 1.0) / procs.world
    for i, (src, tgt_in, tgt_out) in enumerate(micro):
        src, tgt_in, tgt_out = (x.to(device, non_blocking=True) for x in (src, tgt_in, tgt_out))
        # DDP sums gradients across processes in the last backward only
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync():
            with autocast(device, config.train.precision):
                logits = model(src, tgt_in)
            loss, nll, _ = label_smoothed_nll(logits, tgt_out, config.train.label_smoothing)
            scaler.scale(loss / divisor * weight).backward()
        loss_sum += loss.detach() * weight
        nll_sum += nll.detach() * weight
    stats = distributed.sum_across(procs, torch.stack([loss_sum, nll_sum]).float()).tolist()
    if not all(math.isfinite(v) for v in stats):
        return None
    return {"loss": stats[0], "nll": stats[1], "tokens": int(total), "src_tokens": int(all_src)}


def validation_bleu(model: Seq2SeqTransformer, src_sp, tgt_sp, valid_raw, config: Config, device: torch.device) -> tuple[float, str]:
    """Greedy translation of the validation sources scored with sacreBLEU -> (BLEU, signature)."""
    from seq2seq_cli.evaluate import score
    from seq2seq_cli.onednn import for_decoding
    from seq2seq_cli.translate import Translator

    decode = config.decode.model_copy(update={"beam_size": 1, "sampling": False})
    model.eval()
    # weights are fixed during validation: pack them for decoding once, not once per batch
    hyps = Translator(for_decoding(model), src_sp, tgt_sp, decode, device).translate(list(valid_raw["src"]))
    model.train()
    scores = score(hyps, list(valid_raw["tgt"]))
    return scores.bleu, scores.bleu_signature


@torch.no_grad()
def validate(
    model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device, procs: Processes = Processes()
) -> dict[str, float]:
    """Validation loss, nll and perplexity; each process scores every world-th batch and the
    sums are added up across processes."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, tokens
    batches = token_batches(corpus.src_lens, corpus.tgt_lens, config.train.max_tokens)
    for index in batches[procs.rank :: procs.world]:
        src, tgt_in, tgt_out = (t.to(device) for t in collate(corpus, index))
        with autocast(device, config.train.precision):
            logits = model(src, tgt_in)
        sums += torch.stack(label_smoothed_nll(logits, tgt_out, config.train.label_smoothing)).double()
    loss_sum, nll_sum, tokens = distributed.sum_across(procs, sums).tolist()
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
    """Train the model a config describes; return the run directory.

    Under torchrun every process calls this; see the module docstring."""
    procs, device = distributed.start(config.train.device)
    finished = False
    try:
        run_dir = _train(config, resume, log, progress, procs, device)
        finished = True
        return run_dir
    finally:
        distributed.stop(procs, wait=finished)


def _train(
    config: Config, resume: bool, log: Callable[[str], None] | None, progress: bool, procs: Processes, device: torch.device
) -> Path:
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    if not procs.main:
        log, progress = (lambda msg: None), False
    t = config.train
    run_dir = config.run_path
    run_dir.mkdir(parents=True, exist_ok=True)
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(t.seed)
    random.seed(t.seed)

    # Data (checked line by line before anything is trained), tokenizer, encoding (cached as
    # Arrow in RUN/cache, memory-mapped). Rank 0 checks the data, trains the tokenizer and fills
    # the cache; the other processes wait, then read what it wrote.
    d = config.data
    for split in (d.train, d.valid):  # a missing file is reported before anything else happens
        if split:
            split_source(split, d.src_lang, d.tgt_lang, d.format)
    if not procs.main:
        distributed.barrier(procs)
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
    if procs.main:
        distributed.barrier(procs)

    # Model and optimiser
    model = build_model(config.model, src_sp.get_piece_size(), tgt_sp.get_piece_size(), config.tokenizer.joint).to(device)
    optimizer = make_optimizer(model, t, device)
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")  # fp16 overflow handling
    n_params = sum(p.numel() for p in model.parameters())
    where = f"{procs.world} processes ({device.type})" if procs.world > 1 else str(device)
    log(f"model: {n_params:,} parameters on {where}")
    if procs.world > 1:
        torch.manual_seed(t.seed + procs.rank)  # the same initial weights, but each process its own dropout

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
        per_rank = state.get("rng_ranks", [state["rng"]])
        set_rng_state(per_rank[procs.rank] if len(per_rank) == procs.world else state["rng"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        best, since_best, elapsed_before = state["best"], state["since_best"], state["elapsed"]
        window, counters = state["window"], state["counters"]
        log(f"resumed from {weights} at step {step} (epoch {epoch + 1}, batch {batch_in_epoch})")
    # `model` is what is saved and validated (parameter names unprefixed); `net` is what trains:
    # the same parameters, compiled and/or wrapped for gradient summing across processes.
    net: nn.Module = model
    if procs.world > 1:
        # the only buffers are constant position tables: nothing to re-broadcast every forward
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    if t.compile:
        net = torch.compile(net)
    if procs.main:
        save_config(config, run_dir / "config.yaml")
    metrics = MetricsLog(run_dir, step if resume else None, t.tensorboard) if procs.main else None
    if metrics is not None and not resume:
        metrics.write(data_record)

    def save(improved: bool, together: bool = True) -> None:
        # Each process's RNG state, so that a resume with as many processes is exact. When
        # interrupted, the processes may be anywhere: rank 0 saves its own state alone.
        rngs = distributed.gather_to_all(procs, rng_state()) if together else [rng_state()]
        if not procs.main:
            return
        state = {
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rngs[0],
            **({"rng_ranks": rngs} if procs.world > 1 else {}),
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
            record.update(validate(model, valid_data, config, device, procs))
            text = f"step {step}: valid loss {record['valid_loss']:.3f}, nll {record['valid_nll']:.3f}, ppl {record['valid_ppl']:.2f}"
            if t.valid_bleu:
                bleu = validation_bleu(model, src_sp, tgt_sp, valid_raw, config, device) if procs.main else None
                record["valid_bleu"], record["valid_bleu_signature"] = distributed.from_main(procs, bleu)
                text += f", BLEU {record['valid_bleu']:.2f} ({record['valid_bleu_signature']})"
            score = record["valid_bleu"] if t.best_metric == "bleu" else -record["valid_nll"]
            improved, since_best = score > best, 0 if score > best else since_best + 1
            best = max(best, score)
            log(text)
        if metrics is not None:
            metrics.write(record)
        save(improved)
        if t.plot and procs.main:
            plot_curves(read_metrics(metrics.path), run_dir / "plots" / "curves.png")
        if t.patience and since_best >= t.patience:
            log(f"early stopping: no better validation {t.best_metric} in {since_best} validations")

    def out_of_budget() -> bool:
        # Only the clock can differ between processes: rank 0's reading decides for all.
        minutes = distributed.from_main(procs, (elapsed_before + time.time() - start) / 60) if t.max_minutes else 0.0
        return (
            (t.patience is not None and since_best >= t.patience)
            or (t.max_steps is not None and step >= t.max_steps)
            or (t.max_epochs is not None and epoch >= t.max_epochs)
            or (t.max_minutes is not None and minutes >= t.max_minutes)
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
                    first = batch_in_epoch
                    update = batches[first : first + t.update_freq * procs.world]
                    batch_in_epoch += len(update)
                    mine, real = my_batches(update, procs)
                    # subword sampling is keyed by each batch's index in the epoch (rank + j * world)
                    first += procs.rank if real else 0
                    micro = [collate(train_data, b, (t.seed, epoch, first + j * procs.world)) for j, b in enumerate(mine)]
                    lr = learning_rate(step + 1, t)
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                    optimizer.zero_grad(set_to_none=True)
                    sums = accumulate_gradients(net, micro, 1.0 if real else 0.0, config, device, scaler, procs)
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
                        if metrics is not None:
                            metrics.write(record)
                        bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
                        window, window_start = new_window(), now
                    if step % t.valid_every == 0:
                        run_validation()
                        validated_at = step
                if batch_in_epoch >= len(batches):
                    epoch, batch_in_epoch = epoch + 1, 0
            if validated_at != step or not distributed.from_main(procs, (ckpt_dir / "last.safetensors").is_file()):
                run_validation()
    except KeyboardInterrupt:
        bar.close()
        save(improved=False, together=False)
        log(f"interrupted at step {step}; saved {ckpt_dir / 'last.safetensors'}. "
            f"Resume with: seq2seq train --config {run_dir / 'config.yaml'} --resume")
        raise
    finally:
        bar.close()
        if metrics is not None:
            metrics.close()
    log(f"finished at step {step} (epoch {epoch + 1}) in {(elapsed_before + time.time() - start) / 60:.1f} min; run in {run_dir}")
    return run_dir


def new_window() -> dict[str, float]:
    """Sums over the current logging interval (saved with checkpoints so resumed logs match)."""
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0}
