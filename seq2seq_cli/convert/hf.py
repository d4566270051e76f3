"""Hugging Face Marian (OPUS-MT) models: import a local `MarianMTModel` directory into a run
directory, and export a run as one.

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

Positions: a model with the interleaved sinusoidal table is exported by permuting every
model dimension (sine dimensions first): LayerNorm, attention and feed-forward layers do not
depend on the order of the dimensions, and the permuted table is Marian's.

transformers itself is not needed for either direction: config.json is read as JSON and the
weights through safetensors (or `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq_cli.convert.output import check_output_dir, replacing_output
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, PAD, UNK
from seq2seq_cli.layout import SOURCE_SPM, SOURCE_VOCAB, TARGET_SPM, TARGET_VOCAB, RunLayout

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


# --------------------------------------------------------------------------- import


def _marian_config(src_dir: Path) -> dict[str, Any]:
    path = src_dir / "config.json"
    if not src_dir.is_dir():
        raise UserError(f"{src_dir}: not found (expected a directory written by MarianMTModel.save_pretrained)")
    if not path.is_file():
        raise UserError(f"{src_dir}: not a Marian model directory (no config.json)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "marian":
        got = raw.get("model_type") if isinstance(raw, dict) else None
        raise UserError(f"{path}: model_type {got!r}, expected 'marian' (a MarianMTModel directory)")
    cfg = {**DEFAULTS, **raw}
    if cfg["decoder_vocab_size"] is None:
        cfg["decoder_vocab_size"] = cfg["vocab_size"]
    for key in (*INTS, "decoder_vocab_size"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool):
            raise UserError(f"{path}: {key} {cfg[key]!r} is not supported (expected one integer)")
    for key in SIZES:
        if cfg[key] < 1:
            raise UserError(f"{path}: {key} {cfg[key]} is not supported (expected a positive integer)")
    lo, hi = POSITIONS
    if not lo <= cfg["max_position_embeddings"] <= hi:
        raise UserError(f"{path}: max_position_embeddings {cfg['max_position_embeddings']} is out of range "
                        f"(expected {lo} to {hi})")
    for key, value in FIXED.items():
        if key in raw and raw[key] != value:
            raise UserError(f"{path}: {key} {raw[key]!r} is not supported (transformers' Marian model uses {value!r})")
    if raw.get("scale_attention") not in (None, False):
        raise UserError(f"{path}: scale_attention {raw['scale_attention']!r} is not supported")
    if not isinstance(cfg["activation_function"], str) or cfg["activation_function"] not in ACTIVATIONS:
        raise UserError(
            f"{path}: activation_function {cfg['activation_function']!r} is not supported "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )
    for enc, dec in (("encoder_ffn_dim", "decoder_ffn_dim"), ("encoder_attention_heads", "decoder_attention_heads")):
        if cfg[enc] != cfg[dec]:
            raise UserError(f"{path}: {dec} {cfg[dec]} differs from {enc} {cfg[enc]}; only equal sizes are supported")
    if cfg["d_model"] % cfg["encoder_attention_heads"]:
        raise UserError(f"{path}: d_model {cfg['d_model']} is not divisible by encoder_attention_heads "
                        f"{cfg['encoder_attention_heads']}")
    shared = cfg["share_encoder_decoder_embeddings"]
    if shared and cfg["decoder_vocab_size"] != cfg["vocab_size"]:
        raise UserError(f"{path}: decoder_vocab_size {cfg['decoder_vocab_size']} differs from vocab_size with shared embeddings")
    if shared and not cfg["tie_word_embeddings"]:
        raise UserError(
            f"{path}: tie_word_embeddings false with share_encoder_decoder_embeddings true is not supported "
            "(shared embeddings are also the output projection here)"
        )
    return cfg


def _vocab_order(vocab: dict[str, int], size: int, pad: int, eos: int, unk_piece: str, path: Path) -> list[int]:
    """Marian ids in this tool's id order: order[our id] = Marian id."""
    if sorted(vocab.values()) != list(range(size)):
        raise UserError(f"{path}: {len(vocab)} entries for ids 0..{size - 1}; expected each id of the model's "
                        f"vocabulary ({size}, config.json) exactly once")
    if unk_piece not in vocab:
        raise UserError(f"{path}: no entry for the unknown token {unk_piece!r}")
    unk = vocab[unk_piece]
    for name, i in (("pad_token_id", pad), ("eos_token_id", eos)):
        if not 0 <= i < size:
            raise UserError(f"{path}: config.json {name} {i} is outside the vocabulary (0..{size - 1})")
    if len({pad, unk, eos}) < 3 or size < 4:
        raise UserError(f"{path}: pad, unk and eos must be three different ids in a vocabulary of at least 4")
    others = [i for i in range(size) if i not in (pad, unk, eos)]
    order = [pad, unk, others[0], eos, *others[1:]]
    assert order[PAD] == pad and order[UNK] == unk and order[EOS] == eos
    return order


def _check_pieces(spm_path: Path, vocab: dict[str, int], vocab_path: Path) -> None:
    """Refuse a vocabulary file that lacks more than a few of the SentencePiece model's pieces:
    every piece it lacks would be encoded (and decoded) as the unknown token."""
    import sentencepiece as spm

    try:
        sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    except (RuntimeError, OSError) as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{spm_path}: not a SentencePiece model ({detail})") from None
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))]
    held = sum(piece in vocab for piece in pieces)
    if held < PIECES_HELD * len(pieces):
        raise UserError(f"{vocab_path}: holds {held} of the {len(pieces)} pieces of {spm_path.name}; it is not the "
                        f"vocabulary of this SentencePiece model (each piece it lacks would become <unk>)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def _marian_weights(src_dir: Path) -> dict[str, Tensor]:
    st, pt = src_dir / "model.safetensors", src_dir / "pytorch_model.bin"
    if st.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(st))
        except (SafetensorError, OSError) as exc:
            raise UserError(f"{st}: not a readable safetensors file ({exc})") from None
    if pt.is_file():
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means the file cannot be trusted
            raise UserError(f"{pt}: weights could not be loaded safely ({str(exc).splitlines()[0]})") from None
    raise UserError(f"{src_dir}: no model.safetensors or pytorch_model.bin")


def import_marian(src_dir: str | Path, run_dir: str | Path, src_lang: str = "src", tgt_lang: str = "tgt",
                  force: bool = False) -> Path:
    """Convert a local Marian directory into a run directory (config.yaml, source.spm,
    target.spm, vocab.json, checkpoints/best and last); returns the run directory."""
    from seq2seq_cli.config_load import save_config, validate_config
    from seq2seq_cli.model.transformer import build_model
    from seq2seq_cli.run.checkpoint import (
        atomic_write_text,
        save_checkpoint,
    )

    src_dir, run_dir = Path(src_dir), Path(run_dir)
    cfg = _marian_config(src_dir)
    for name in (SOURCE_SPM, TARGET_SPM, SOURCE_VOCAB):
        if not (src_dir / name).is_file():
            raise UserError(f"{src_dir / name}: missing (a Marian directory holds source.spm, target.spm and vocab.json)")
    check_output_dir(run_dir, force, [src_dir], "imported")
    tok_cfg = _read_json(src_dir / "tokenizer_config.json") if (src_dir / "tokenizer_config.json").is_file() else {}
    unk_piece = tok_cfg.get("unk_token", "<unk>") if isinstance(tok_cfg, dict) else "<unk>"
    unk_piece = unk_piece.get("content", "<unk>") if isinstance(unk_piece, dict) else unk_piece
    shared = bool(cfg["share_encoder_decoder_embeddings"])
    src_vocab = _read_json(src_dir / SOURCE_VOCAB)
    tgt_path = src_dir / TARGET_VOCAB
    tgt_path = tgt_path if tgt_path.is_file() and not shared else src_dir / SOURCE_VOCAB
    tgt_vocab = _read_json(tgt_path)
    for path, vocab in ((src_dir / SOURCE_VOCAB, src_vocab), (tgt_path, tgt_vocab)):
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise UserError(f"{path}: expected a JSON object mapping each piece to an integer id")
    _check_pieces(src_dir / SOURCE_SPM, src_vocab, src_dir / SOURCE_VOCAB)
    _check_pieces(src_dir / TARGET_SPM, tgt_vocab, tgt_path)
    Vs, Vt = cfg["vocab_size"], cfg["decoder_vocab_size"]
    pad, eos = cfg["pad_token_id"], cfg["eos_token_id"]
    src_order = _vocab_order(src_vocab, Vs, pad, eos, unk_piece, src_dir / SOURCE_VOCAB)
    tgt_order = _vocab_order(tgt_vocab, Vt, pad, eos, unk_piece, tgt_path)
    start = cfg["decoder_start_token_id"]
    if not 0 <= start < Vt:
        raise UserError(f"{src_dir / 'config.json'}: decoder_start_token_id {start} is outside the vocabulary (0..{Vt - 1})")

    weights = _marian_weights(src_dir)
    max_len = min(256, cfg["max_position_embeddings"] - 2)
    raw = {
        "name": run_dir.name,
        "data": {"train": "", "src_lang": src_lang, "tgt_lang": tgt_lang, "max_src_len": max_len, "max_tgt_len": max_len},
        "tokenizer": {"vocabulary": "file", "joint": shared, "vocab_size": max(Vs, Vt, 16)},
        "model": {
            "d_model": cfg["d_model"], "heads": cfg["encoder_attention_heads"], "ffn_size": cfg["encoder_ffn_dim"],
            "encoder_layers": cfg["encoder_layers"], "decoder_layers": cfg["decoder_layers"],
            "dropout": cfg["dropout"], "attention_dropout": cfg["attention_dropout"],
            "activation_dropout": cfg["activation_dropout"], "norm": "post", "positions": "sinusoidal",
            "max_positions": cfg["max_position_embeddings"], "tie_embeddings": bool(cfg["tie_word_embeddings"]),
            "bias": True, "activation": ACTIVATIONS[cfg["activation_function"]],
            "scale_embedding": bool(cfg["scale_embedding"]), "position_layout": "halves", "logits_bias": True,
            "decoder_start_id": tgt_order.index(start),
        },
    }
    config = validate_config(raw, f"{src_dir / 'config.json'} (converted)")
    model = build_model(config.model, Vs, Vt, shared)

    def tensor(*names: str) -> Tensor:
        for name in names:
            if name in weights:
                return weights[name].float()
        raise UserError(f"{src_dir}: weights have no {names[0]} (not a MarianMTModel checkpoint?)")

    enc_emb = tensor("model.encoder.embed_tokens.weight", "model.shared.weight")
    dec_emb = tensor("model.decoder.embed_tokens.weight", "model.shared.weight")
    state = {ours: tensor(theirs) for ours, theirs in layer_names(cfg["encoder_layers"], cfg["decoder_layers"])}
    state["src_embed.tokens.weight"] = enc_emb[src_order]
    state["tgt_embed.tokens.weight"] = dec_emb[tgt_order]
    if not config.model.tie_embeddings:
        state["output.weight"] = tensor("lm_head.weight")[tgt_order]
    bias = weights.get("final_logits_bias", torch.zeros(1, Vt)).float()
    state["logits_bias"] = bias.reshape(-1)[tgt_order]
    expected = model.state_dict()
    for name, value in state.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise UserError(f"{src_dir}: weight for {name} has shape {tuple(value.shape)}, config.json describes "
                            f"{tuple(expected[name].shape)}")
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)

    with replacing_output(run_dir) as out:  # the old run stays until the new one is complete
        layout = RunLayout(out)
        for dest in layout.vocab_spm():
            shutil.copyfile(src_dir / dest.name, dest)
        src_file, tgt_file = layout.vocab_files(shared)
        pieces = {i: p for p, i in src_vocab.items()}
        src_vocab = {pieces[m]: j for j, m in enumerate(src_order)}
        atomic_write_text(src_file, json.dumps(src_vocab, ensure_ascii=False, indent=0))
        if not shared:
            pieces = {i: p for p, i in tgt_vocab.items()}
            tgt_vocab = {pieces[m]: j for j, m in enumerate(tgt_order)}
            atomic_write_text(tgt_file, json.dumps(tgt_vocab, ensure_ascii=False, indent=0))
        save_config(config, layout.config)
        meta = {"step": 0, "epoch": 0, "imported_from": str(src_dir)}
        save_checkpoint(layout.checkpoints, 0, model, config, meta, {"step": 0}, best=True, keep_last=1)
    return run_dir


# --------------------------------------------------------------------------- export


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
        "pad_token_id": PAD, "eos_token_id": EOS, "forced_eos_token_id": EOS, "decoder_start_token_id": cfg.decoder_start_id,
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
        "source_lang": config.data.src_lang, "target_lang": config.data.tgt_lang,
    }
    atomic_write_text(output_dir / "tokenizer_config.json", json.dumps(tokenizer_config, indent=1))
    atomic_write_text(output_dir / "config.json", json.dumps(hf_config(model), indent=1))
    weights = hf_weights(model)
    atomic_write(output_dir / "model.safetensors", lambda tmp: save_file(weights, tmp, metadata={"format": "pt"}))
