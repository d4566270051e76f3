"""Checkpoints: weights in safetensors with self-describing metadata, training state loadable
with `torch.load(weights_only=True)`, every file written atomically (temp file, fsync, rename).

Layout inside a run directory:
    checkpoints/last.safetensors   weights + metadata of the latest save
    checkpoints/last.state.pt      optimizer, schedule, RNG and data position (for --resume)
    checkpoints/best.safetensors   weights with the best validation loss so far
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model

from seq2seq_cli.config import Config, validate_config
from seq2seq_cli.errors import UserError
from seq2seq_cli.model import Seq2SeqTransformer, build_model

FORMAT_VERSION = "1"
CHECKPOINT_DIR = "checkpoints"


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path), fsync it and rename it over `path`: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def save_weights(path: Path, model: Seq2SeqTransformer, config: Config, meta: dict[str, Any]) -> None:
    """Weights + metadata (format version, config, vocabulary sizes, step, ...) in one safetensors file."""
    metadata = {
        "format_version": FORMAT_VERSION,
        "config": json.dumps(config.model_dump(mode="json")),
        "src_vocab": str(model.src_embed.tokens.num_embeddings),
        "tgt_vocab": str(model.tgt_embed.tokens.num_embeddings),
        "joint_vocab": str(config.tokenizer.joint),
        **{k: str(v) for k, v in meta.items()},
    }
    atomic_write(path, lambda tmp: save_model(model, tmp, metadata=metadata))


def read_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise UserError(f"{path}: not a readable checkpoint ({exc})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format {meta.get('format_version')!r}, expected {FORMAT_VERSION!r}")
    return meta


def resolve_checkpoint(model_path: str | Path) -> tuple[Path, Path]:
    """`--model` is a run directory (best checkpoint, else last) or a checkpoint file inside one.

    -> (run directory, checkpoint file)
    """
    p = Path(model_path)
    if p.is_dir():
        for name in ("best", "last"):
            ckpt = p / CHECKPOINT_DIR / f"{name}.safetensors"
            if ckpt.is_file():
                return p, ckpt
        raise UserError(f"{p}: no checkpoints/best.safetensors or checkpoints/last.safetensors; is it a trained run directory?")
    if p.is_file():
        return p.parent.parent, p
    raise UserError(f"{p}: model not found (expected a run directory or a .safetensors checkpoint)")


def load_checkpoint(model_path: str | Path, device: str | torch.device = "cpu") -> tuple[Seq2SeqTransformer, Config, Path, dict[str, str]]:
    """Build the model described by a checkpoint and load its weights.

    -> (model in eval mode, config, run directory, metadata)
    """
    run_dir, ckpt = resolve_checkpoint(model_path)
    meta = read_metadata(ckpt)
    config = validate_config(json.loads(meta["config"]), f"{ckpt} (embedded config)")
    model = build_model(config.model, int(meta["src_vocab"]), int(meta["tgt_vocab"]), meta["joint_vocab"] == "True")
    try:
        missing, unexpected = load_model(model, str(ckpt), strict=False, device=str(device))
    except (SafetensorError, RuntimeError) as exc:
        raise UserError(f"{ckpt}: weights do not match the model described in it ({str(exc).splitlines()[0]})") from None
    if missing or unexpected:
        raise UserError(f"{ckpt}: weights do not match the model: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    model.to(device).eval()
    return model, config, run_dir, meta


def save_train_state(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_train_state(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the file cannot be trusted
        raise UserError(f"{path}: training state could not be loaded safely ({str(exc).splitlines()[0]})") from None
