"""Boolean attention masks. True = this query may attend to this key.

The only place masks are built. Shapes broadcast against attention scores (B, H, T_q, T_k).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Key padding mask from token ids.

    ids: (B, S) -> (B, 1, 1, S), True where the key is a real token.
    """
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """Lower-triangular mask: query t may attend to keys 0..t.

    -> (1, 1, T, T)
    """
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def decoder_self_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Padding AND causal mask for decoder self-attention.

    ids: (B, T) -> (B, 1, T, T)
    """
    return padding_mask(ids, pad_id) & causal_mask(ids.size(1), ids.device)
