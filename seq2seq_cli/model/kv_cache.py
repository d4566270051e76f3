"""The decoder's key/value cache for incremental decoding.

Each decoder layer keeps a `LayerCache`: the cross-attention keys/values, computed once from
the encoder output per source batch, and the self-attention keys/values of every target
position decoded so far, one more per step. `DecoderState` holds the layers' caches, the
source mask and the decoded length, and moves them with the search: beams reordered
(`reorder`), finished sentences dropped (`select`), buffers allocated once (`preallocate`).

Shape legend
    B   decoder rows (sentences, or sentences x beams)   B'  rows after a reorder/select
    S   source length          T   new target positions   L   cached target positions
    H   heads                  Dk  per-head query/key size                Dv  per-head value size
    d   Dk or Dv               group  decoder rows sharing one sentence's cross-attention keys/values
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """Keys/values one decoder layer keeps while decoding incrementally.

    Without `stores` the self-attention cache grows by concatenation. With `stores` (flat
    buffers allocated once by `DecoderState.preallocate`) each step writes the reordered cache
    and the new position into the `spare` buffers in one copy, and the buffers that held the
    old cache become the spare ones; every layer of a state shares one spare pair, so a
    decoder of N layers holds N + 1 pairs. self_k/self_v stay contiguous (B, H, L, Dk) views
    for attention, and nothing is allocated per step except when a buffer outgrows its
    preallocated size (it then grows by half).
    Reordering is deferred: `order` holds the rows the cache must follow before the next
    position is appended, composed over several reorder/select calls.
    """

    cross_k: Tensor  # (B, H, S, Dk), computed once from the encoder output
    cross_v: Tensor  # (B, H, S, Dv)
    self_k: Tensor | None = None  # (B, H, L, Dk), one more position per step
    self_v: Tensor | None = None  # (B, H, L, Dv)
    order: Tensor | None = None  # (B',) rows of self_k/self_v the next step continues from
    stores: list[Tensor] | None = None  # [keys, values] flat buffers holding self_k/self_v
    spare: list[Tensor] | None = None  # [keys, values] flat buffers the next step writes into, shared by all layers

    def follow(self, index: Tensor) -> None:
        """Rows of the self-attention cache will follow `index` (applied at the next append)."""
        if self.self_k is not None:
            self.order = index if self.order is None else self.order.index_select(0, index)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k: (B, H, T, Dk), v: (B, H, T, Dv) for new positions -> every cached key (B, H, L+T, Dk)
        and value (B, H, L+T, Dv), the pending reorder applied first."""
        old_k, old_v, order = self.self_k, self.self_v, self.order
        self.order = None
        if self.stores is None:
            if old_k is not None and old_v is not None:
                if order is not None:
                    old_k, old_v = old_k.index_select(0, order), old_v.index_select(0, order)
                k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)  # (B, H, L+T, Dk)
        else:
            L = 0 if old_k is None else old_k.size(2)
            k, v = self._write(old_k, k, order, L, 0), self._write(old_v, v, order, L, 1)
        self.self_k, self.self_v = k, v
        return k, v

    def _write(self, old: Tensor | None, new: Tensor, order: Tensor | None, L: int, which: int) -> Tensor:
        """Reordered `old` (B0, H, L, d) then `new` (B, H, T, d) into the spare buffer -> (B, H, L+T, d);
        the buffer that held `old` becomes the spare one."""
        B, H, T, d = new.shape
        size = B * H * (L + T) * d
        spare, stores = self.spare, self.stores
        if spare is None or stores is None:
            raise ValueError("the cache has no buffers to write into; call DecoderState.preallocate first")
        if spare[which].numel() < size:  # more than preallocated: grow this buffer by half
            spare[which] = spare[which].new_empty(size + size // 2)
        buffer = spare[which]
        out = buffer[:size].view(B, H, L + T, d)  # (B, H, L+T, d) contiguous
        if old is not None:
            if order is None:
                out[:, :, :L] = old
            else:
                torch.index_select(old, 0, order, out=out[:, :, :L])
        out[:, :, L:] = new
        spare[which], stores[which] = stores[which], buffer
        return out


@dataclass
class DecoderState:
    """Everything incremental decoding carries between steps.

    With `group` > 1 the decoder rows come in groups of `group` consecutive rows (the beams
    of one sentence) that share one copy of the sentence's cross-attention keys/values and
    source mask: cross_k is (B, H, S, Dk) while the self-attention cache is (B*group, H, L, Dk).
    """

    layers: list[LayerCache]
    src_mask: Tensor  # (B, 1, 1, S)
    length: int = 0  # target positions already decoded
    group: int = 1  # decoder rows per source sentence
    vocab: Tensor | None = None  # (C,) the target ids this batch may produce (a shortlist); None = all
    vocab_weight: Tensor | None = None  # (C, D) their rows of the output layer
    vocab_bias: Tensor | None = None  # (C,) their logits bias, where the model has one
    vocab_mask: Tensor | None = None  # (B, C) 0 where a sentence may produce the id, -inf where not; None: all may

    def preallocate(self, rows: int, positions: int, heads: int, k_size: int, v_size: int) -> None:
        """Allocate each layer's self-attention cache once for up to `rows` decoder rows and
        `positions` target positions (buffers grow if a longer output is ever asked for)."""
        like = self.src_mask.new_empty(0, dtype=self.layers[0].cross_k.dtype)

        def pair() -> list[Tensor]:
            return [like.new_empty(rows * heads * positions * k_size), like.new_empty(rows * heads * positions * v_size)]

        spare = pair()
        for c in self.layers:
            c.stores, c.spare = pair(), spare

    def reorder(self, index: Tensor) -> None:
        """Rows of the self-attention cache follow `index` (beam reordering within a sentence,
        or the first step's rows expanded into beams)."""
        for c in self.layers:
            c.follow(index)

    def select(self, index: Tensor) -> None:
        """Keep only the decoder rows in `index` (finished sentences leave the batch); with
        groups, `index` keeps whole groups."""
        self.reorder(index)
        sentences = index if self.group == 1 else index.view(-1, self.group)[:, 0] // self.group
        for c in self.layers:
            c.cross_k, c.cross_v = c.cross_k.index_select(0, sentences), c.cross_v.index_select(0, sentences)
        self.src_mask = self.src_mask.index_select(0, sentences)
        if self.vocab_mask is not None:
            self.vocab_mask = self.vocab_mask.index_select(0, sentences)
