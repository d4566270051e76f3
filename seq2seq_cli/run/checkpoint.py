"""Checkpoints: weights in safetensors with self-describing metadata, training state loadable
with `torch.load(weights_only=True)`, every file written atomically (temp file, fsync,
rename) and listed with its sha256 in a manifest written last, so a checkpoint is complete
exactly when its manifest exists and the hashes match.

Layout inside a run directory:
    checkpoints/step-00001000.{safetensors,state.pt,json}   the last `train.keep_last` saves
    checkpoints/last.{safetensors,state.pt,json}            the newest save (hard links)
    checkpoints/best.{safetensors,json}                     best validation so far (train.best_metric: nll or BLEU)
    checkpoints/average-last-N.safetensors                  written by `seq2seq average`

NAME.safetensors holds the weights and metadata (format version, config, vocabulary sizes,
step, and `tokenizer_sha256`: the sha256 of the run's tokenizer files, compared when the
checkpoint is used); NAME.state.pt the optimizer, RNG states, data position and counters for --resume;
NAME.json the manifest {"format_version", "step", "sha256": {"weights", "state"}}.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from seq2seq_cli.config import ARCHITECTURE_KEYS, Config, ModelConfig
from seq2seq_cli.data.tokenizer import TOKENIZER_SHA256, check_fingerprint, tokenizer_fingerprint
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write, atomic_write_text, remove_dead_temps, sha256
from seq2seq_cli.layout import BEST, CHECKPOINTS, LAST, MANIFEST, STATE, STEP, WEIGHTS, RunLayout, managed, step_name
from seq2seq_cli.run.safetensors_layout import check_safetensors_layout

if TYPE_CHECKING:  # torch is imported where weights are read or written: the rest serves loaders without it
    import torch

    from seq2seq_cli.model.transformer import Seq2SeqTransformer

FORMAT_VERSION = "1"


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

    def write(tmp: str) -> None:
        from safetensors.torch import save_model

        try:
            save_model(model, tmp, metadata=metadata)
        except SafetensorError as exc:  # an I/O error (a full disk) surfaces as this
            raise write_error(exc, tmp) from None

    atomic_write(path, write)


def write_error(exc: Exception, tmp: str) -> OSError:
    """The OSError (naming `tmp`, which `atomic_write` turns into the file's own name) of a
    writer that reports I/O errors its own way: safetensors' SafetensorError, torch.save's
    RuntimeError."""
    text = str(exc)
    if "No space left" in text or "StorageFull" in text or "file write failed" in text:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
    return OSError(errno.EIO, f"could not be written ({text.splitlines()[0] if text else type(exc).__name__})", tmp)


def read_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise UserError(f"{path}: not a readable checkpoint ({exc})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format {meta.get('format_version')!r}, expected {FORMAT_VERSION!r}")
    return meta


def _files(ckpt_dir: Path, name: str) -> dict[str, Path]:
    return {
        "weights": ckpt_dir / f"{name}{WEIGHTS}",
        "state": ckpt_dir / f"{name}{STATE}",
        "manifest": ckpt_dir / f"{name}{MANIFEST}",
    }


def step_names(ckpt_dir: Path) -> list[str]:
    """Names of the kept step checkpoints, newest first (complete or not)."""
    names = {p.name[: -len(WEIGHTS)] for p in ckpt_dir.glob(f"step-*{WEIGHTS}") if STEP.fullmatch(p.name[: -len(WEIGHTS)])}
    return sorted(names, reverse=True)


def save_checkpoint(
    ckpt_dir: Path, step: int, model: Seq2SeqTransformer, config: Config, meta: dict[str, Any],
    train_state: dict[str, Any], best: bool, keep_last: int,
) -> None:
    """Save step-N (weights, training state, then the manifest), point `last` (and `best`
    when asked) at it with hard links, and delete all but the newest `keep_last` step saves."""
    name = step_name(step)
    files = _files(ckpt_dir, name)
    fingerprint = tokenizer_fingerprint(ckpt_dir.parent, config.tokenizer.joint, config.tokenizer.vocabulary)
    save_weights(files["weights"], model, config, {**meta, **({TOKENIZER_SHA256: fingerprint} if fingerprint else {})})
    save_train_state(files["state"], train_state)
    manifest = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "sha256": {"weights": sha256(files["weights"]), "state": sha256(files["state"])},
    }
    atomic_write_text(files["manifest"], json.dumps(manifest, indent=1))
    _link_set(ckpt_dir, name, LAST, ("weights", "state", "manifest"))
    if best:
        _link_set(ckpt_dir, name, BEST, ("weights", "manifest"))
    for old in step_names(ckpt_dir)[keep_last:]:
        for path in _files(ckpt_dir, old).values():
            path.unlink(missing_ok=True)


def _link_set(ckpt_dir: Path, src: str, dst: str, roles: tuple[str, ...]) -> None:
    """Atomically replace each dst file by a hard link to (or, where links fail, a copy of)
    the src file. The old manifest is removed first and the new one linked last, so at every
    moment dst is either complete and verified or visibly incomplete (no manifest)."""
    src_files, dst_files = _files(ckpt_dir, src), _files(ckpt_dir, dst)
    dst_files["manifest"].unlink(missing_ok=True)
    for role in roles:
        remove_dead_temps(ckpt_dir, f".{dst_files[role].name}.")
        tmp = ckpt_dir / f".{dst_files[role].name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            os.link(src_files[role], tmp)
        except OSError:
            shutil.copyfile(src_files[role], tmp)
        os.replace(tmp, dst_files[role])


def verify_checkpoint(ckpt_dir: Path, name: str, need_state: bool, weights_sha256: str | None = None) -> str | None:
    """None when checkpoint NAME is complete and its files match the manifest's sha256 (the weights'
    given as `weights_sha256` where the caller has it); otherwise what is wrong with it."""
    files = _files(ckpt_dir, name)
    if not files["manifest"].is_file():
        return f"{files['manifest'].name} is missing"
    try:
        manifest = json.loads(files["manifest"].read_text(encoding="utf-8"))
        hashes = manifest["sha256"]
    except (ValueError, KeyError, TypeError):
        return f"{files['manifest'].name} is not a valid manifest"
    for role in ("weights", "state") if need_state else ("weights",):
        if not files[role].is_file():
            return f"{files[role].name} is missing"
        if (weights_sha256 if role == "weights" and weights_sha256 else sha256(files[role])) != hashes.get(role):
            return f"{files[role].name} is corrupted or truncated (sha256 does not match {files['manifest'].name})"
    return None


def find_resumable(ckpt_dir: Path) -> tuple[str, list[str]]:
    """The newest intact checkpoint to resume from -> (name, problems of newer ones skipped)."""
    problems: list[str] = []
    for name in [LAST, *step_names(ckpt_dir)]:
        if name == LAST and not _files(ckpt_dir, name)["weights"].exists() and not _files(ckpt_dir, name)["manifest"].exists():
            continue
        problem = verify_checkpoint(ckpt_dir, name, need_state=True)
        if problem is None:
            return name, problems
        problems.append(f"{name}: {problem}")
    found = "; ".join(problems) if problems else "no checkpoints"
    raise UserError(f"{ckpt_dir}: nothing intact to resume from ({found}); train without --resume to start over")


def resolve_checkpoint(model_path: str | Path) -> tuple[Path, Path]:
    """`--model` is a run directory (best checkpoint, else last) or a checkpoint file in its
    `checkpoints/` directory: the run directory holds the tokenizer a checkpoint needs, so a
    file anywhere else is refused rather than paired with a directory that is not its run.

    -> (run directory, checkpoint file)
    """
    p = Path(model_path)
    if p.is_dir():
        layout = RunLayout(p)
        for ckpt in (layout.best, layout.last):
            if ckpt.is_file():
                return p, ckpt
        raise UserError(f"{p}: no {CHECKPOINTS}/{layout.best.name} or {CHECKPOINTS}/{layout.last.name}; "
                        "is it a trained run directory?")
    if p.is_file():
        if p.suffix != ".safetensors":
            raise UserError(f"{p}: not a checkpoint "
                            f"(expected a run directory, or a .safetensors checkpoint in its {CHECKPOINTS}/)")
        if p.parent.name != CHECKPOINTS:
            raise UserError(
                f"{p}: a checkpoint file is used from its run directory (RUN/{CHECKPOINTS}/{p.name}), "
                "where its tokenizer lies; give the run directory or a checkpoint inside it"
            )
        return p.parent.parent, p
    raise UserError(f"{p}: model not found (expected a run directory or a .safetensors checkpoint)")


def verify_weights(ckpt: Path) -> None:
    """Refuse a weights file that cannot be trusted, as `load_run` does: with a manifest
    beside it, a sha256 that does not match; without one, a header or sizes that do not add up.
    Then refuse weights that hold NaN or infinite values (read one tensor at a time)."""
    if ckpt.with_suffix(MANIFEST).is_file():
        problem = verify_checkpoint(ckpt.parent, ckpt.stem, need_state=False)
        if problem is not None:
            raise UserError(f"{ckpt}: {problem}")
    else:
        check_safetensors_layout(ckpt)
    import torch

    bad = []
    try:
        with safe_open(str(ckpt), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    bad.append(name)
    except (SafetensorError, OSError) as exc:
        raise UserError(f"{ckpt}: not a readable checkpoint ({exc})") from None
    if bad:
        raise UserError(f"{ckpt}: weights are damaged: {len(bad)} tensors hold NaN or infinite values ({bad[0]}, ...)")


def load_weights(model: Seq2SeqTransformer, path: Path, device: str | torch.device = "cpu") -> None:
    """Load safetensors weights into a model built for them; UserError when they do not fit."""
    from safetensors.torch import load_model

    try:
        missing, unexpected = load_model(model, str(path), strict=False, device=str(device))
    except (SafetensorError, RuntimeError) as exc:
        raise UserError(f"{path}: weights do not match the model described in it ({str(exc).splitlines()[0]})") from None
    if missing or unexpected:
        raise UserError(
            f"{path}: weights do not match the model: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )


def load_matching(model: Seq2SeqTransformer, path: Path, device: str | torch.device = "cpu") -> tuple[int, int]:
    """Copy into `model` every tensor of the checkpoint `path` that has a tensor of the same name
    and shape in it (the embeddings and the first layers of each stack that both models have);
    the others keep their values -> (tensors copied, tensors of the model)."""
    import torch

    own = model.state_dict()
    copied = 0
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f, torch.no_grad():
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                if name in own and tuple(f.get_slice(name).get_shape()) == tuple(own[name].shape):
                    own[name].copy_(f.get_tensor(name).to(device))
                    copied += 1
    except SafetensorError as exc:
        raise UserError(f"{path}: cannot read its weights ({str(exc).splitlines()[0]})") from None
    return copied, len(own)


def check_compatible(path: Path, config: Config, src_vocab: int, tgt_vocab: int) -> None:
    """Refuse to resume from (or start from, with --init-from) a checkpoint of another
    architecture or vocabulary, or one that records another tokenizer than the run's, naming
    the mismatch. A key a checkpoint's config lacks
    (saved before the key existed) holds its default."""
    meta = read_metadata(path)
    saved = json.loads(meta["config"])["model"]
    current = config.model.model_dump(mode="json")
    defaults = {k: f.default for k, f in ModelConfig.model_fields.items()}
    diffs = [f"model.{k} {saved.get(k, defaults[k])!r} in the checkpoint, {current[k]!r} in the config"
             for k in ARCHITECTURE_KEYS if saved.get(k, defaults[k]) != current[k]]
    for side, had, has in (("source", meta["src_vocab"], src_vocab), ("target", meta["tgt_vocab"], tgt_vocab)):
        if int(had) != has:
            diffs.append(f"{side} vocabulary {had} in the checkpoint, {has} in the run's tokenizer")
    if diffs:
        raise UserError(f"{path}: checkpoint does not match: {'; '.join(diffs)}")
    check_fingerprint(config.run_path, path, meta.get(TOKENIZER_SHA256))


def save_train_state(path: Path, state: dict[str, Any]) -> None:
    import torch

    def write(tmp: str) -> None:
        try:
            torch.save(state, tmp)
        except RuntimeError as exc:  # torch's zip writer reports a full disk as "file write failed"
            raise write_error(exc, tmp) from None

    atomic_write(path, write)


def load_train_state(path: Path) -> dict[str, Any]:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the file cannot be trusted
        raise UserError(f"{path}: training state could not be loaded safely ({str(exc).splitlines()[0]})") from None


def average_checkpoints(run_dir: Path, last: int, output: Path | None = None) -> Path:
    """Average the weights of the newest `last` intact step checkpoints of a run (as
    fairseq's average_checkpoints and OpenNMT's average_models); returns the written file,
    by default RUN/checkpoints/average-last-N.safetensors (usable as --model).

    `output` must be a NAME.safetensors file in the run's checkpoints directory (the averaged
    weights are used with the run's tokenizer, which `--model` finds through that directory),
    NAME not one the run manages (best, last, step-N), and it is written with its manifest
    NAME.json. Checkpoints that training rotates away while they are read are listed again
    once; a second miss is reported as one line."""
    ckpt_dir = RunLayout(run_dir).checkpoints
    if not ckpt_dir.is_dir():
        raise UserError(f"{run_dir}: no {CHECKPOINTS} directory; is it a trained run directory?")
    output = Path(output) if output else ckpt_dir / f"average-last-{last}{WEIGHTS}"
    if output.parent.resolve() != ckpt_dir.resolve():
        raise UserError(
            f"{output}: an averaged checkpoint is written into its run's checkpoints directory "
            f"{ckpt_dir}, where --model finds the run's tokenizer (to use it elsewhere, copy the whole run directory)"
        )
    if output.suffix != WEIGHTS or not output.stem or output.stem.startswith("."):
        raise UserError(f"{output}: an averaged checkpoint is a NAME.safetensors file (its manifest is NAME.json)")
    if managed(output.stem):
        raise UserError(
            f"{output}: {output.name} is a checkpoint the run manages (best, last, step-N); "
            "give the average another name, e.g. average.safetensors"
        )
    for attempt in (1, 2):
        try:
            names, averaged, meta = _average(ckpt_dir, last, final=attempt == 2)
            break
        except (FileNotFoundError, SafetensorError, _Rotating) as exc:
            if attempt == 1:
                time.sleep(0.5)  # a save in progress has its manifest written by then
            else:
                raise UserError(
                    f"{ckpt_dir}: step checkpoints changed while they were read ({exc}): training is rotating "
                    "them; average once it has saved, or after it ends"
                ) from None
    from safetensors.torch import save_file

    manifest = output.with_suffix(".json")
    manifest.unlink(missing_ok=True)
    atomic_write(output, lambda tmp: save_file(averaged, tmp, metadata=meta))
    atomic_write_text(manifest, json.dumps(
        {"format_version": FORMAT_VERSION, "step": meta.get("step"), "sha256": {"weights": sha256(output)}}, indent=1))
    return output


class _Rotating(Exception):
    """Fewer intact step checkpoints than asked, perhaps because one is being saved."""


def _average(ckpt_dir: Path, last: int, final: bool) -> tuple[list[str], dict[str, torch.Tensor], dict[str, str]]:
    """The newest `last` intact step checkpoints -> (their names, their mean weights, the
    metadata of the newest with the names added). Raises FileNotFoundError when one goes
    away while it is read, and, unless `final`, _Rotating when fewer than `last` are intact."""
    from safetensors.torch import load_file

    names = [n for n in step_names(ckpt_dir) if verify_checkpoint(ckpt_dir, n, need_state=False) is None][:last]
    if len(names) < last and not final:
        raise _Rotating(f"{len(names)} intact")
    if len(names) < last:
        raise UserError(
            f"{ckpt_dir}: {len(names)} intact step checkpoints, --last {last} asked; "
            "keep more with train.keep_last"
        )
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for name in names:
        for key, tensor in load_file(str(ckpt_dir / f"{name}.safetensors")).items():
            total[key] = total.get(key, 0) + tensor.double()
            dtypes.setdefault(key, tensor.dtype)
    averaged = {k: (v / len(names)).to(dtypes[k]).contiguous() for k, v in total.items()}
    newest = ckpt_dir / f"{names[0]}.safetensors"
    if not newest.is_file():
        raise FileNotFoundError(2, "No such file or directory", str(newest))
    meta = {**read_metadata(newest), "averaged": ",".join(names)}
    return names, averaged, meta
