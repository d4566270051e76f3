"""Hugging Face Marian (OPUS-MT) models: what import and export share (the parameter names,
the settings Marian fixes), and the export of a run as a `MarianMTModel` directory; the import
is `hf_import.py`.

A Marian directory holds config.json, model.safetensors (or pytorch_model.bin), source.spm,
target.spm and vocab.json (target_vocab.json with separate vocabularies). Everything that
makes Marian differ is expressed in the run's config: `model.activation`,
`model.scale_embedding`, `model.position_layout: halves` (sines then cosines),
`model.logits_bias` (final_logits_bias), `model.decoder_start_id` (Marian starts decoding
from pad), shared or separate embeddings (`tokenizer.joint`, `model.tie_embeddings`), and
`tokenizer.vocabulary: file` (pieces map to ids through vocab.json).

Ids: this tool's layout is pad 0, unk 1, eos 3. Import reorders Marian's vocabulary into it
(pad, unk, one ordinary piece, eos, then the others in their order), rows of the embeddings,
output projection and logits bias with it; the run's vocab.json records the new ids.
Export writes the run's own ids, so nothing is reordered back.

Languages: an OPUS-MT multi-target model names its target by a token in front of the source
(`>>es<<`), an entry of vocab.json that MarianTokenizer takes off the front of a source line as
one id. Import reads those entries as the run's `data.target_tokens` (`hf_import.language_tokens`);
a run with several targets exports with its tokens, which are pieces of its SentencePiece model
and so entries of vocab.json, and tokenizer_config.json's target_lang `mul`.

Positions: a model with the interleaved sinusoidal table is exported by permuting every
model dimension (sine dimensions first): LayerNorm, attention and feed-forward layers do not
depend on the order of the dimensions, and the permuted table is Marian's.

transformers itself is not needed for either direction: config.json is read as JSON and the
weights through safetensors (or `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq_cli.convert.output import check_output_dir, replacing_output
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, PAD, UNK
from seq2seq_cli.layout import SOURCE_SPM, SOURCE_VOCAB, TARGET_SPM, TARGET_VOCAB

ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# MarianConfig's defaults, for keys a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024, "encoder_layers": 12,
    "encoder_ffn_dim": 4096, "encoder_attention_heads": 16, "decoder_layers": 12, "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16, "activation_function": "gelu", "d_model": 1024, "dropout": 0.1,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "decoder_start_token_id": 58100, "scale_embedding": False,
    "pad_token_id": 58100, "eos_token_id": 0, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
}
# Fields of older Marian/BART configs that transformers' MarianMTModel does not implement:
# the value it ignores them at is the only one accepted.
FIXED = {
    "normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
    "static_position_embeddings": True, "add_bias_logits": False,
}
# The share of a SentencePiece model's pieces its vocab.json must hold (the rest become unknown).
PIECES_HELD = 0.9
INTS = ("vocab_size", "max_position_embeddings", "encoder_layers", "encoder_ffn_dim", "encoder_attention_heads",
        "decoder_layers", "decoder_ffn_dim", "decoder_attention_heads", "d_model", "decoder_start_token_id",
        "pad_token_id", "eos_token_id")
# Sizes that must be at least 1, and the range of max_position_embeddings accepted (a sentence
# of at least one token with EOS and the start token; a table beyond the upper end is no Marian model).
SIZES = ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
         "decoder_ffn_dim", "encoder_attention_heads", "decoder_attention_heads")
POSITIONS = (3, 65536)
# A multi-target model's language token, as OPUS-MT writes them (>>es<<, >>fra<<, >>cmn_Hans<<)
# and as MarianTokenizer takes one off the front of a source (>>, then a code without spaces, then <<).
LANGUAGE_TOKEN = re.compile(r">>[^\s<>]+<<")


# --------------------------------------------------------------------------- parameter names


def layer_names(encoder_layers: int, decoder_layers: int) -> list[tuple[str, str]]:
    """(our parameter name, Marian's) for every encoder and decoder layer parameter."""
    attn = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
    pairs: list[tuple[str, str]] = []

    def add(ours: str, theirs: str) -> None:
        pairs.extend((f"{ours}.{p}", f"{theirs}.{p}") for p in ("weight", "bias"))

    def add_layer(o: str, t: str, attention: dict[str, str], norms: dict[str, str]) -> None:
        """One layer: its attention projections, the FFN and the LayerNorms (ours -> Marian's)."""
        for ours, theirs in attention.items():
            for a, b in attn.items():
                add(f"{o}.{ours}.{a}", f"{t}.{theirs}.{b}")
        for ours, theirs in {**norms, "ffn.w_1": "fc1", "ffn.w_2": "fc2", "ffn_block.norm": "final_layer_norm"}.items():
            add(f"{o}.{ours}", f"{t}.{theirs}")

    for i in range(encoder_layers):
        add_layer(f"encoder.{i}", f"model.encoder.layers.{i}", {"self_attn": "self_attn"},
                  {"attn_block.norm": "self_attn_layer_norm"})
    for i in range(decoder_layers):
        add_layer(f"decoder.{i}", f"model.decoder.layers.{i}", {"self_attn": "self_attn", "cross_attn": "encoder_attn"},
                  {"self_block.norm": "self_attn_layer_norm", "cross_block.norm": "encoder_attn_layer_norm"})
    return pairs


def export_problems(cfg: Any) -> list[str]:
    """Why a model (its `model` config) cannot be written as a Marian model (empty when it can)."""
    problems = []
    if cfg.norm != "post":
        problems.append("model.norm pre: Marian layers are post-norm")
    if cfg.positions != "sinusoidal":
        problems.append(f"model.positions {cfg.positions}: Marian uses a fixed sinusoidal table")
    if cfg.head_q_k_size != cfg.d_model // cfg.heads or cfg.head_v_size != cfg.d_model // cfg.heads or cfg.d_model % cfg.heads:
        problems.append("model.q_k_size/v_size: Marian heads have d_model / heads query, key and value sizes")
    if cfg.token_types:
        problems.append("model.token_types: Marian has no token-type embeddings")
    return problems


def _permute(state: dict[str, Tensor], order: list[int]) -> dict[str, Tensor]:
    """Every model dimension (size D) of our state dict reordered by `order`."""
    idx = torch.tensor(order)
    out = {}
    for name, t in state.items():
        if name.endswith(("tokens.weight", "output.weight", "w_q.weight", "w_k.weight", "w_v.weight", "w_1.weight")):
            t = t[:, idx]  # (rows, D): inputs of a linear layer, or embedding columns
        elif name.endswith(("w_o.weight", "w_2.weight")):
            t = t[idx]  # (D, cols): outputs of a linear layer
        elif name.endswith(("w_o.bias", "w_2.bias")) or ".norm." in name:
            t = t[idx]
        out[name] = t
    return out


def hf_weights(model: Any) -> dict[str, Tensor]:
    """The model's weights under MarianMTModel's names (float32; zero biases where ours has none)."""
    from seq2seq_cli.model.transformer import halves_order

    cfg = model.cfg
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    if cfg.position_layout == "interleaved":
        state = _permute(state, halves_order(cfg.d_model))
    out: dict[str, Tensor] = {}
    params = dict(model.named_parameters())
    for ours, theirs in layer_names(cfg.encoder_layers, cfg.decoder_layers):
        if ours in state:
            out[theirs] = state[ours]
        else:  # bias: false
            weight = params[ours.removesuffix(".bias") + ".weight"]
            out[theirs] = torch.zeros(weight.size(0))
    src, tgt = state["src_embed.tokens.weight"], state["tgt_embed.tokens.weight"]
    shared = model.src_embed.tokens is model.tgt_embed.tokens
    if shared:
        out["model.shared.weight"] = src
    out["model.encoder.embed_tokens.weight"] = src.clone()
    out["model.decoder.embed_tokens.weight"] = tgt.clone()
    out["lm_head.weight"] = (tgt if model.output is None else state["output.weight"]).clone()
    bias = state.get("logits_bias", torch.zeros(tgt.size(0)))
    out["final_logits_bias"] = bias.reshape(1, -1)
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(model: Any) -> dict[str, Any]:
    """config.json of the exported MarianMTModel."""
    cfg = model.cfg
    shared = model.src_embed.tokens is model.tgt_embed.tokens
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"], "is_encoder_decoder": True,
        "vocab_size": model.src_embed.tokens.num_embeddings, "decoder_vocab_size": model.tgt_embed.tokens.num_embeddings,
        "d_model": cfg.d_model, "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.ffn_size, "decoder_ffn_dim": cfg.ffn_size, "activation_function": cfg.activation,
        "max_position_embeddings": cfg.max_positions, "scale_embedding": cfg.scale_embedding,
        "share_encoder_decoder_embeddings": shared, "tie_word_embeddings": cfg.tie_embeddings,
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout, "activation_dropout": cfg.activation_dropout,
        # no EOS forced at max_length: an output still going ends there as our search ends it
        "pad_token_id": PAD, "eos_token_id": EOS, "forced_eos_token_id": None, "decoder_start_token_id": cfg.decoder_start_id,
    }


def export_hf(model_path: str | Path, output_dir: Path, force: bool = False) -> Path:
    """Write a run (or checkpoint) as a MarianMTModel + MarianTokenizer directory; returns it."""
    from seq2seq_cli.run.checkpoint import resolve_checkpoint
    from seq2seq_cli.run.loaded import load_run, run_config

    problems = export_problems(run_config(model_path).model)
    if problems:
        raise UserError(f"{model_path}: cannot be exported as a Marian model: {'; '.join(problems)}")
    run_dir, ckpt = resolve_checkpoint(model_path)
    check_output_dir(output_dir, force, [ckpt, run_dir], "exported")
    run = load_run(model_path, "cpu")
    with replacing_output(output_dir) as out:  # the old directory stays until the new one is complete
        _write_hf(out, run)
    return output_dir


def _language(codes: list[str]) -> str:
    """MarianTokenizer's source_lang or target_lang: the one language, or OPUS-MT's `mul` for several
    (a multi-target model names its targets by the `>>xx<<` tokens of its vocabulary)."""
    distinct = list(dict.fromkeys(codes))
    return distinct[0] if len(distinct) == 1 else "mul"


def _write_hf(output_dir: Path, run: Any) -> None:
    """The files of `export_hf` written into `output_dir`."""
    from safetensors.torch import save_file

    from seq2seq_cli.run.checkpoint import atomic_write, atomic_write_text

    model, config = run.model, run.config
    joint, vocabulary = config.tokenizer.joint, config.tokenizer.vocabulary
    src_tok, tgt_tok = run.src_sp, run.tgt_sp
    if vocabulary == "file":
        spm_files = list(run.layout.vocab_spm())
    else:
        spm_files = list(run.layout.spm_models(joint))
    for given, name in zip(spm_files, (SOURCE_SPM, TARGET_SPM)):
        shutil.copyfile(given, output_dir / name)

    def vocab(tok: Any) -> str:
        return json.dumps({tok.id_to_piece(i): i for i in range(tok.get_piece_size())}, ensure_ascii=False, indent=0)

    atomic_write_text(output_dir / SOURCE_VOCAB, vocab(src_tok))
    separate = not joint
    if separate:
        atomic_write_text(output_dir / TARGET_VOCAB, vocab(tgt_tok))
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer", "separate_vocabs": separate, "model_max_length": model.cfg.max_positions,
        "eos_token": tgt_tok.id_to_piece(EOS), "unk_token": tgt_tok.id_to_piece(UNK), "pad_token": tgt_tok.id_to_piece(PAD),
        "source_lang": _language([s for s, _ in config.data.pairs]), "target_lang": _language(config.data.targets),
    }
    atomic_write_text(output_dir / "tokenizer_config.json", json.dumps(tokenizer_config, indent=1))
    atomic_write_text(output_dir / "config.json", json.dumps(hf_config(model), indent=1))
    weights = hf_weights(model)
    atomic_write(output_dir / "model.safetensors", lambda tmp: save_file(weights, tmp, metadata={"format": "pt"}))
