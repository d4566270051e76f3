"""The decoder's key/value cache for incremental decoding.

Each decoder layer keeps a `LayerCache`: the cross-attention keys/values, computed once from
the encoder output per source batch, and the self-attention keys/values of every target
position decoded so far, one more per step. `DecoderState` holds the layers' caches, the
source mask and the decoded length, and moves them with the search: beams reordered
(`reorder`), finished sentences dropped (`select`). A search's state decodes through the
fused step (`seq2seq_cli/model/step.py`), whose self-attention keys/values for every layer
live in one `StepCache`, allocated once (`preallocate`).

Shape legend
    B   decoder rows (sentences, or sentences x beams)   B'  rows after a reorder/select
    S   source length          T   new target positions   L   cached target positions
    H   heads                  Dk  per-head query/key size                Dv  per-head value size
    d   Dk or Dv               group  decoder rows sharing one sentence's cross-attention keys/values
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """Keys/values one decoder layer keeps while decoding incrementally through the layers
    (`Seq2SeqTransformer.decode` with `incremental`, the path that can return attention
    weights): the self-attention cache grows by concatenation. Searches decode through the
    fused step instead, whose self-attention keys/values live in the state's `StepCache`.
    Reordering is deferred: `order` holds the rows the cache must follow before the next
    position is appended, composed over several reorder/select calls.
    """

    cross_k: Tensor  # (B, H, S, Dk), computed once from the encoder output
    cross_v: Tensor  # (B, H, S, Dv)
    self_k: Tensor | None = None  # (B, H, L, Dk), one more position per step
    self_v: Tensor | None = None  # (B, H, L, Dv)
    order: Tensor | None = None  # (B',) rows of self_k/self_v the next step continues from

    def follow(self, index: Tensor) -> None:
        """Rows of the self-attention cache will follow `index` (applied at the next append)."""
        if self.self_k is not None:
            self.order = index if self.order is None else self.order.index_select(0, index)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k: (B, H, T, Dk), v: (B, H, T, Dv) for new positions -> every cached key (B, H, L+T, Dk)
        and value (B, H, L+T, Dv), the pending reorder applied first."""
        old_k, old_v, order = self.self_k, self.self_v, self.order
        self.order = None
        if old_k is not None and old_v is not None:
            if order is not None:
                old_k, old_v = old_k.index_select(0, order), old_v.index_select(0, order)
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)  # (B, H, L+T, Dk)
        self.self_k, self.self_v = k, v
        return k, v


@dataclass
class StepCache:
    """The self-attention keys/values of every decoder layer for the fused step
    (`seq2seq_cli/model/step.py`), position-major in one flat buffer allocated once:
    position t of all layers and rows is `view(L)[t]`, (layers, B, H, Dk + Dv), a head's key
    and value side by side. The positions decoded so far are one contiguous block, so a
    reorder of the rows (beam search) is a single `index_select` of that block, for every
    layer at once, into the spare buffer, which then becomes the store; a step writes each
    layer's new key/value with one copy. The buffers grow (by half) only when an output
    outgrows the positions they were allocated for.
    Reordering is deferred as in `LayerCache`: `order` is applied when the next position
    is added (`extend`).
    """

    store: Tensor  # flat buffer holding positions 0..length-1, (length, layers, rows, H, Dk + Dv)
    spare: Tensor  # flat buffer the next reorder writes into
    layers: int
    heads: int
    k_size: int  # Dk; the value of a head follows its key (Dv = width - Dk)
    width: int  # Dk + Dv
    rows: int = 0  # decoder rows of the cached positions
    length: int = 0  # positions cached
    order: Tensor | None = None  # (B',) rows of the cache the next position continues from

    @classmethod
    def empty(cls, layers: int, rows: int, positions: int, heads: int, k_size: int, v_size: int,
              like: Tensor) -> StepCache:
        """Buffers for `positions` positions of `rows` rows, in `like`'s dtype and device."""
        size = positions * layers * rows * heads * (k_size + v_size)
        return cls(like.new_empty(size), like.new_empty(size), layers, heads, k_size, k_size + v_size)

    def view(self, positions: int, rows: int | None = None, buffer: Tensor | None = None) -> Tensor:
        """The first `positions` positions of the store (or `buffer`) -> (positions, layers, rows, H, Dk + Dv)."""
        rows = self.rows if rows is None else rows
        flat = self.store if buffer is None else buffer
        return flat[: positions * self.layers * rows * self.heads * self.width].view(
            positions, self.layers, rows, self.heads, self.width)

    def follow(self, index: Tensor) -> None:
        """Rows of the cache will follow `index` (applied when the next position is added)."""
        if self.length:
            self.order = index if self.order is None else self.order.index_select(0, index)

    def extend(self, rows: int) -> Tensor:
        """Room for one more position of `rows` decoder rows, the pending reorder applied ->
        every position (L+1, layers, rows, H, Dk + Dv); the caller writes position L."""
        L, order = self.length, self.order
        need = (L + 1) * self.layers * rows * self.heads * self.width
        if order is not None:
            if self.spare.numel() < need:
                self.spare = self.spare.new_empty(need + need // 2)
            out = self.view(L + 1, rows, self.spare)
            torch.index_select(self.view(L), 2, order, out=out[:L])
            self.store, self.spare = self.spare, self.store
        else:
            if L and rows != self.rows:
                raise ValueError(f"the cache holds {self.rows} rows, the step decodes {rows}")
            if self.store.numel() < need:
                grown = self.store.new_empty(need + need // 2)
                grown[: self.store.numel()] = self.store
                self.store = grown
            out = self.view(L + 1, rows)
        self.order, self.rows, self.length = None, rows, L + 1
        return out

    def layer_views(self, kv: Tensor, layer: int, k_size: int) -> tuple[Tensor, Tensor]:
        """Views of `layer`'s keys and values in `kv` (P, layers, rows, H, E) from `extend`, as
        batched matrices with the heads of every row first: keys (rows*H, Dk, P) and values
        (rows*H, P, Dv)."""
        P, layers, rows, H, E = kv.shape
        at = kv.storage_offset() + layer * rows * H * E
        step = layers * rows * H * E  # from one position to the next
        return (kv.as_strided((rows * H, k_size, P), (E, 1, step), at),
                kv.as_strided((rows * H, P, E - k_size), (E, step, 1), at + k_size))

    def keys(self, layer: int) -> Tensor:
        """Every cached key of `layer` -> (rows, H, L, Dk) (a view)."""
        return self.view(self.length)[:, layer, ..., : self.k_size].permute(1, 2, 0, 3)

    def values(self, layer: int) -> Tensor:
        """Every cached value of `layer` -> (rows, H, L, Dv) (a view)."""
        return self.view(self.length)[:, layer, ..., self.k_size :].permute(1, 2, 0, 3)


@dataclass
class DecoderState:
    """Everything incremental decoding carries between steps.

    With `group` > 1 the decoder rows come in groups of `group` consecutive rows (the beams
    of one sentence) that share one copy of the sentence's cross-attention keys/values and
    source mask: cross_k is (B, H, S, Dk) while the self-attention cache is (B*group, H, L, Dk).
    A state made for the fused step (`preallocate`) keeps its self-attention keys/values in
    `steps` and the source mask as an additive bias too (`cross_bias`).
    """

    layers: list[LayerCache]
    src_mask: Tensor  # (B, 1, 1, S)
    length: int = 0  # target positions already decoded
    group: int = 1  # decoder rows per source sentence
    vocab: Tensor | None = None  # (C,) the target ids this batch may produce (a shortlist); None = all
    vocab_weight: Tensor | None = None  # (C, D) their rows of the output layer
    vocab_bias: Tensor | None = None  # (C,) their logits bias, where the model has one
    steps: StepCache | None = None  # the fused step's self-attention cache; None: the layers' own
    cross_bias: Tensor | None = None  # (B, H, 1, S) 0 for a source position, -inf for padding (with `steps`)
    weights: Any = None  # model.step.StepWeights: the decoder's weights arranged for the step (with `steps`)
    cross: list[tuple[Tensor, Tensor]] | None = None  # per layer cross_k as (B*H, Dk, S), cross_v as (B*H, S, Dv) (with `steps`)

    def preallocate(self, rows: int, positions: int, heads: int, k_size: int, v_size: int) -> None:
        """Make this state one for the fused step (`seq2seq_cli/model/step.py`): the
        self-attention cache of every layer allocated once for up to `rows` decoder rows and
        `positions` target positions (it grows if a longer output is ever asked for), and the
        source mask as an additive bias of the cross-attention scores."""
        if self.length:
            raise ValueError("preallocate a state before decoding with it")
        for c in self.layers:  # the step views them as (B*H, S, d)
            c.cross_k, c.cross_v = c.cross_k.contiguous(), c.cross_v.contiguous()
        like = self.layers[0].cross_k
        self.steps = StepCache.empty(len(self.layers), rows, positions, heads, k_size, v_size, like)
        B, S = self.src_mask.size(0), self.src_mask.size(-1)
        bias = torch.zeros(B, heads, 1, S, dtype=like.dtype, device=like.device)
        self.cross_bias = bias.masked_fill_(~self.src_mask, float("-inf"))
        self._cross_views()

    def _cross_views(self) -> None:
        """`cross`: each layer's cross-attention keys/values as batched matrices for the step."""
        views = []
        for c in self.layers:
            B, H, S, Dk = c.cross_k.shape
            views.append((c.cross_k.view(B * H, S, Dk).transpose(1, 2), c.cross_v.view(B * H, S, c.cross_v.size(-1))))
        self.cross = views

    def reorder(self, index: Tensor) -> None:
        """Rows of the self-attention cache follow `index` (beam reordering within a sentence,
        or the first step's rows expanded into beams)."""
        for c in self.layers:
            c.follow(index)
        if self.steps is not None:
            self.steps.follow(index)

    def select(self, index: Tensor) -> None:
        """Keep only the decoder rows in `index` (finished sentences leave the batch); with
        groups, `index` keeps whole groups."""
        self.reorder(index)
        sentences = index if self.group == 1 else index.view(-1, self.group)[:, 0] // self.group
        for c in self.layers:
            c.cross_k, c.cross_v = c.cross_k.index_select(0, sentences), c.cross_v.index_select(0, sentences)
        self.src_mask = self.src_mask.index_select(0, sentences)
        if self.cross_bias is not None:
            self.cross_bias = self.cross_bias.index_select(0, sentences)
        if self.cross is not None:
            self._cross_views()
