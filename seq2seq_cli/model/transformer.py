"""Encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al. 2017).

Shape legend
    B   batch (sentences, or sentences x beams while decoding)
    S   source length            T   target length (queries)     L   cached target length
    D   d_model                  H   heads
    Dk  per-head query/key size (q_k_size)                       Dv  per-head value size (v_size)
    F   feed-forward size        V   vocabulary size

Attention is in `seq2seq_cli/model/attention.py`. Incremental decoding keeps its
keys/values in `seq2seq_cli/model/kv_cache.py` (`DecoderState`, one `LayerCache` per decoder layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq_cli.config import ModelConfig
from seq2seq_cli.ids import PAD
from seq2seq_cli.model.attention import MultiHeadAttention
from seq2seq_cli.model.dropout import Dropout, dropout
from seq2seq_cli.model.kv_cache import DecoderState, LayerCache
from seq2seq_cli.model.masks import decoder_self_mask, padding_mask

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, act = ReLU (the paper's max(0, .)), swish or GELU."""

    def __init__(self, d_model: int, ffn_size: int, activation_dropout: float, bias: bool, activation: str = "relu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, ffn_size, bias=bias)
        self.w_2 = nn.Linear(ffn_size, d_model, bias=bias)
        self.activation_dropout = activation_dropout
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        h = dropout(self.act(self.w_1(x)), self.activation_dropout, self.training)  # (B, T, F)
        return self.w_2(h)


class Sublayer(nn.Module):
    """Residual connection with LayerNorm: post-norm LN(x + f(x)) or pre-norm x + f(LN(x))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def input(self, x: Tensor) -> Tensor:
        """What the sublayer function sees."""
        return self.norm(x) if self.pre_norm else x

    def output(self, x: Tensor, fx: Tensor) -> Tensor:
        """Combine the residual stream x with the sublayer result f(x)."""
        y = x + self.dropout(fx)
        return y if self.pre_norm else self.norm(y)


def _attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model, cfg.heads, cfg.head_q_k_size, cfg.head_v_size, cfg.attention_dropout, cfg.bias
    )


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = _attention(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_size, cfg.activation_dropout, cfg.bias, cfg.activation)
        self.attn_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, S, D), mask: (B, 1, 1, S) -> (B, S, D), weights (B, H, S, S) or None."""
        h = self.attn_block.input(x)
        a, weights = self.self_attn(h, *self.self_attn.keys_values(h), mask, need_weights)
        x = self.attn_block.output(x, a)
        x = self.ffn_block.output(x, self.ffn(self.ffn_block.input(x)))
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = _attention(cfg)
        self.cross_attn = _attention(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_size, cfg.activation_dropout, cfg.bias, cfg.activation)
        self.self_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.cross_block = Sublayer(cfg.d_model, cfg.dropout, pre)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None,
        cache: LayerCache,
        src_mask: Tensor,
        incremental: bool,
        need_weights: bool = False,
        need_self_weights: bool = False,
        group: int = 1,
        causal: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x: (B, T, D) -> (B, T, D), self-attention weights (B, H, T, L) or None,
        cross-attention weights (B, H, T, S) or None.

        With `incremental`, x holds only the new positions and their keys/values are appended
        to the cache (L = cached + new positions); otherwise self-attention runs over x alone
        under `self_mask` (B, 1, T, T) and L = T. `need_weights` asks for the cross-attention
        weights, `need_self_weights` for the self-attention ones; each switches only its own
        attention to the explicit path. With `group` > 1 (beams sharing their sentence's
        source keys), cross-attention weights come as (B / group, H, group * T, S). `causal`
        (self_mask None): self-attention by position alone, for right-padded rows.
        """
        h = self.self_block.input(x)
        k, v = self.self_attn.keys_values(h)  # (B, H, T, Dk), (B, H, T, Dv)
        if incremental:
            k, v = cache.append(k, v)  # (B, H, L+T, Dk), (B, H, L+T, Dv)
        a, self_weights = self.self_attn(h, k, v, self_mask, need_self_weights, causal)
        x = self.self_block.output(x, a)
        h = self.cross_block.input(x)
        if group > 1:  # the `group` rows of a sentence query its one copy of the source keys
            h = h.reshape(-1, group * h.size(1), h.size(2))  # (B, group*T, D)
        c, cross_weights = self.cross_attn(h, cache.cross_k, cache.cross_v, src_mask, need_weights)
        x = self.cross_block.output(x, c.reshape(x.shape))
        x = self.ffn_block.output(x, self.ffn(self.ffn_block.input(x)))
        return x, self_weights, cross_weights


def halves_order(d_model: int) -> list[int]:
    """The dimensions of the interleaved table in the order of the halves layout: even
    (sine) dimensions first, then odd (cosine) ones. Permuting every model dimension this
    way turns a model of one layout into an equal model of the other."""
    return list(range(0, d_model, 2)) + list(range(1, d_model, 2))


def sinusoidal_table(length: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """interleaved: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D));
    halves (Marian): the same sines in the first ceil(D/2) dimensions, the cosines after them
    -> (length, D)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos / div)
    table[:, 1::2] = torch.cos(pos / div)[:, : d_model // 2]
    if layout == "halves":
        table = table[:, halves_order(d_model)]
    return table.float()


class Embedding(nn.Module):
    """Token embedding (x sqrt(D) with scale_embedding) + positional encoding, then dropout."""

    table: Tensor  # the sinusoidal position buffer (absent with learned positions)

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig, token_types: int = 0) -> None:
        super().__init__()
        self.tokens = tokens
        # Segment embeddings (BERT's token types); every token is type 0 unless `types` is given.
        self.types = nn.Embedding(token_types, cfg.d_model) if token_types else None
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.learned = cfg.positions == "learned"
        if self.learned:
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:
            self.register_buffer(
                "table", sinusoidal_table(cfg.max_positions, cfg.d_model, cfg.position_layout), persistent=False
            )
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start: int = 0, types: Tensor | None = None) -> Tensor:
        """ids: (B, T) at positions start..start+T-1, types: (B, T) segment ids or None -> (B, T, D)."""
        T = ids.size(1)
        pos = self.positions.weight[start : start + T] if self.learned else self.table[start : start + T]
        x = self.tokens(ids) * self.scale + pos  # (B, T, D)
        if self.types is not None:
            x = x + (self.types.weight[0] if types is None else self.types(types))
        return self.dropout(x)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer with tied embeddings and incremental decoding."""

    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool) -> None:
        super().__init__()
        self.cfg = cfg
        tgt_tokens = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=PAD)
        share_src = joint_vocab and cfg.tie_embeddings and src_vocab == tgt_vocab
        src_tokens = tgt_tokens if share_src else nn.Embedding(src_vocab, cfg.d_model, padding_idx=PAD)
        self.src_embed = Embedding(src_tokens, cfg, cfg.token_types)
        self.tgt_embed = Embedding(tgt_tokens, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        # Decoding copies only (`decode.shortlist`): source ids (B, S) -> the target ids (C,) a
        # search of them scores and which of them each sentence may produce (B, C) bool
        # (`limit_vocabulary`); None: the whole vocabulary.
        self.candidates: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None
        # A fixed (not trained) bias on the logits, as Marian's final_logits_bias; zero unless loaded.
        self.logits_bias: Tensor | None
        if cfg.logits_bias:
            self.register_buffer("logits_bias", torch.zeros(tgt_vocab))
        else:
            self.logits_bias = None
        self._init_weights()

    def encoder_layers(self) -> list[EncoderLayer]:
        """The encoder's layers as `EncoderLayer`s (iterating a ModuleList gives plain Modules)."""
        return [cast(EncoderLayer, layer) for layer in self.encoder]

    def decoder_layers(self) -> list[DecoderLayer]:
        """The decoder's layers as `DecoderLayer`s (iterating a ModuleList gives plain Modules)."""
        return [cast(DecoderLayer, layer) for layer in self.decoder]

    def _init_weights(self) -> None:
        """`init: normal`: every matrix and token embedding N(0, init_std); `init: xavier`:
        Xavier-uniform matrices and N(0, D^-0.5) token embeddings. Biases start at 0, LayerNorms
        at (1, 0), token-type embeddings at 0 and the padding row of each embedding at 0."""
        normal = self.cfg.init == "normal"
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed.tokens" not in name and "positions" not in name and "embed.types" not in name:
                if normal:
                    nn.init.normal_(p, 0.0, self.cfg.init_std)
                else:
                    nn.init.xavier_uniform_(p)
            elif name.endswith(".bias") and "norm" not in name:
                nn.init.zeros_(p)
        if self.src_embed.types is not None:
            nn.init.zeros_(self.src_embed.types.weight)  # types start neutral and learn their differences
        for emb in {self.src_embed.tokens, self.tgt_embed.tokens}:
            nn.init.normal_(emb.weight, 0.0, self.cfg.init_std if normal else self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list[Tensor]]:
        """src: (B, S) ids -> memory (B, S, D), src_mask (B, 1, 1, S), per-layer self-attention weights."""
        mask = padding_mask(src, PAD)
        x = self.src_embed(src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights)
            if w is not None:
                weights.append(w)
        return self.encoder_norm(x), mask, weights

    def init_state(self, memory: Tensor, src_mask: Tensor, group: int = 1) -> DecoderState:
        """Compute every layer's cross-attention keys/values once from the encoder output.

        memory: (B, S, D), src_mask: (B, 1, 1, S); `group` decoder rows will share each
        sentence's keys/values (beam search), so the decoder batch is B * group.
        """
        layers = [LayerCache(*layer.cross_attn.keys_values(memory)) for layer in self.decoder_layers()]
        return DecoderState(layers, src_mask, group=group)

    def logits(self, h: Tensor) -> Tensor:
        """h: (..., D) -> (..., V)."""
        logits = F.linear(h, self.tgt_embed.tokens.weight) if self.output is None else self.output(h)
        return logits if self.logits_bias is None else logits + self.logits_bias

    def limit_vocabulary(self, state: DecoderState, vocab: Tensor, allowed: Tensor | None = None) -> None:
        """Let `state`'s steps score only the target ids `vocab` (C,) (`shortlist_logits`), each
        sentence only those of them `allowed` (B, C) bool gives it (None: all)."""
        tied = self.cfg.tie_embeddings
        # a decoding copy's output layer keeps its plain weight beside its packed one
        weight = self.tgt_embed.tokens.weight if tied else cast(Tensor, self.output.weight)  # type: ignore[union-attr]
        state.vocab = vocab
        state.vocab_mask = None if allowed is None or bool(allowed.all()) else \
            torch.zeros(allowed.shape, device=vocab.device).masked_fill_(~allowed.to(vocab.device), float("-inf"))
        state.vocab_weight = weight.index_select(0, vocab)  # (C, D)
        state.vocab_bias = None if self.logits_bias is None else self.logits_bias.index_select(0, vocab)

    def shortlist_logits(self, h: Tensor, state: DecoderState) -> Tensor:
        """h: (N, D) -> (N, C): the logits of the target ids `state.vocab` only."""
        assert state.vocab_weight is not None
        return F.linear(h, state.vocab_weight, state.vocab_bias)

    def decode(
        self, tgt_in: Tensor, state: DecoderState, incremental: bool = False, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """Decoder features for target ids.

        tgt_in: (B, T). Without `incremental`, T is the whole prefix (padding and causal masks);
        with it, tgt_in holds the next position(s) only and the self-attention cache grows.
        -> hidden (B, T, D), per-layer cross-attention weights (B, H, T, S) when asked for.
        """
        h, _, cross = self._decode(tgt_in, state, incremental, need_weights, need_self_weights=False)
        return h, cross

    def decode_with_weights(
        self, tgt_in: Tensor, state: DecoderState, incremental: bool = False
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """`decode` that also returns every attention map of the decoder.

        -> hidden (B, T, D), per-layer self-attention weights (B, H, T, L), per-layer
        cross-attention weights (B, H, T, S); L = T, or cached + new positions when incremental.
        """
        return self._decode(tgt_in, state, incremental, need_weights=True, need_self_weights=True)

    def _decode(
        self, tgt_in: Tensor, state: DecoderState, incremental: bool, need_weights: bool, need_self_weights: bool
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        start = state.length if incremental else 0
        x = self.tgt_embed(tgt_in, start)
        # A whole right-padded target (training, validation, forced decoding): causal attention alone.
        # A real position's keys are all real (padding comes after them), so the padding mask would
        # change only the padding positions' outputs, which nothing reads; without a mask tensor the
        # fused kernels skip the masked half (a GPU's flash kernel applies). The explicit path for
        # self-attention weights keeps the full padding AND causal mask.
        causal = not incremental and not need_self_weights
        self_mask = None if causal or (incremental and tgt_in.size(1) == 1) else decoder_self_mask(tgt_in, PAD)
        if self_mask is not None and self.cfg.decoder_start_id == PAD:
            self_mask[..., 0] = True  # position 0 holds the start token (pad's id), not padding
        if incremental and tgt_in.size(1) > 1 and state.length:
            raise ValueError("incremental decoding of several positions needs an empty cache")
        self_weights, cross_weights = [], []
        for layer, cache in zip(self.decoder, state.layers):
            x, s, c = layer(x, self_mask, cache, state.src_mask, incremental, need_weights, need_self_weights, state.group,
                            causal)
            if s is not None:
                self_weights.append(s)
            if c is not None:
                cross_weights.append(c)
        if incremental:
            state.length += tgt_in.size(1)
        return self.decoder_norm(x), self_weights, cross_weights

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
        """Every attention map of a teacher-forced pass, through the explicit attention path.

        src: (B, S), tgt_in: (B, T) -> {"encoder": per layer (B, H, S, S),
        "decoder": per layer (B, H, T, T), "cross": per layer (B, H, T, S)}.
        Masked positions (padding, future) have weight exactly 0; each row sums to 1.
        """
        memory, src_mask, encoder = self.encode(src, need_weights=True)
        _, decoder, cross = self.decode_with_weights(tgt_in, self.init_state(memory, src_mask))
        return {"encoder": encoder, "decoder": decoder, "cross": cross}

    def forward(self, src: Tensor, tgt_in: Tensor, rows: Tensor | None = None) -> Tensor:
        """src: (B, S), tgt_in: (B, T) -> logits (B, T, V); with `rows` (N,), the flat positions
        (in B*T) that have a target, logits (N, V) of those N positions only: the output layer
        and the loss skip the padding. (An index, not a mask: it selects without a host sync.)"""
        h = self.features(src, tgt_in)
        return self.logits(h if rows is None else h.flatten(0, 1).index_select(0, rows))

    def features(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src: (B, S), tgt_in: (B, T) -> final decoder hidden states (B, T, D)."""
        memory, src_mask, _ = self.encode(src)
        h, _ = self.decode(tgt_in, self.init_state(memory, src_mask))
        return h


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint_vocab: bool) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(cfg, src_vocab, tgt_vocab, joint_vocab)
