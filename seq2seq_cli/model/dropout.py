"""Dropout whose mask is cheap to draw on a CPU.

`F.dropout` on a CPU draws one Bernoulli sample per element from the 32-bit Mersenne
Twister, then multiplies twice (mask, then 1 / (1 - p)): for a (52, 39, 256) activation of a
training batch that is about 5 ms forward and 1 ms backward on one core, ~8% of an update of
the quick start's model, more than any operator but the matrix products. Here one 31-bit
draw makes the masks of two elements: the draws (uniform in [0, 2^31)) are shifted left by
one bit and read as pairs of 16-bit integers (the high half uniform over all 2^16 values,
the low half over the even ones), an element is kept when its integer is at or above an
even threshold, which both halves pass with the same probability, and the kept elements are
scaled by one precomputed mask tensor, which the backward pass reuses: about 2.4 ms forward
and 0.3 ms backward for the same tensor.

The drop probability is p rounded to a multiple of 2^-15 (0.1 becomes 0.100006), and the
scale is 1 / (1 - that probability), so the expectation is kept exactly. Draws come from
torch's default CPU generator, like `F.dropout`'s, so seeding and the saved RNG state of a
checkpoint (exact resume) work as before. Other devices use `F.dropout`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 15  # the even 16-bit integers: what both halves of a shifted draw can hold


def keep_threshold(p: float) -> tuple[int, float]:
    """-> (the smallest signed 16-bit value that is kept (even), the scale of kept elements) for drop probability p."""
    dropped = round(p * LEVELS)
    return -(1 << 15) + 2 * dropped, LEVELS / (LEVELS - dropped)


def cpu_mask(x: Tensor, p: float) -> Tensor:
    """A mask shaped like x, in x's dtype: 0 where an element is dropped, the scale where it is kept."""
    threshold, scale = keep_threshold(p)
    n = x.numel()
    draws = torch.empty((n + 1) // 2, dtype=torch.int32).random_().bitwise_left_shift_(1)
    keep = draws.view(torch.int16)[:n].view(x.shape) >= threshold
    return keep.to(x.dtype).mul_(scale)


class _CpuDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float) -> Tensor:
        mask = cpu_mask(x, p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """`F.dropout(x, p, training)`, with the cheap mask on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training)
    return _CpuDropout.apply(x, p)


class Dropout(nn.Module):
    """`nn.Dropout` with `dropout` inside."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
