"""One decoding step of the decoder, fused: what the searches run once per output token.

A step runs one new position of every decoder row through every decoder layer, as
`DecoderLayer.forward` with `incremental` does, with far fewer operations, for a step of a
small model is mostly the cost of launching operations, not of computing them:

- the self-attention's Q, K and V come from one matrix product (`fuse`), each head's query,
  key and value side by side, the query scaled by 1/sqrt(Dk) in the weights (exactly the
  scores of the layers' path where Dk is a power of four, as 64);
- the new keys/values go into the state's `StepCache` (`seq2seq_cli/model/kv_cache.py`)
  with one copy per layer, and the beams' reorder is one `index_select` for every layer;
- attention is two batched matrix products on views of the caches (no copies), the source
  padding of cross-attention an additive bias inside the first (`baddbmm`);
- the feed-forward activation is fused into its first product where the projection can
  (oneDNN's ReLU, `seq2seq_cli/decode/onednn.py`);
- plain functions on tensors: no module calls, no hooks, no masks built.

It decodes in eval mode (no dropout) and returns no attention weights: the layers' path
(`Seq2SeqTransformer.decode` with `incremental` and a state not made for steps) stays the
reference, and the one that gives weights.

Shape legend
    N   decoder rows (sentences x beams)   b   sentences      g   rows per sentence (N = b g)
    H   heads      Dk  per-head query/key size      Dv  per-head value size      E   Dk + Dv
    D   d_model    L   positions cached before this step      S   source length
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from seq2seq_cli.model.kv_cache import DecoderState, StepCache
    from seq2seq_cli.model.transformer import Seq2SeqTransformer


class Projection(Protocol):
    """y = act(x W^T + b): x (N, in) -> (N, out)."""

    def forward(self, x: Tensor) -> Tensor: ...


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


class Linear:
    """A `Projection` through F.linear, the activation (if any) applied after."""

    def __init__(self, weight: Tensor, bias: Tensor | None, activation: str = "none") -> None:
        self.weight, self.bias = weight, bias
        self.act = ACTIVATIONS.get(activation)

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if self.act is None else self.act(y)


class Activated:
    """A projection without an activation, the activation applied after it."""

    def __init__(self, inner: Projection, activation: str) -> None:
        self.inner, self.act = inner, ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.inner.forward(x))


MakeProjection = Callable[[Tensor, Tensor | None, str], Projection]
"""(weight (out, in), bias (out,) or None, activation: "none", "relu", "swish" or "gelu") -> a
`Projection`; the default is `Linear`."""


@dataclass
class Norm:
    """A LayerNorm's parameters as plain tensors (no module lookups in the step)."""

    shape: tuple[int, ...]
    weight: Tensor | None
    bias: Tensor | None
    eps: float

    @classmethod
    def of(cls, norm: nn.LayerNorm) -> Norm:
        return cls(tuple(norm.normalized_shape), _detached(norm.weight), _detached(norm.bias), norm.eps)

    def __call__(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


@dataclass
class LayerWeights:
    """One decoder layer's weights for the step."""

    qkv: Projection  # (N, D) -> (N, H * (Dk + Dk + Dv)): per head its query (scaled), key and value
    self_out: Projection  # W_O of self-attention
    cross_q: Projection  # (N, D) -> (N, H * Dk), scaled by 1/sqrt(Dk)
    cross_out: Projection  # W_O of cross-attention
    ffn_in: Projection  # W_1 with the activation
    ffn_out: Projection  # W_2
    norms: tuple[Norm, Norm, Norm]  # of the self-attention, cross-attention and feed-forward blocks


@dataclass
class StepWeights:
    """The decoder's weights for the step: its layers', the target embedding's and the final norm's."""

    layers: list[LayerWeights]
    tokens: Tensor  # (V, D) target token embeddings
    positions: Tensor  # (max_positions, D) position embeddings (learned) or encodings (sinusoidal)
    scale: float  # of the token embeddings
    final_norm: Norm | None  # pre-norm's last LayerNorm; None with post-norm


def fuse(model: Seq2SeqTransformer, make: MakeProjection = Linear) -> StepWeights:
    """The decoder's weights arranged for the step, each projection made by `make`: self-
    attention's W_Q (scaled by 1/sqrt(Dk)), W_K and W_V stacked head by head into one matrix,
    cross-attention's W_Q scaled. The weights are copies where stacked or scaled, so make a
    new StepWeights after the model's weights change."""
    cfg = model.cfg
    H, Dk, Dv = cfg.heads, cfg.head_q_k_size, cfg.head_v_size
    scale = 1.0 / math.sqrt(Dk)
    layers = []
    with torch.no_grad():
        for layer in model.decoder_layers():
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
            sizes = (Dk, Dk, Dv)
            qkv = _by_head([sa.w_q.weight * scale, sa.w_k.weight, sa.w_v.weight], sizes, H)
            qkv_bias = None if sa.w_q.bias is None else _by_head([sa.w_q.bias * scale, sa.w_k.bias, sa.w_v.bias], sizes, H)
            layers.append(LayerWeights(
                qkv=make(qkv, qkv_bias, "none"),
                self_out=make(sa.w_o.weight.detach(), _detached(sa.w_o.bias), "none"),
                cross_q=make(ca.w_q.weight * scale, None if ca.w_q.bias is None else ca.w_q.bias * scale, "none"),
                cross_out=make(ca.w_o.weight.detach(), _detached(ca.w_o.bias), "none"),
                ffn_in=make(ffn.w_1.weight.detach(), _detached(ffn.w_1.bias), cfg.activation),
                ffn_out=make(ffn.w_2.weight.detach(), _detached(ffn.w_2.bias), "none"),
                norms=(Norm.of(layer.self_block.norm), Norm.of(layer.cross_block.norm), Norm.of(layer.ffn_block.norm)),
            ))
        emb = model.tgt_embed
        positions = emb.positions.weight if emb.learned else emb.table
        final = Norm.of(model.decoder_norm) if isinstance(model.decoder_norm, nn.LayerNorm) else None
        return StepWeights(layers, emb.tokens.weight.detach(), positions.detach(), emb.scale, final)


def _by_head(parts: list[Tensor], sizes: tuple[int, ...], heads: int) -> Tensor:
    """Weights (H*n_i, D) or biases (H*n_i,) of several projections -> one (H*sum(n_i), ...) with
    each head's rows of every part side by side: head 0's rows of each part, then head 1's, ..."""
    rest = parts[0].shape[1:]
    return torch.cat([p.reshape(heads, n, *rest) for p, n in zip(parts, sizes)], dim=1).reshape(-1, *rest)


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def decode_step(model: Seq2SeqTransformer, last: Tensor, state: DecoderState, weights: StepWeights) -> Tensor:
    """last: (N, 1) the newest token of each decoder row -> the decoder's output (N, 1, D) for
    the next position; its keys/values are added to `state.steps` (the caller counts the
    position in `state.length`)."""
    cache, cross = state.steps, state.cross
    if cache is None or cross is None or state.cross_bias is None:
        raise ValueError("the state is not made for steps; call DecoderState.preallocate first")
    cfg = model.cfg
    H, Dk = cfg.heads, cfg.head_q_k_size
    pre = cfg.norm == "pre"
    N, L = last.size(0), state.length
    x = weights.tokens.index_select(0, last.view(-1))  # (N, D)
    if weights.scale != 1.0:
        x = x * weights.scale
    x = x + weights.positions[L]
    kv = cache.extend(N)  # (L+1, layers, N, H, E)
    b = state.cross_bias.size(0)
    bias = state.cross_bias.view(b * H, 1, -1)  # (b*H, 1, S)
    for i, w in enumerate(weights.layers):
        x = _self_attention(x, w, cache, kv, i, H, Dk, pre)
        x = _cross_attention(x, w, cross[i], bias, b, H, Dk, pre)
        norm = w.norms[2]
        x = x + w.ffn_out.forward(w.ffn_in.forward(norm(x) if pre else x))
        if not pre:
            x = norm(x)
    if weights.final_norm is not None:
        x = weights.final_norm(x)
    return x.view(N, 1, -1)


def _self_attention(x: Tensor, w: LayerWeights, cache: StepCache, kv: Tensor, i: int, H: int, Dk: int,
                    pre: bool) -> Tensor:
    """x: (N, D) -> x after the self-attention block; the new position's key/value written into
    kv (L+1, layers, N, H, E), read back with the others through views of it."""
    N, norm = x.size(0), w.norms[0]
    qkv = w.qkv.forward(norm(x) if pre else x)  # (N, H*(Dk+E)) contiguous: per head its query (scaled), key, value
    row, head, at = qkv.size(1), qkv.size(1) // H, qkv.storage_offset()
    E = head - Dk
    kv[-1, i] = qkv.as_strided((N, H, E), (row, head, 1), at + Dk)  # this position's keys and values
    q = qkv.as_strided((N * H, 1, Dk), (head, head, 1), at)  # (N*H, 1, Dk)
    k, v = cache.layer_views(kv, i, Dk)  # (N*H, Dk, L+1), (N*H, L+1, Dv)
    a = torch.bmm(torch.bmm(q, k).softmax(dim=-1), v)  # (N*H, 1, Dv)
    x = x + w.self_out.forward(a.view(N, -1))
    return x if pre else norm(x)


def _cross_attention(x: Tensor, w: LayerWeights, cross: tuple[Tensor, Tensor], bias: Tensor, b: int, H: int, Dk: int,
                     pre: bool) -> Tensor:
    """x: (N, D) -> x after the cross-attention block: the g = N/b rows of a sentence query its
    one copy of the source keys; cross: keys (b*H, Dk, S), values (b*H, S, Dv)."""
    N = x.size(0)
    g, norm = N // b, w.norms[1]
    q = w.cross_q.forward(norm(x) if pre else x)  # (N, H*Dk): rows (b, g), columns (H, Dk)
    if b == 1:  # one sentence: its heads first as a view
        q = q.as_strided((H, g, Dk), (Dk, H * Dk, 1), q.storage_offset())
    else:
        q = q.view(b, g, H, Dk).transpose(1, 2).reshape(b * H, g, Dk)
    scores = torch.baddbmm(bias, q, cross[0])  # (b*H, g, S), padding -inf
    a = torch.bmm(scores.softmax(dim=-1), cross[1])  # (b*H, g, Dv)
    Dv = a.size(2)
    a = a.view(b, H, g, Dv).transpose(1, 2).reshape(N, H * Dv)
    x = x + w.cross_out.forward(a)
    return x if pre else norm(x)
