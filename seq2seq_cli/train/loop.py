"""`train(config) -> run_dir`: one loop, top to bottom.

text files -> tokenizer -> encoded pairs -> token-budget batches -> model -> label-smoothed
cross-entropy -> Adam with inverse-sqrt warmup -> checkpoints and metrics.jsonl.

`setup_run` (in `setup.py`) builds what a run needs (data, tokenizer, model, optimizer, the
`TrainState`, fresh or resumed); `train` then loops (`run_updates`) over `one_update`,
`log_progress`, `validate_and_save` and `should_stop` until the run's budget is spent, and
`finish` logs the updates since the last record and validates the last step. Beside the loop:
the learning rate of each update (`schedule.py`), validation (`validation.py`), Ctrl-C and
SIGTERM taken between updates (`signals.py`), updates skipped for a non-finite loss or gradient
(`nonfinite.py`). `TrainState` (in `state.py`) is the record of where training stands: its
`state_dict()` is what a checkpoint's training state holds, beside the optimizer's and the
scaler's.

Under `torchrun` the same loop runs in every process (see `distributed.py`): the batches of
each update are dealt out to the processes, gradients are summed across them (DDP), and
rank 0 alone writes the run directory.
"""

from __future__ import annotations

import contextlib
import enum
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from seq2seq_cli.config import Config
from seq2seq_cli.data.batching import Batch, BatchPlan, collate, epoch_batches
from seq2seq_cli.data.corpora import drawn_per_corpus
from seq2seq_cli.device import limit_kernel_caches
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train import distributed
from seq2seq_cli.train.distributed import Processes
from seq2seq_cli.train.ema import update_average
from seq2seq_cli.train.loss import batch_loss
from seq2seq_cli.train.memory import give_back_freed
from seq2seq_cli.train.metrics import plot_curves, read_metrics
from seq2seq_cli.train.nonfinite import report_nonfinite, settle
from seq2seq_cli.train.schedule import update_lr
from seq2seq_cli.train.setup import Run, setup_run
from seq2seq_cli.train.signals import StopRequest, stop_on_signals
from seq2seq_cli.train.state import TrainState, new_window, rng_state
from seq2seq_cli.train.validation import validation_record


def my_batches(update: list[np.ndarray], procs: Processes) -> tuple[list[np.ndarray], bool]:
    """This process's share of one update's batches: batches rank, rank + world, ...
    -> (batches, real). A process left without any (the short last update of an epoch) gets
    the update's first batch with `real` False: it runs it with weight 0, so that every
    process takes part in the gradient sum."""
    mine = update[procs.rank :: procs.world]
    return (mine, True) if mine else (update[:1], False)


def wrapped_ddp(model: nn.Module) -> DDP | None:
    """The DDP wrapper of the module that trains, under torch.compile's wrapper (which keeps
    it as `_orig_mod`) or not; None without DDP."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DDP) else None


@dataclass
class UpdateSums:
    """One update's sums over all processes: `losses` (2,) the smoothed loss and the nll, on
    the device (not read by the host); the token counts, known on the host from the lengths."""

    losses: Tensor
    tokens: int
    src_tokens: int


def accumulate_gradients(
    model: nn.Module, micro: list[Batch], weight: float, config: Config,
    device: torch.device, scaler: torch.amp.GradScaler, procs: Processes,
) -> UpdateSums:
    """Forward and backward over this process's batches of one update (gradient accumulation).

    The gradient is that of the label-smoothed loss summed over every target token of the
    update's batches on all processes, divided by their number, as if they were one batch:
    the token count is summed across processes, and DDP's averaging over the `world`
    processes is undone by scaling each loss by `world`. `weight` is 1, or 0 for a stand-in
    batch. Nothing is read from the device (but the token counts across processes, under
    DDP): whether the losses are finite is the caller's to decide on the device.
    """
    tokens = float(sum(b.tgt_tokens for b in micro)) * weight
    src_tokens = float(sum(b.src_tokens for b in micro)) * weight
    if procs.world > 1:
        counts = torch.tensor([tokens, src_tokens], dtype=torch.float64, device=device)
        total, all_src = distributed.sum_across(procs, counts).tolist()  # (NCCL sums device tensors only)
    else:
        total, all_src = tokens, src_tokens
    loss_sum = torch.zeros((), device=device)
    nll_sum = torch.zeros((), device=device)
    divisor = max(total, 1.0) / procs.world
    ddp = wrapped_ddp(model)
    for i, batch in enumerate(micro):
        b = batch.to(device, non_blocking=True)
        # DDP sums gradients across processes in the last backward only
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last or ddp is None else ddp.no_sync():
            loss, nll, _ = batch_loss(model, b, config, device)
            scaler.scale(loss / divisor * weight).backward()
        loss_sum += loss.detach() * weight
        nll_sum += nll.detach() * weight
    losses = distributed.sum_across(procs, torch.stack([loss_sum, nll_sum]).float())
    return UpdateSums(losses, int(total), int(all_src))


class Outcome(enum.Enum):
    """What became of one update."""

    APPLIED = "applied"
    FP16_OVERFLOW = "fp16_overflow"  # the scaler skipped it and lowered its scale
    NONFINITE = "nonfinite"  # skipped: a loss or the gradient norm was not finite


# --------------------------------------------------------------------------- the steps of the loop


def one_update(run: Run, state: TrainState, batches: BatchPlan) -> Outcome:
    """Take the next update's batches of this epoch's order, accumulate their gradients and
    step the optimizer unless a loss or the gradient is not finite.

    Without a loss scaler nothing is read from the device: whether the update is finite is
    decided there, the fused optimizer skips a non-finite one there (its `found_inf`), and
    `run.tally` keeps the sums and the skips for the host to read every log_every updates
    (`settle`, in `nonfinite.py`). `state.step` counts the updates taken, a skipped one
    included. With fp16's loss scaler the host reads the scaler's verdict at once (one sync an
    update)."""
    t, procs, optimizer, scaler = run.config.train, run.procs, run.optimizer, run.scaler
    first = state.batch_in_epoch
    update = batches[first : first + t.update_freq * procs.world]
    state.batch_in_epoch += len(update)
    mine, real = my_batches(update, procs)
    # subword sampling is keyed by each batch's index in the epoch (rank + j * world)
    first += procs.rank if real else 0
    micro = [collate(run.data.train, b, (t.seed, state.epoch, first + j * procs.world)) for j, b in enumerate(mine)]
    state.lr = update_lr(t, state, batches)
    for group in optimizer.param_groups:
        group["lr"] = state.lr
    optimizer.zero_grad(set_to_none=True)
    sums = accumulate_gradients(run.net, micro, 1.0 if real else 0.0, run.config, run.device, scaler, procs)
    if scaler.is_enabled():
        return scaled_step(run, state, sums)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.clip_norm or float("inf"))
    bad = ~(torch.isfinite(grad_norm) & torch.isfinite(sums.losses).all())  # () on the device
    optimizer.found_inf = bad.float()  # type: ignore[attr-defined]  # the fused step skips the update there
    optimizer.step()
    optimizer.found_inf = None  # type: ignore[attr-defined]
    state.step += 1
    if run.average is not None and run.config.train.ema_decay is not None:
        update_average(run.average, run.model, state.step, run.config.train.ema_decay)
    assert run.tally is not None
    run.tally.add(sums.losses, sums.tokens, sums.src_tokens, bad)
    return Outcome.APPLIED


def scaled_step(run: Run, state: TrainState, sums: UpdateSums) -> Outcome:
    """The optimizer step under fp16's loss scaler, which reads whether the gradients overflowed."""
    optimizer, scaler = run.optimizer, run.scaler
    losses = sums.losses.tolist()
    if not all(math.isfinite(v) for v in losses):
        state.counters["skipped_nonfinite"] += 1
        state.consecutive_bad += 1
        return Outcome.NONFINITE
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.config.train.clip_norm or float("inf"))
    if not torch.isfinite(grad_norm):
        scaler.step(optimizer)  # skipped by the scaler, which lowers its scale
        scaler.update()
        state.counters["fp16_overflows"] += 1
        return Outcome.FP16_OVERFLOW
    state.consecutive_bad = 0
    scaler.step(optimizer)
    scaler.update()
    state.step += 1
    if run.average is not None and run.config.train.ema_decay is not None:
        update_average(run.average, run.model, state.step, run.config.train.ema_decay)
    for key, value in zip(("loss", "nll", "tokens", "src_tokens"), (*losses, sums.tokens, sums.src_tokens)):
        state.window[key] += value
    return Outcome.APPLIED


def log_progress(run: Run, state: TrainState, bar: tqdm, plain: bool = False, final: bool = False) -> None:
    """Write the training record of the logging window that ends at this step; start the next.
    `plain`: also log it as one line (stderr is not a terminal, so there is no bar to show it).
    `final`: the record of the updates since the last log_every step where the run ends (see
    `finish`), marked so."""
    settle(run, state)
    now = time.time()
    window, lr = state.window, state.lr
    tps = (window["tokens"] + window["src_tokens"]) / max(now - state.window_start, 1e-9)
    record = {
        "step": state.step,
        "epoch": state.epoch + 1,
        "train_loss": window["loss"] / max(window["tokens"], 1),
        "train_nll": window["nll"] / max(window["tokens"], 1),
        "lr": lr,
        "tokens_per_s": tps,
        "elapsed_s": state.elapsed + now - state.started,
        **state.counters,
        **({"final": True} if final else {}),
    }
    if run.metrics is not None:
        run.metrics.write(record)
    bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
    if plain:
        total = f"/{run.config.train.max_steps}" if run.config.train.max_steps else ""
        run.log(f"step {state.step}{total}: loss {record['train_loss']:.3f}, lr {lr:.2e}, {tps:,.0f} tok/s, "
                f"{record['elapsed_s'] / 60:.1f} min")
    state.window, state.window_start = new_window(), now


def save(run: Run, state: TrainState, improved: bool) -> None:
    """Write a checkpoint (rank 0). Each process's RNG state is gathered, so that a resume with
    as many processes is exact."""
    settle(run, state)
    state.rngs = distributed.gather_to_all(run.procs, rng_state())
    if not run.procs.main:
        return
    saved = {**state.state_dict(), "optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict()}
    if run.average is not None:  # the weights file holds the average; the trained weights resume training
        saved["trained_weights"] = run.model.state_dict()
    ckpt.save_checkpoint(run.ckpt_dir, state.step, run.scored, run.config, {"step": state.step, "epoch": state.epoch},
                         saved, best=improved, keep_last=run.config.train.keep_last)


def validate_and_save(run: Run, state: TrainState) -> None:
    """Validation loss (and BLEU), the metrics record, the patience counter, a checkpoint
    (`best` too when the score improved) and the curves."""
    t = run.config.train
    record, improved = validation_record(run, state)
    if run.metrics is not None:
        run.metrics.write(record)
    save(run, state, improved)
    state.validated_at = state.step
    if t.plot and run.metrics is not None:
        plot_curves(read_metrics(run.metrics.path), run.layout.curves)
    give_back_freed()
    if t.patience and state.since_best >= t.patience:
        run.log(f"early stopping: no better validation {t.best_metric} in {state.since_best} validations")


def should_stop(run: Run, state: TrainState) -> bool:
    """Patience, steps, epochs or minutes spent. Only the clock can differ between processes:
    rank 0's reading decides for all (a collective, so this is asked once per update)."""
    t = run.config.train
    minutes = distributed.from_main(run.procs, state.seconds() / 60) if t.max_minutes else 0.0
    state.minutes = minutes
    return (
        (t.patience is not None and state.since_best >= t.patience)
        or (t.max_steps is not None and state.step >= t.max_steps)
        or (t.max_epochs is not None and state.epoch >= t.max_epochs)
        or (t.max_minutes is not None and minutes >= t.max_minutes)
    )


def next_epoch(run: Run, state: TrainState) -> BatchPlan:
    """Move on to the next epoch -> its batches (a pure function of the seed and the epoch)."""
    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    return epoch_batches(run.data.train, run.config.train.max_tokens, run.config.train.seed, state.epoch,
                         run.config.data.pair_batches == "one")


def report_epoch(run: Run, state: TrainState, batches: BatchPlan) -> None:
    """Of several corpora: the pairs of each in the epoch whose first update starts, in the log
    and as a metrics record (`train_drawn`) at that update's step, so that a run resumed before
    it writes it once."""
    parts = run.data.train.parts
    if parts is None:
        return
    drawn = drawn_per_corpus(parts, batches.rows())
    run.log(f"epoch {state.epoch + 1}: " + ", ".join(f"{n} pairs of {p.path}" for n, p in zip(drawn, parts)))
    if run.metrics is not None:
        run.metrics.write({"step": state.step + 1, "epoch": state.epoch + 1, "train_drawn": drawn})


# --------------------------------------------------------------------------- the loop


def train(config: Config, resume: bool = False, log: Callable[[str], None] | None = None, progress: bool = True,
          overwrite: bool = False, init_from: str | Path | None = None, warm_start: Path | None = None,
          resume_with: str | None = None) -> Path:
    """Train the model a config describes; return the run directory. `init_from` (a run
    directory or checkpoint) starts from its weights instead of random ones: fine-tuning;
    `warm_start` gives a fresh run the tensors of a checkpoint that fit (a student, its teacher's);
    `resume_with` is the command a stop advises (else `train --resume`: `distill` gives its own).
    Under torchrun every process calls this; see the module docstring."""
    limit_kernel_caches()
    procs, device = distributed.start(config.train.device)
    finished = False
    try:
        run, state = setup_run(config, resume, procs, device, log, overwrite, init_from, warm_start)
        config = run.config  # with --init-from, the architecture and tokenizer of the init run
        t = config.train
        state.started = state.window_start = time.time()
        run.model.train()
        # on a terminal a bar; written to a file (CI, nohup), a plain line every log_every updates instead
        plain = progress and procs.main and not sys.stderr.isatty()
        bar = tqdm(total=t.max_steps, initial=state.step, disable=not progress or not procs.main or plain, unit="step",
                   dynamic_ncols=True, file=sys.stderr)
        try:
            with stop_on_signals() as stop:
                run_updates(run, state, bar, plain, stop, resume_with)
                finish(run, state, bar, plain)
        finally:
            bar.close()
            if run.metrics is not None:
                run.metrics.close()
            run.release()  # the lock, even while a traceback still holds the run
        minutes = state.seconds() / 60
        run.log(f"finished at step {state.step} (epoch {state.epoch + 1}) in {minutes:.1f} min; run in {config.run_path}")
        finished = True
        return config.run_path
    finally:
        distributed.stop(procs, wait=finished)


def run_updates(run: Run, state: TrainState, bar: tqdm, plain: bool, stop: StopRequest,
                resume_with: str | None = None) -> None:
    """Update after update, epoch after epoch, logging every log_every updates and validating
    every valid_every, until `should_stop`; a signal saves `last` and raises KeyboardInterrupt."""
    t, procs = run.config.train, run.procs
    batches = epoch_batches(run.data.train, t.max_tokens, t.seed, state.epoch, run.config.data.pair_batches == "one")
    while not should_stop(run, state):
        if state.batch_in_epoch < len(batches):  # (not so only when resumed at an epoch's end)
            if state.batch_in_epoch == 0:
                report_epoch(run, state, batches)
            outcome = one_update(run, state, batches)
            if outcome is Outcome.NONFINITE:
                report_nonfinite(run, state)
            elif outcome is Outcome.APPLIED:
                bar.update(1)
                if state.step % t.log_every == 0:
                    log_progress(run, state, bar, plain)
                if state.step % t.valid_every == 0:
                    validate_and_save(run, state)
        if state.batch_in_epoch >= len(batches):
            batches = next_epoch(run, state)
        if distributed.from_main(procs, stop.requested):  # rank 0's signal stops every process
            bar.close()
            save(run, state, improved=False)
            again = resume_with or f"seq2seq train --config {run.layout.config} --resume"
            run.log(f"interrupted at step {state.step}; saved {run.layout.last}. Resume with: {again}")
            raise KeyboardInterrupt


def finish(run: Run, state: TrainState, bar: tqdm, plain: bool) -> None:
    """The end of a run: a last validation and checkpoint unless this step has them, then the
    record of the updates since the last one logged, so that the last update is always logged.
    That record is marked `final`, and the checkpoint keeps its sums: a run resumed from it
    replaces the record by the one its next log_every step writes (see `MetricsLog`). A
    resumed run that had nothing left to train keeps the record it finds."""
    if state.validated_at != state.step or not distributed.from_main(run.procs, run.layout.last.is_file()):
        validate_and_save(run, state)
    settle(run, state)
    if state.window["tokens"] and not (run.metrics is not None and run.metrics.final_at == state.step):
        log_progress(run, state, bar, plain, final=True)
