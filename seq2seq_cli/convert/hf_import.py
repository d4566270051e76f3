"""Import a local Hugging Face Marian (`MarianMTModel`, OPUS-MT) directory into a run directory
(what the two formats share, and why ids are reordered, is told in `hf.py`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq_cli.convert.hf import (
    ACTIVATIONS,
    DEFAULTS,
    FIXED,
    INTS,
    LANGUAGE_TOKEN,
    PIECES_HELD,
    POSITIONS,
    SIZES,
    layer_names,
)
from seq2seq_cli.convert.output import check_output_dir, replacing_output
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, PAD, UNK
from seq2seq_cli.layout import SOURCE_SPM, SOURCE_VOCAB, TARGET_SPM, TARGET_VOCAB, RunLayout


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


def language_tokens(vocab: dict[str, int]) -> dict[str, str]:
    """The target languages an OPUS-MT multi-target model names by a token in front of the
    source (`>>es<<`, `>>fra<<`, `>>cmn_Hans<<` in its vocabulary) -> {language: token}, in the
    vocabulary's id order; empty for a model with one target."""
    found = sorted((i, piece) for piece, i in vocab.items() if LANGUAGE_TOKEN.fullmatch(piece))
    return {piece[2:-2]: piece for _, piece in found}


def _vocabularies(src_dir: Path, shared: bool) -> tuple[dict[str, int], dict[str, int], Path]:
    """The source and target vocabularies (piece -> Marian id), each checked against its
    SentencePiece model, and the target's file (vocab.json where they are shared)."""
    src_vocab = _read_json(src_dir / SOURCE_VOCAB)
    tgt_path = src_dir / TARGET_VOCAB
    tgt_path = tgt_path if tgt_path.is_file() and not shared else src_dir / SOURCE_VOCAB
    tgt_vocab = _read_json(tgt_path)
    for path, vocab in ((src_dir / SOURCE_VOCAB, src_vocab), (tgt_path, tgt_vocab)):
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise UserError(f"{path}: expected a JSON object mapping each piece to an integer id")
    _check_pieces(src_dir / SOURCE_SPM, src_vocab, src_dir / SOURCE_VOCAB)
    _check_pieces(src_dir / TARGET_SPM, tgt_vocab, tgt_path)
    return src_vocab, tgt_vocab, tgt_path


def _target_language(tgt_lang: str | None, tokens: dict[str, str], vocab_path: Path) -> str:
    """The run's data.tgt_lang: the one given ("tgt" where none is); a multi-target model's is
    one of its targets (`tokens`), the first where none is given."""
    if not tokens:
        return tgt_lang or "tgt"
    if tgt_lang is None:
        return next(iter(tokens))
    if tgt_lang not in tokens:
        raise UserError(f"--tgt-lang {tgt_lang}: {vocab_path} names the targets {', '.join(tokens)} by their "
                        f"tokens ({' '.join(tokens.values())}); give one of them, or leave out --tgt-lang")
    return tgt_lang


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


def import_marian(src_dir: str | Path, run_dir: str | Path, src_lang: str = "src", tgt_lang: str | None = None,
                  force: bool = False) -> Path:
    """Convert a local Marian directory into a run directory (config.yaml, source.spm,
    target.spm, vocab.json, checkpoints/best and last); returns the run directory.

    A multi-target model (OPUS-MT's `>>xx<<` tokens in its vocabulary) keeps its tokens: the
    run's `data.target_tokens` maps each target to its token, so the run translates `src_lang`
    into each of them (`translate --tgt-lang`). `tgt_lang` None: "tgt", or a multi-target
    model's first target."""
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
    src_vocab, tgt_vocab, tgt_path = _vocabularies(src_dir, shared)
    tokens = language_tokens(src_vocab)
    tgt_lang = _target_language(tgt_lang, tokens, src_dir / SOURCE_VOCAB)
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
        "data": {"train": "", "src_lang": src_lang, "tgt_lang": tgt_lang, "max_src_len": max_len, "max_tgt_len": max_len,
                 "target_tokens": tokens},
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


