"""Label-smoothed cross-entropy, fused: the forward pass keeps one (N, V) buffer and the
backward pass writes the gradient into one more.

loss = sum over non-pad targets of (1 - eps) * nll + eps * mean over the vocabulary of -log p.

The autograd graph of the plain formula (log-softmax, gather, mean, where) keeps several
(N, V) tensors alive and allocates more in the backward pass (a zero-filled scatter for the
gather, an expanded mean, a masked where); on a CPU each fresh (N, V) tensor costs more in
page faults and fills than the arithmetic. Here the backward pass is the closed form
  d loss / d logits = keep * (softmax - (1 - eps) * onehot(target) - eps / V),
computed in place in one buffer.

`batch_loss` is the loss of one batch: the model's forward pass under the run's precision,
then this loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from seq2seq_cli.config import Config
from seq2seq_cli.data.batching import Batch
from seq2seq_cli.device import autocast
from seq2seq_cli.ids import PAD


class _LabelSmoothedNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
        # logits: (N, V), target: (N,)
        wide = torch.promote_types(logits.dtype, torch.float32)
        lprobs = torch.log_softmax(logits.to(wide), dim=-1)  # (N, V), float32 at least
        keep = target != PAD  # (N,)
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
        smooth = -lprobs.mean(dim=-1)  # (N,)
        loss = torch.where(keep, (1.0 - epsilon) * nll + epsilon * smooth, 0.0).sum()
        nll_sum, tokens = torch.where(keep, nll, 0.0).sum(), keep.sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll_sum, tokens)  # outputs without a gradient: the nll is reported, not trained
        return loss, nll_sum, tokens

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> tuple[Tensor, None, None]:
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.size(-1)
        grad = lprobs.exp()  # softmax
        grad.sub_(eps / vocab)
        grad.scatter_add_(-1, target.unsqueeze(-1), torch.full_like(grad[:, :1], eps - 1.0))
        grad.mul_((keep.to(grad.dtype) * grad_loss).unsqueeze(-1))
        return grad.to(ctx.dtype), None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """logits: (B, T, V), target: (B, T) -> (smoothed loss sum, nll sum, non-pad tokens), all
    0-dim tensors on the logits' device (reading them is left to the caller: no host sync here).
    Pad targets are ignored; the gradient flows through the smoothed loss only."""
    vocab = logits.size(-1)
    return _LabelSmoothedNLL.apply(logits.reshape(-1, vocab), target.reshape(-1), epsilon)


ROW_BLOCK = 128
"""The target positions of a batch go through the output layer and the loss in a multiple of
this many rows; the added rows repeat the first position with a padding target, so they add
no loss and no gradient. The largest tensors of an update, (rows, vocabulary), then come in a
few sizes, which the host's allocator reuses, where a size for every batch (thousands)
fragmented its heap: the trainer's memory grew from update to update. The cost is 64 rows in
about 2,000 of the output layer's (a quick-start batch), under 1% of an update."""


def padded_rows(rows: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """rows (N,): the flat positions that have a target, target (N,): their targets -> both
    padded to a multiple of ROW_BLOCK with the first position and PAD."""
    extra = -rows.numel() % ROW_BLOCK
    if not extra or not rows.numel():
        return rows, target
    return torch.cat([rows, rows[:1].expand(extra)]), torch.cat([target, target.new_full((extra,), PAD)])


def batch_loss(model: nn.Module, b: Batch, config: Config, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(smoothed loss sum, nll sum, target tokens) of one batch. The output layer and the loss
    see the positions that have a target only (7% of a quick-start batch is padding), taken
    by the batch's index of them (`Batch.tgt_rows`), which needs no host sync on a GPU, padded
    to a multiple of ROW_BLOCK rows (`padded_rows`)."""
    if b.tgt_rows is None:
        with autocast(device, config.train.precision):
            logits = model(b.src, b.tgt_in)
        return label_smoothed_nll(logits, b.tgt_out, config.train.label_smoothing)
    rows, target = padded_rows(b.tgt_rows, b.tgt_out.reshape(-1).index_select(0, b.tgt_rows))
    with autocast(device, config.train.precision):
        logits = model(b.src, b.tgt_in, rows)
    return label_smoothed_nll(logits, target, config.train.label_smoothing)
