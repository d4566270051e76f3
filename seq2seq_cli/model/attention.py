"""Attention ("Attention Is All You Need", section 3.2).

Shapes: B batch, H heads, T queries, S keys, Dk per-head query/key size, Dv per-head value size.

Attention(Q, K, V) = softmax(Q K^T / sqrt(Dk) + mask) V, computed by
`torch.nn.functional.scaled_dot_product_attention` in the normal path, by two batched
matmuls for a few queries per row in CPU inference (a decoding step), and by
`attention_with_weights` when the weights are asked for. `MultiHeadAttention` projects
queries, keys and values per head (W_Q, W_K, W_V) and joins the heads (W_O).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq_cli.model.masks import causal_mask


def attention_with_weights(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Explicit scaled dot-product attention that also returns the weights.

    q: (B, H, T, Dk), k: (B, H, S, Dk), v: (B, H, S, Dv), mask: bool broadcastable to (B, H, T, S)
    -> output (B, H, T, Dv), weights (B, H, T, S)
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    out = F.dropout(weights, dropout_p) @ v
    return out, weights


SMALL_QUERY = 16  # queries per row up to which CPU inference attends with two batched matmuls


def _small_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Attention of a few queries per row (a decoding step: one, or one per beam against a
    shared source) in float32 through two batched matmuls; on a CPU torch's fused kernel
    takes 1.3 to 2 times as long for these shapes. Shapes as in `attention_with_weights`."""
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)).mul_(1.0 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(q.dtype)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool = False
) -> Tensor:
    """softmax(Q K^T / sqrt(Dk) + mask) V through torch's fused kernel; shapes as in
    `attention_with_weights`. `causal` (with no mask): query t attends to keys 0..t, which the
    kernel knows without a mask tensor (on a GPU the flash kernel then applies). bf16 attention
    on a CPU runs in float32: there torch's bf16 attention kernels (forward and backward) are
    slower than its float32 ones."""
    if q.device.type == "cpu" and q.size(-2) <= SMALL_QUERY and not (torch.is_grad_enabled() or dropout_p or causal):
        return _small_query_attention(q, k, v, mask)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=dropout_p,
                                                 is_causal=causal)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_H) W_O, head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)."""

    def __init__(self, d_model: int, heads: int, q_k_size: int, v_size: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.heads, self.q_k_size, self.v_size, self.dropout = heads, q_k_size, v_size, dropout
        self.w_q = nn.Linear(d_model, heads * q_k_size, bias=bias)
        self.w_k = nn.Linear(d_model, heads * q_k_size, bias=bias)
        self.w_v = nn.Linear(d_model, heads * v_size, bias=bias)
        self.w_o = nn.Linear(heads * v_size, d_model, bias=bias)

    def _split(self, x: Tensor, size: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.heads, size).transpose(1, 2)  # (B, H, T, size)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, S, D) -> K (B, H, S, Dk), V (B, H, S, Dv)."""
        return self._split(self.w_k(x), self.q_k_size), self._split(self.w_v(x), self.v_size)

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool = False, causal: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) queries; k, v from `keys_values`; -> (B, T, D), weights (B, H, T, S) or None.
        `causal` (mask None): query t attends to keys 0..t."""
        q = self._split(self.w_q(x), self.q_k_size)  # (B, H, T, Dk)
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = attention_with_weights(q, k, v, causal_mask(q.size(2), q.device) if causal else mask, p)
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask, p, causal), None
        B, H, T, Dv = out.shape
        out = out.transpose(1, 2).reshape(B, T, H * Dv)  # (B, T, H*Dv)
        return self.w_o(out), weights
