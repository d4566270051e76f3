"""The learning-rate schedule: linear warmup, then inverse square root, cosine, linear or
constant; the decaying schedules end at train.min_lr where the run's budget runs out."""

from __future__ import annotations

import math

from seq2seq_cli.config import TrainConfig
from seq2seq_cli.data.batching import BatchPlan
from seq2seq_cli.train.state import TrainState


def inverse_sqrt_lr(step: int, lr: float, warmup: int, init_lr: float) -> float:
    """Linear warmup from init_lr to lr over `warmup` steps, then lr * sqrt(warmup / step)."""
    if warmup and step < warmup:
        return init_lr + (lr - init_lr) * step / warmup
    return lr * math.sqrt(max(warmup, 1) / max(step, 1))


def learning_rate(step: int, t: TrainConfig, used: float = 0.0, decay_from: float | None = None) -> float:
    """The learning rate of update `step` (1-based): linear warmup, then the configured schedule.
    `cosine` and `linear` decay to min_lr where the run ends: `used` is the share of its budget
    spent (`budget_used`), `decay_from` the share spent when warmup ended."""
    if t.schedule == "inverse_sqrt" or (t.warmup_steps and step < t.warmup_steps):
        return inverse_sqrt_lr(step, t.lr, t.warmup_steps, t.warmup_init_lr)
    if t.schedule == "constant":
        return t.lr
    start = 0.0 if decay_from is None else decay_from
    progress = min(1.0, max(0.0, (used - start) / (1.0 - start))) if start < 1.0 else 1.0
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if t.schedule == "cosine" else 1.0 - progress
    return t.min_lr + (t.lr - t.min_lr) * shape


def budget_used(t: TrainConfig, step: int, epochs: float, minutes: float) -> float:
    """The share of the run's budget spent after `step` updates, `epochs` epochs (fractional)
    and `minutes` of training: of max_steps, max_epochs and max_minutes, whichever runs out
    first (the budget that stops the run)."""
    shares = [0.0]
    if t.max_steps is not None:
        shares.append(step / t.max_steps)
    if t.max_epochs is not None:
        shares.append(epochs / t.max_epochs)
    if t.max_minutes is not None:
        shares.append(minutes / t.max_minutes)
    return min(1.0, max(shares))


def update_lr(t: TrainConfig, state: TrainState, batches: BatchPlan) -> float:
    """The learning rate of the next update, `state.step + 1`; records in `state` the share of
    the budget spent when warmup ends, where the decay of `cosine` and `linear` starts. The
    clock is rank 0's reading from `should_stop`, so every process takes the same rate."""
    step = state.step + 1
    if t.schedule in ("inverse_sqrt", "constant"):
        return learning_rate(step, t)
    used = budget_used(t, step, state.epoch + state.batch_in_epoch / max(len(batches), 1), state.minutes)
    if state.decay_from is None and step >= t.warmup_steps:
        if t.warmup_steps == 0:
            state.decay_from = 0.0
        elif step == t.warmup_steps:
            state.decay_from = used
        else:  # resumed from a checkpoint that did not record it: where a steps budget puts it
            state.decay_from = t.warmup_steps / t.max_steps if t.max_steps else 0.0
    return learning_rate(step, t, used, state.decay_from)
