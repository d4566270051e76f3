"""`load_run(path) -> LoadedRun`: a trained run, loaded and verified once, for decoding,
evaluation and export.

`path` is a run directory (its best checkpoint, else last) or a checkpoint file in its
`checkpoints/` (see `checkpoint.resolve_checkpoint`). The checkpoint's files are checked
against its manifest's sha256 (or, without a manifest, the file's layout), its weights must
all be finite, and the run's tokenizers must be those the checkpoint was trained with: the
same vocabulary sizes and, where the checkpoint records them, the same files (sha256).

`open_run(path) -> RunFiles` checks the same without reading the weights (nor importing torch):
what a decoder that has the model in another form (CTranslate2's) needs, the weights' sha256
included. It keeps the checkpoint file open, so that `load_opened` loads the weights it hashed
even after training has replaced the checkpoint (a new best is linked in under the old name:
the file opened keeps the old weights): the model loaded later, when a sentence first needs our
searches, is the one the engine converted at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from seq2seq_cli.config import Config
from seq2seq_cli.config_load import validate_config
from seq2seq_cli.data.tokenizer import TOKENIZER_SHA256, check_fingerprint, load_tokenizers
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import sha256
from seq2seq_cli.layout import MANIFEST, RunLayout
from seq2seq_cli.run.checkpoint import load_weights, read_metadata, resolve_checkpoint, verify_checkpoint
from seq2seq_cli.run.safetensors_layout import check_safetensors_layout

if TYPE_CHECKING:  # torch and the model are imported by the loaders of weights only (`open_run` needs neither)
    import torch

    from seq2seq_cli.model.transformer import Seq2SeqTransformer


@dataclass
class LoadedModel:
    """A checkpoint's model (eval mode, on its device), the config it was trained with (its
    run_dir the run's directory) and the checkpoint's metadata (step, vocabulary sizes, ...)."""

    config: Config
    model: Seq2SeqTransformer
    meta: dict[str, str]
    run_dir: Path
    checkpoint: Path

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)


@dataclass
class LoadedRun(LoadedModel):
    """A run ready to use: the model and, checked to be the checkpoint's, its (source, target)
    tokenizers."""

    src_sp: Any  # SentencePieceProcessor, or a VocabTokenizer (tokenizer.vocabulary "file")
    tgt_sp: Any


@dataclass
class RunFiles:
    """A run's checkpoint, checked against its manifest, with its config, metadata and tokenizers
    (checked to be the checkpoint's): all of the run but the weights themselves."""

    config: Config
    meta: dict[str, str]
    run_dir: Path
    checkpoint: Path
    src_sp: Any
    tgt_sp: Any
    weights_sha256: str  # of the checkpoint's weights file
    held: IO[bytes] | None = field(default=None, repr=False, compare=False)  # that file, open since it was hashed

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)


def open_run(path: str | Path) -> RunFiles:
    """The run (or checkpoint) at `path` checked as `load_run` checks it, but for the weights'
    values (finite): UserError naming the file on any problem. Imports no torch. The checkpoint
    file stays open (`RunFiles.held`) for `load_opened`."""
    run_dir, ckpt = resolve_checkpoint(path)
    held: IO[bytes] | None
    try:
        held = open(ckpt, "rb")  # noqa: SIM115 (held open with the RunFiles: its weights as hashed)
        digest = hashlib.file_digest(held, "sha256").hexdigest()
    except OSError:
        held, digest = None, sha256(ckpt)
    if ckpt.with_suffix(MANIFEST).is_file():
        problem = verify_checkpoint(ckpt.parent, ckpt.stem, need_state=False, weights_sha256=digest)
        if problem is not None:
            raise UserError(f"{ckpt}: {problem}")
    else:
        check_safetensors_layout(ckpt)
    meta = read_metadata(ckpt)
    config = embedded_config(meta, run_dir, ckpt)
    t = config.tokenizer
    src_sp, tgt_sp = load_tokenizers(run_dir, t.joint, t.vocabulary)
    files = RunFiles(config, meta, run_dir, ckpt, src_sp, tgt_sp, digest, held)
    check_tokenizers(files)
    return files


def load_opened(files: RunFiles, device: str | torch.device = "cpu") -> LoadedRun:
    """The run `files` describe, loaded and verified as `load_run` loads it, with the weights
    `open_run` hashed: read from the file it holds open, which keeps them where training has
    since linked a new checkpoint in under the same name. A UserError where they are gone (the
    file written over in place, or not held open)."""
    from seq2seq_cli.model.transformer import build_model

    source = _held_path(files)
    if source is None:  # not held open: the checkpoint as it is, where it still holds those weights
        run = load_run(files.checkpoint, device)
        if sha256(files.checkpoint) != files.weights_sha256:
            raise UserError(f"{files.checkpoint}: replaced since the run was loaded; start again to decode with the "
                            "new one")
        return run
    if sha256(source) != files.weights_sha256:
        raise UserError(f"{files.checkpoint}: written over since the run was loaded, its weights then gone; start "
                        "again to decode with the new ones")
    meta = files.meta
    model = build_model(files.config.model, int(meta["src_vocab"]), int(meta["tgt_vocab"]), meta["joint_vocab"] == "True")
    load_weights(model, source, device)
    check_finite(model, files.checkpoint)
    warn_unverified(files.checkpoint)
    return LoadedRun(files.config, model.to(device).eval(), meta, files.run_dir, files.checkpoint, files.src_sp,
                     files.tgt_sp)


_WARNED: set[Path] = set()  # checkpoints warned about in this process


def warn_unverified(ckpt: Path) -> None:
    """Where the checkpoint has no manifest, the warning that its weights cannot be fully
    verified, once per process and checkpoint (a command may hand the weights to its engine and
    load them for our searches too)."""
    key = ckpt.resolve()
    if key in _WARNED or ckpt.with_suffix(MANIFEST).is_file():
        return
    _WARNED.add(key)
    print(f"warning: {ckpt}: no manifest ({ckpt.with_suffix(MANIFEST).name}), so the weights cannot be fully "
          "verified (no sha256 to compare); the file's header and sizes are intact", file=sys.stderr)


def _held_path(files: RunFiles) -> Path | None:
    """A path that opens the file `files` holds open (/dev/fd/N), or None where there is none."""
    if files.held is None or files.held.closed:
        return None
    path = Path(f"/dev/fd/{files.held.fileno()}")
    return path if os.path.exists(path) else None


def load_run(path: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Load and verify the run (or checkpoint) at `path`; UserError naming the file on any problem."""
    m = load_model(path, device)
    t = m.config.tokenizer
    src_sp, tgt_sp = load_tokenizers(m.run_dir, t.joint, t.vocabulary)
    loaded = LoadedRun(m.config, m.model, m.meta, m.run_dir, m.checkpoint, src_sp, tgt_sp)
    check_tokenizers(loaded)
    return loaded


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """The verified model of the run (or checkpoint) at `path`, without its tokenizers (for
    `seq2seq info`, which describes the model alone)."""
    from seq2seq_cli.model.transformer import build_model

    run_dir, ckpt = resolve_checkpoint(path)
    manifest = ckpt.with_suffix(MANIFEST).is_file()
    if manifest:
        problem = verify_checkpoint(ckpt.parent, ckpt.stem, need_state=False)
        if problem is not None:
            raise UserError(f"{ckpt}: {problem}")
    else:
        check_safetensors_layout(ckpt)
    meta = read_metadata(ckpt)
    config = embedded_config(meta, run_dir, ckpt)
    model = build_model(config.model, int(meta["src_vocab"]), int(meta["tgt_vocab"]), meta["joint_vocab"] == "True")
    load_weights(model, ckpt, device)
    check_finite(model, ckpt)
    warn_unverified(ckpt)
    return LoadedModel(config, model.to(device).eval(), meta, run_dir, ckpt)


def run_config(path: str | Path) -> Config:
    """The config the run (or checkpoint) at `path` was trained with, read from the checkpoint's
    metadata alone: what can be decided from the architecture is decided before anything is loaded."""
    run_dir, ckpt = resolve_checkpoint(path)
    return embedded_config(read_metadata(ckpt), run_dir, ckpt)


def embedded_config(meta: dict[str, str], run_dir: Path, ckpt: Path) -> Config:
    """The config a checkpoint's metadata holds, its run_dir the run the checkpoint is in."""
    config = validate_config(json.loads(meta["config"]), f"{ckpt} (embedded config)")
    return config.model_copy(update={"run_dir": str(run_dir)})


def check_finite(model: Seq2SeqTransformer, ckpt: Path) -> None:
    """Refuse weights holding NaN or infinite values (a damaged or badly converted file): the
    model would answer nothing, or noise, without a word."""
    import torch

    bad = [name for name, p in model.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"{ckpt}: weights are damaged: {len(bad)} tensors hold NaN or infinite values ({bad[0]}, ...)")


def check_tokenizers(run: LoadedRun | RunFiles) -> None:
    """Refuse a tokenizer whose vocabulary is not the one the checkpoint was trained with: the
    ids would mean other pieces and the translations would be wrong without a word. The sizes
    are compared first; then, when the checkpoint records one (its `TOKENIZER_SHA256`
    metadata), the sha256 of the tokenizer files (see `check_fingerprint`)."""
    t = run.config.tokenizer
    files = run.layout.vocab_files(t.joint) if t.vocabulary == "file" else run.layout.spm_models(t.joint)
    sides = (("source", files[0], run.src_sp, int(run.meta["src_vocab"])),
             ("target", files[1], run.tgt_sp, int(run.meta["tgt_vocab"])))
    for side, path, tok, want in sides:
        if tok.get_piece_size() != want:
            raise UserError(
                f"{path}: {side} tokenizer has {tok.get_piece_size()} pieces but {run.checkpoint} was trained with "
                f"{want}; this tokenizer does not belong to the checkpoint"
            )
    check_fingerprint(run.run_dir, run.checkpoint, run.meta.get(TOKENIZER_SHA256))
