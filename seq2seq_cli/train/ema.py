"""Exponential moving average of the weights (Marian's exponential smoothing, Polyak averaging),
on torch's `AveragedModel`.

After update t (1-based) the average moves towards the trained weights:

    average <- decay_t * average + (1 - decay_t) * weights,   decay_t = min(decay, (1 + t) / (10 + t))

starting from the weights after the first update. The warm-up term keeps the early, fast
changing weights from lingering: with decay 0.998 the average spans about the last 500
updates once t is large, and about the last t / 10 updates while t is small.

`average.module` is a model of the same class, so validation, checkpoints and decoding use it
exactly as they use the trained one; the trained weights go on into the optimizer and are
kept in the checkpoint's training state for an exact resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel


def effective_decay(decay: float, step: int) -> float:
    """The decay applied after update `step` (1-based): `decay`, lower while `step` is small."""
    return min(decay, (1.0 + step) / (10.0 + step))


def averaged_copy(model: nn.Module, decay: float) -> AveragedModel:
    """An exponential moving average of `model`'s parameters; `update_parameters(model)` after
    each applied update. Buffers (position tables) are constants, shared as they are."""

    def move(averaged: Sequence[Tensor], current: Sequence[Tensor], num_averaged: Tensor | int) -> None:
        # num_averaged updates are in the average already: this is update num_averaged + 1
        torch._foreach_lerp_(list(averaged), list(current), 1.0 - effective_decay(decay, int(num_averaged) + 1))

    average = AveragedModel(model, multi_avg_fn=move)
    average.requires_grad_(False)  # updated under no_grad; never trained
    return average


def restore_count(average: AveragedModel, updates: int) -> None:
    """After a resume: the average holds `updates` updates (its weights come from the checkpoint)."""
    average.n_averaged.fill_(updates)


@torch.no_grad()
def update_average(average: AveragedModel, model: nn.Module, step: int, decay: float) -> None:
    """Move the average toward `model`'s parameters after update `step` (1-based; every update
    taken is averaged, so the average holds step - 1 updates before this one): the first update
    copies them. The weight comes from `step` on the host, so nothing is read from the device
    (AveragedModel.update_parameters reads its count there at every call)."""
    averaged = [p.detach() for p in average.module.parameters()]
    current = [p.detach() for p in model.parameters()]
    if step <= 1:
        torch._foreach_copy_(averaged, current)
    else:
        torch._foreach_lerp_(averaged, current, 1.0 - effective_decay(decay, step))
    average.n_averaged.add_(1)
