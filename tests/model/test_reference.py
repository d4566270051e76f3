"""Our attention and layers against independent references.

With q_k_size = v_size = d_model / heads our weights are copied into PyTorch's own
`nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer`
(batch_first, ReLU, dropout 0; norm_first=False for post-norm, True for pre-norm), which must
compute the same function. PyTorch cannot express q_k_size != v_size, so there our attention
and encoder layer are compared with the paper's formulas written out below in float64.

Every parameter, LayerNorm gains and biases included, is randomised first: the model's own
initialisation zeroes biases and sets LayerNorms to the identity, which would hide a
mis-mapped bias or norm. Masks are built only with `seq2seq_cli.model.masks` (True = may attend) and
inverted for PyTorch (True = not allowed). PyTorch runs with autograd enabled, which keeps it
on its reference ("slow") path rather than the fused inference fast path.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from seq2seq_cli.config import ModelConfig
from seq2seq_cli.ids import PAD
from seq2seq_cli.model.attention import MultiHeadAttention
from seq2seq_cli.model.kv_cache import LayerCache
from seq2seq_cli.model.masks import causal_mask, decoder_self_mask, padding_mask
from seq2seq_cli.model.transformer import DecoderLayer, EncoderLayer

D, HEADS, FFN = 16, 4, 32
B, S, T = 3, 7, 6
TOL = 1e-5
NORM_BIAS = [(norm, bias) for norm in ("post", "pre") for bias in (True, False)]


# --------------------------------------------------------------------------- helpers


def _cfg(norm: str = "post", bias: bool = True, **overrides: object) -> ModelConfig:
    settings: dict[str, object] = dict(d_model=D, heads=HEADS, ffn_size=FFN, dropout=0.0, norm=norm, bias=bias)
    settings.update(overrides)
    return ModelConfig(**settings)


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter drawn from N(0, 0.3^2), LayerNorm gains around 1; -> module in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
    return module.eval()


def _ids(lengths: list[int], width: int, seed: int) -> Tensor:
    """(len(lengths), width) token ids, PAD after each row's length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 20, (len(lengths), width), generator=g)
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
    return ids


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """src ids (B, S) and tgt ids (B, T) with padding, and random states x (B, T, D), memory (B, S, D)."""
    g = torch.Generator().manual_seed(seed)
    src = _ids([S, 4, 2], S, seed)
    tgt = _ids([T, 3, 5], T, seed + 1)
    return src, tgt, torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)


def _torch_key_padding(ids: Tensor) -> Tensor:
    """Our (B, 1, 1, S) padding mask as PyTorch's key_padding_mask (B, S), True = ignore."""
    return ~padding_mask(ids, PAD)[:, 0, 0, :]


def _torch_causal(length: int) -> Tensor:
    """Our (1, 1, T, T) causal mask as PyTorch's attn_mask (T, T), True = not allowed."""
    return ~causal_mask(length)[0, 0]


def _copy_linear(dst: nn.Module, src: nn.Linear | nn.LayerNorm) -> None:
    assert (dst.bias is None) == (src.bias is None)
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if src.bias is not None:
            dst.bias.copy_(src.bias)


def _copy_attention(dst: nn.MultiheadAttention, src: MultiHeadAttention) -> None:
    """in_proj = [W_Q; W_K; W_V] stacked by rows, out_proj = W_O."""
    with torch.no_grad():
        dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_k.weight, src.w_v.weight]))
        assert (dst.in_proj_bias is None) == (src.w_q.bias is None)
        if src.w_q.bias is not None:
            dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_k.bias, src.w_v.bias]))
    _copy_linear(dst.out_proj, src.w_o)


def _keep_norm_biases(ref: nn.Module, names: list[str]) -> None:
    """PyTorch's bias=False also drops the LayerNorm biases; ours keeps them (only linear layers
    lose their bias), so the reference gets biased LayerNorms in their place."""
    for name in names:
        setattr(ref, name, nn.LayerNorm(D))


def _torch_encoder_layer(ours: EncoderLayer, cfg: ModelConfig) -> nn.TransformerEncoderLayer:
    ref = nn.TransformerEncoderLayer(
        D, HEADS, FFN, dropout=0.0, activation="relu", batch_first=True, norm_first=cfg.norm == "pre", bias=cfg.bias
    )
    _keep_norm_biases(ref, ["norm1", "norm2"])
    _copy_attention(ref.self_attn, ours.self_attn)
    _copy_linear(ref.linear1, ours.ffn.w_1)
    _copy_linear(ref.linear2, ours.ffn.w_2)
    _copy_linear(ref.norm1, ours.attn_block.norm)
    _copy_linear(ref.norm2, ours.ffn_block.norm)
    return ref.eval()


def _torch_decoder_layer(ours: DecoderLayer, cfg: ModelConfig) -> nn.TransformerDecoderLayer:
    ref = nn.TransformerDecoderLayer(
        D, HEADS, FFN, dropout=0.0, activation="relu", batch_first=True, norm_first=cfg.norm == "pre", bias=cfg.bias
    )
    _keep_norm_biases(ref, ["norm1", "norm2", "norm3"])
    _copy_attention(ref.self_attn, ours.self_attn)
    _copy_attention(ref.multihead_attn, ours.cross_attn)
    _copy_linear(ref.linear1, ours.ffn.w_1)
    _copy_linear(ref.linear2, ours.ffn.w_2)
    _copy_linear(ref.norm1, ours.self_block.norm)
    _copy_linear(ref.norm2, ours.cross_block.norm)
    _copy_linear(ref.norm3, ours.ffn_block.norm)
    return ref.eval()


def _max_diff(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape
    return (a.double() - b.double()).abs().max().item()


# --------------------------------------------------------------------------- against PyTorch


@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_attention_matches_torch_with_padding_and_causal_masks(bias):
    cfg = _cfg(bias=bias)
    ours = _randomize(MultiHeadAttention(D, HEADS, cfg.head_q_k_size, cfg.head_v_size, 0.0, bias), seed=1)
    ref = nn.MultiheadAttention(D, HEADS, dropout=0.0, bias=bias, batch_first=True).eval()
    _copy_attention(ref, ours)
    src, tgt, x, memory = _inputs()

    # cross-attention: queries x, keys/values memory, source key padding
    out, w = ours(x, *ours.keys_values(memory), padding_mask(src, PAD), need_weights=True)
    expected, expected_w = ref(x, memory, memory, key_padding_mask=_torch_key_padding(src), average_attn_weights=False)
    assert _max_diff(out, expected) <= TOL
    assert _max_diff(w, expected_w) <= TOL

    # self-attention: padding AND causal
    out, w = ours(x, *ours.keys_values(x), decoder_self_mask(tgt, PAD), need_weights=True)
    expected, expected_w = ref(
        x, x, x, key_padding_mask=_torch_key_padding(tgt), attn_mask=_torch_causal(T), average_attn_weights=False
    )
    assert _max_diff(out, expected) <= TOL
    assert _max_diff(w, expected_w) <= TOL
    fast, _ = ours(x, *ours.keys_values(x), decoder_self_mask(tgt, PAD))  # the scaled_dot_product_attention path
    assert _max_diff(fast, expected) <= TOL


@pytest.mark.parametrize("norm,bias", NORM_BIAS)
def test_encoder_layer_matches_torch(norm, bias):
    cfg = _cfg(norm, bias)
    ours = _randomize(EncoderLayer(cfg), seed=2)
    ref = _torch_encoder_layer(ours, cfg)
    src, _, _, memory = _inputs()
    out, _ = ours(memory, padding_mask(src, PAD))
    expected = ref(memory, src_key_padding_mask=_torch_key_padding(src))
    assert _max_diff(out, expected) <= TOL


@pytest.mark.parametrize("norm,bias", NORM_BIAS)
def test_decoder_layer_matches_torch(norm, bias):
    cfg = _cfg(norm, bias)
    ours = _randomize(DecoderLayer(cfg), seed=3)
    ref = _torch_decoder_layer(ours, cfg)
    src, tgt, x, memory = _inputs()
    cache = LayerCache(*ours.cross_attn.keys_values(memory))
    out, _, _ = ours(x, decoder_self_mask(tgt, PAD), cache, padding_mask(src, PAD), incremental=False)
    expected = ref(
        x,
        memory,
        tgt_mask=_torch_causal(T),
        tgt_key_padding_mask=_torch_key_padding(tgt),
        memory_key_padding_mask=_torch_key_padding(src),
    )
    assert _max_diff(out, expected) <= TOL


@pytest.mark.parametrize("norm,bias", NORM_BIAS)
def test_incremental_decoder_layer_matches_torch_full_pass(norm, bias):
    """One position at a time over the key/value cache == PyTorch's causal pass over all of them."""
    cfg = _cfg(norm, bias)
    ours = _randomize(DecoderLayer(cfg), seed=4)
    ref = _torch_decoder_layer(ours, cfg)
    src, _, x, memory = _inputs()
    cache = LayerCache(*ours.cross_attn.keys_values(memory))
    steps = [ours(x[:, t : t + 1], None, cache, padding_mask(src, PAD), incremental=True)[0] for t in range(T)]
    expected = ref(x, memory, tgt_mask=_torch_causal(T), memory_key_padding_mask=_torch_key_padding(src))
    assert cache.self_k.shape == (B, HEADS, T, D // HEADS)
    assert _max_diff(torch.cat(steps, dim=1), expected) <= TOL


# --------------------------------------------------------------------------- against the paper's formulas


def _paper_layer_norm(x: Tensor, norm: nn.LayerNorm) -> Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def _paper_linear(x: Tensor, layer: nn.Linear, rows: slice = slice(None)) -> Tensor:
    """x W^T + b using the output rows `rows` of the layer, in float64."""
    y = x @ layer.weight.double()[rows].T
    return y if layer.bias is None else y + layer.bias.double()[rows]


def _paper_attention(x_q: Tensor, x_kv: Tensor, attn: MultiHeadAttention, allowed: Tensor) -> Tensor:
    """MultiHead = Concat(head_1..head_H) W_O, head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i.

    x_q: (B, T, D), x_kv: (B, S, D), allowed: bool broadcastable to (B, T, S) -> (B, T, D), float64.
    """
    dk, dv = attn.q_k_size, attn.v_size
    heads = []
    for i in range(attn.heads):
        q = _paper_linear(x_q, attn.w_q, slice(i * dk, (i + 1) * dk))  # (B, T, dk)
        k = _paper_linear(x_kv, attn.w_k, slice(i * dk, (i + 1) * dk))  # (B, S, dk)
        v = _paper_linear(x_kv, attn.w_v, slice(i * dv, (i + 1) * dv))  # (B, S, dv)
        scores = (q @ k.transpose(1, 2) / math.sqrt(dk)).masked_fill(~allowed, float("-inf"))  # (B, T, S)
        heads.append(torch.softmax(scores, dim=-1) @ v)  # (B, T, dv)
    return _paper_linear(torch.cat(heads, dim=-1), attn.w_o)  # (B, T, H*dv) -> (B, T, D)


def _paper_encoder_layer(x: Tensor, layer: EncoderLayer, allowed: Tensor, pre_norm: bool) -> Tensor:
    """Post-norm: LayerNorm(x + Sublayer(x)); pre-norm: x + Sublayer(LayerNorm(x)); float64."""

    def ffn(h: Tensor) -> Tensor:
        return _paper_linear(torch.relu(_paper_linear(h, layer.ffn.w_1)), layer.ffn.w_2)

    def attn(h: Tensor) -> Tensor:
        return _paper_attention(h, h, layer.self_attn, allowed)

    for f, norm in ((attn, layer.attn_block.norm), (ffn, layer.ffn_block.norm)):
        x = x + f(_paper_layer_norm(x, norm)) if pre_norm else _paper_layer_norm(x + f(x), norm)
    return x


@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL), (torch.float64, 1e-12)])
@pytest.mark.parametrize("bias", [True, False])
def test_attention_with_different_query_key_and_value_sizes_matches_the_paper(bias, dtype, tol):
    dk, dv, heads = 5, 7, 3  # d_model 16 is not even divisible by 3 heads: legal when both sizes are set
    ours = _randomize(MultiHeadAttention(D, heads, dk, dv, 0.0, bias), seed=5).to(dtype)
    src, tgt, x, memory = _inputs()
    cross, self_ = padding_mask(src, PAD), decoder_self_mask(tgt, PAD)  # (B, 1, 1, S), (B, 1, T, T)
    for kv, mask in ((memory, cross), (x, self_)):
        expected = _paper_attention(x.double(), kv.double(), ours, mask[:, 0])  # mask (B, 1 or T, S or T)
        for need_weights in (False, True):
            out, _ = ours(x.to(dtype), *ours.keys_values(kv.to(dtype)), mask, need_weights)
            assert out.dtype == dtype
            assert _max_diff(out, expected) <= tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL), (torch.float64, 1e-12)])
@pytest.mark.parametrize("norm,bias", NORM_BIAS)
def test_encoder_layer_with_different_query_key_and_value_sizes_matches_the_paper(norm, bias, dtype, tol):
    cfg = _cfg(norm, bias, heads=3, q_k_size=5, v_size=7)
    ours = _randomize(EncoderLayer(cfg), seed=6).to(dtype)
    src, _, _, memory = _inputs()
    expected = _paper_encoder_layer(memory.double(), ours, padding_mask(src, PAD)[:, 0], pre_norm=norm == "pre")
    out, _ = ours(memory.to(dtype), padding_mask(src, PAD))
    assert _max_diff(out, expected) <= tol
