"""Model accounting: parameters per part, analytic FLOPs and the memory weights and Adam need.

Parameters are counted from the model's own tensors, part by part, so the table's total is
`sum(p.numel() for p in model.parameters())`: a tensor shared by several parts (tied
embeddings) has one row whose note names its users, and a tied output projection is a row
of 0 that says what it is tied with.

FLOPs count matrix multiplications only, one multiply-add = 2 FLOPs; biases, LayerNorm,
softmax, ReLU, masking and embedding lookups are left out (they are O(tokens * D), not
O(tokens * D^2)). For S source and T target tokens, with D = d_model, H heads, Dk = q_k_size,
Dv = v_size, F = ffn_size, V = target vocabulary, N_enc / N_dec layers:

    linear(n, a, b)    = 2 n a b                    n rows through an a -> b matrix
    attention(q, k)    = 2 q k H (Dk + Dv)          Q K^T and weights x V
    projections(n)     = linear(n, D, 2 H Dk + H Dv) + linear(n, H Dv, D)       W_Q, W_K, W_V, W_O
    ffn(n)             = linear(n, D, F) + linear(n, F, D)
    encoder(S)         = N_enc [projections(S) + attention(S, S) + ffn(S)]
    cross_kv(S)        = N_dec linear(S, D, H Dk + H Dv)                        once per sentence
    decoder(S, T, L)   = N_dec [projections(T) + attention(T, L)                self-attention
                                + linear(T, D, H Dk) + linear(T, H Dv, D) + attention(T, S)  cross
                                + ffn(T)] + linear(T, D, V)                     output projection
    forward(S, T)      = encoder(S) + cross_kv(S) + decoder(S, T, T)
    training(S, T)     = 3 forward(S, T)    the backward pass multiplies twice per forward product
    decoding step(S, L) = decoder(S, 1, L)  one new token over L self-attention keys (the new
                                            one included), per beam hypothesis; cross-attention
                                            keys/values come from cross_kv

Attention is counted over the full T x T / T x S score matrices, masked positions included,
as the kernels compute them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from seq2seq_cli.config import Config, ModelConfig
from seq2seq_cli.model.attention import MultiHeadAttention
from seq2seq_cli.model.transformer import FeedForward, Seq2SeqTransformer, build_model


@dataclass(frozen=True)
class Row:
    """One part of the model: a dotted path (e.g. encoder.0.self_attn.W_Q), its parameter count
    and a note (what it shares, or why it counts 0)."""

    part: str
    count: int
    note: str = ""


@dataclass(frozen=True)
class ParameterTable:
    rows: list[Row]
    tied: list[str]  # one line per sharing, e.g. "output projection = target token embeddings"

    @property
    def total(self) -> int:
        return sum(r.count for r in self.rows)

    def subtotal(self, prefix: str) -> int:
        """Parameters of the rows at or below the dotted path `prefix` (e.g. "encoder.3.ffn")."""
        return sum(r.count for r in self.rows if r.part == prefix or r.part.startswith(prefix + "."))


@dataclass(frozen=True)
class FlopEstimate:
    src_len: int
    tgt_len: int
    forward: int  # one sentence pair of src_len + tgt_len tokens
    decode_step: int  # one generated token with tgt_len cached self-attention keys, src_len source tokens
    cross_kv: int  # once per sentence when decoding: every decoder layer's cross-attention K and V

    @property
    def training(self) -> int:
        return 3 * self.forward

    @property
    def forward_per_target_token(self) -> float:
        return self.forward / self.tgt_len

    @property
    def training_per_target_token(self) -> float:
        return self.training / self.tgt_len


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes for parameters and optimizer state; activations are not included."""

    parameters: int
    FP32: ClassVar[int] = 4
    BF16: ClassVar[int] = 2
    ADAM_MOMENTS: ClassVar[int] = 2  # exp_avg and exp_avg_sq, each the size of the parameter, in fp32

    @property
    def weights_fp32(self) -> int:
        return self.FP32 * self.parameters

    @property
    def weights_bf16(self) -> int:
        return self.BF16 * self.parameters

    @property
    def gradients_fp32(self) -> int:
        return self.FP32 * self.parameters

    @property
    def adam_state(self) -> int:
        return self.ADAM_MOMENTS * self.FP32 * self.parameters

    @property
    def training(self) -> int:
        """fp32 weights + fp32 gradients + Adam moments (bf16 autocast keeps fp32 weights)."""
        return self.weights_fp32 + self.gradients_fp32 + self.adam_state


# --------------------------------------------------------------------------- parameters


def model_from_config(config: Config) -> Seq2SeqTransformer:
    """The model a config describes, with tokenizer.vocab_size tokens per vocabulary, built on
    the meta device: every shape, no memory and no initialisation cost."""
    vocab = config.tokenizer.vocab_size
    with torch.device("meta"):
        return build_model(config.model, vocab, vocab, config.tokenizer.joint)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _linear_rows(prefix: str, layer: nn.Linear, weight: str, bias: str) -> list[Row]:
    rows = [Row(f"{prefix}.{weight}", layer.weight.numel())]
    if layer.bias is not None:
        rows.append(Row(f"{prefix}.{bias}", layer.bias.numel()))
    return rows


def _attention_rows(prefix: str, attn: MultiHeadAttention) -> list[Row]:
    rows = []
    for name, layer in (("Q", attn.w_q), ("K", attn.w_k), ("V", attn.w_v), ("O", attn.w_o)):
        rows += _linear_rows(prefix, layer, f"W_{name}", f"b_{name}")
    return rows


def _ffn_rows(prefix: str, ffn: FeedForward) -> list[Row]:
    return _linear_rows(prefix, ffn.w_1, "W_1", "b_1") + _linear_rows(prefix, ffn.w_2, "W_2", "b_2")


def _embedding_rows(model: Seq2SeqTransformer) -> tuple[list[Row], list[str]]:
    src, tgt = model.src_embed.tokens, model.tgt_embed.tokens
    output_tied = model.output is None
    rows, tied = [], []
    if src is tgt:
        users = "source, target" + (", output projection" if output_tied else "")
        rows.append(Row("embeddings.tokens", tgt.weight.numel(), f"shared: {users}"))
        tied.append("source token embeddings = target token embeddings")
    else:
        rows.append(Row("embeddings.source_tokens", src.weight.numel()))
        note = "shared with the output projection" if output_tied else ""
        rows.append(Row("embeddings.target_tokens", tgt.weight.numel(), note))
    if output_tied:
        tied.append("output projection = target token embeddings")
    if model.src_embed.learned:
        rows.append(Row("embeddings.source_positions", model.src_embed.positions.weight.numel(), "learned"))
        rows.append(Row("embeddings.target_positions", model.tgt_embed.positions.weight.numel(), "learned"))
    else:
        rows.append(Row("embeddings.positions", 0, "sinusoidal table, not trained"))
    if model.src_embed.types is not None:
        rows.append(Row("embeddings.source_token_types", model.src_embed.types.weight.numel(), "learned segment embeddings"))
    return rows, tied


def parameter_table(model: Seq2SeqTransformer) -> ParameterTable:
    """Parameters per part, in model order; the total equals the model's parameter count."""
    rows, tied = _embedding_rows(model)
    for i, enc_layer in enumerate(model.encoder_layers()):
        p = f"encoder.{i}"
        rows += _attention_rows(f"{p}.self_attn", enc_layer.self_attn) + _ffn_rows(f"{p}.ffn", enc_layer.ffn)
        rows += [
            Row(f"{p}.norm.self_attn", _numel(enc_layer.attn_block.norm)),
            Row(f"{p}.norm.ffn", _numel(enc_layer.ffn_block.norm)),
        ]
    for i, layer in enumerate(model.decoder_layers()):
        p = f"decoder.{i}"
        rows += _attention_rows(f"{p}.self_attn", layer.self_attn) + _attention_rows(f"{p}.cross_attn", layer.cross_attn)
        rows += _ffn_rows(f"{p}.ffn", layer.ffn)
        rows += [
            Row(f"{p}.norm.self_attn", _numel(layer.self_block.norm)),
            Row(f"{p}.norm.cross_attn", _numel(layer.cross_block.norm)),
            Row(f"{p}.norm.ffn", _numel(layer.ffn_block.norm)),
        ]
    for name, norm in (("encoder.final_norm", model.encoder_norm), ("decoder.final_norm", model.decoder_norm)):
        if isinstance(norm, nn.LayerNorm):
            rows.append(Row(name, _numel(norm), "pre-norm"))
    if model.output is None:
        rows.append(Row("output", 0, "tied with the target token embeddings"))
    else:
        rows.append(Row("output", model.output.weight.numel()))
    return ParameterTable(rows, tied)


# --------------------------------------------------------------------------- FLOPs


def _linear(n: int, fan_in: int, fan_out: int) -> int:
    return 2 * n * fan_in * fan_out


def _attention(cfg: ModelConfig, queries: int, keys: int) -> int:
    return 2 * queries * keys * cfg.heads * (cfg.head_q_k_size + cfg.head_v_size)


def _projections(cfg: ModelConfig, n: int) -> int:
    hk, hv = cfg.heads * cfg.head_q_k_size, cfg.heads * cfg.head_v_size
    return _linear(n, cfg.d_model, 2 * hk + hv) + _linear(n, hv, cfg.d_model)


def _ffn(cfg: ModelConfig, n: int) -> int:
    return _linear(n, cfg.d_model, cfg.ffn_size) + _linear(n, cfg.ffn_size, cfg.d_model)


def encoder_flops(cfg: ModelConfig, src_len: int) -> int:
    return cfg.encoder_layers * (_projections(cfg, src_len) + _attention(cfg, src_len, src_len) + _ffn(cfg, src_len))


def cross_kv_flops(cfg: ModelConfig, src_len: int) -> int:
    hk, hv = cfg.heads * cfg.head_q_k_size, cfg.heads * cfg.head_v_size
    return cfg.decoder_layers * _linear(src_len, cfg.d_model, hk + hv)


def decoder_flops(cfg: ModelConfig, tgt_vocab: int, src_len: int, queries: int, self_keys: int) -> int:
    """`queries` target positions attending to `self_keys` target keys and `src_len` source keys."""
    hk, hv = cfg.heads * cfg.head_q_k_size, cfg.heads * cfg.head_v_size
    self_attn = _projections(cfg, queries) + _attention(cfg, queries, self_keys)
    cross = _linear(queries, cfg.d_model, hk) + _linear(queries, hv, cfg.d_model) + _attention(cfg, queries, src_len)
    per_layer = self_attn + cross + _ffn(cfg, queries)
    return cfg.decoder_layers * per_layer + _linear(queries, cfg.d_model, tgt_vocab)


def flop_estimate(cfg: ModelConfig, tgt_vocab: int, src_len: int, tgt_len: int) -> FlopEstimate:
    forward = (
        encoder_flops(cfg, src_len) + cross_kv_flops(cfg, src_len) + decoder_flops(cfg, tgt_vocab, src_len, tgt_len, tgt_len)
    )
    step = decoder_flops(cfg, tgt_vocab, src_len, 1, tgt_len)
    return FlopEstimate(src_len, tgt_len, forward, step, cross_kv_flops(cfg, src_len))


# --------------------------------------------------------------------------- report


def _fmt(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} "


def _bytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _grouped(rows: list[Row]) -> list[Row]:
    """The rows of one sublayer (encoder.0.self_attn.W_Q, .b_Q, ...; encoder.0.norm.*) merged
    into one row whose note lists them; other rows unchanged."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        parts = r.part.split(".")
        groups.setdefault(".".join(parts[:3]) if len(parts) == 4 else r.part, []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) == 1 and members[0].part == key:
            out.append(members[0])
        else:
            note = ", ".join(f"{m.part.rsplit('.', 1)[1]} {m.count:,}" for m in members)
            out.append(Row(key, sum(m.count for m in members), note))
    return out


def describe(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> str:
    vocab = f"vocabulary {tgt_vocab:,}" if src_vocab == tgt_vocab else f"vocabularies {src_vocab:,} -> {tgt_vocab:,}"
    return (
        f"d_model {cfg.d_model}, {cfg.heads} heads (q/k {cfg.head_q_k_size}, v {cfg.head_v_size}), "
        f"FFN {cfg.ffn_size}, {cfg.encoder_layers}+{cfg.decoder_layers} layers, {cfg.norm}-norm, "
        f"{cfg.positions} positions, bias {'on' if cfg.bias else 'off'}, {vocab}"
    )


def info_report(model: Seq2SeqTransformer, src_len: int, tgt_len: int) -> str:
    """The text `seq2seq info` prints: parameter table, FLOPs and memory."""
    cfg = model.cfg
    src_vocab, tgt_vocab = model.src_embed.tokens.num_embeddings, model.tgt_embed.tokens.num_embeddings
    table = parameter_table(model)
    flops = flop_estimate(cfg, tgt_vocab, src_len, tgt_len)
    memory = MemoryEstimate(table.total)
    lines = [f"model: {describe(cfg, src_vocab, tgt_vocab)}"]
    lines += [f"tied: {t}" for t in table.tied] or ["tied: nothing"]
    lines += ["", f"{'part':<28} {'parameters':>12}  detail"]
    lines += [f"{r.part:<28} {r.count:>12,}  {r.note}".rstrip() for r in _grouped(table.rows)]
    summary = [
        ("embeddings", table.subtotal("embeddings")),
        (f"encoder ({cfg.encoder_layers} layers)", table.subtotal("encoder")),
        (f"decoder ({cfg.decoder_layers} layers)", table.subtotal("decoder")),
        ("output projection", table.subtotal("output")),
        ("total", table.total),
    ]
    lines += [""] + [f"{name:<28} {count:>12,}" for name, count in summary]
    lines += ["", f"FLOPs (analytic, matrix products only, multiply-add = 2; S={src_len} source, T={tgt_len} target tokens)"]
    lines += [
        f"  {label:<42} {value}"
        for label, value in (
            ("forward, per sentence pair", f"{_fmt(flops.forward)}FLOP"),
            ("forward, per target token", f"{_fmt(flops.forward_per_target_token)}FLOP"),
            ("training (3 x forward), per target token", f"{_fmt(flops.training_per_target_token)}FLOP"),
            ("decoding, per generated token and beam", f"{_fmt(flops.decode_step)}FLOP (KV cache of {tgt_len})"),
            ("decoding, once per sentence", f"{_fmt(flops.cross_kv)}FLOP (cross-attention keys/values)"),
        )
    ]
    lines += ["", "memory (activations not included)"]
    lines += [
        f"  {label:<42} {_bytes(value)}"
        for label, value in (
            ("weights fp32", memory.weights_fp32),
            ("weights bf16", memory.weights_bf16),
            ("gradients fp32", memory.gradients_fp32),
            ("Adam state (2 fp32 moments)", memory.adam_state),
            ("training (fp32 weights + gradients + Adam)", memory.training),
        )
    ]
    return "\n".join(lines)
