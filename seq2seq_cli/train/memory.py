"""The trainer's memory. Will the model fit? Before a model is allocated for training, the
memory its parameters, gradients and Adam moments need (counted analytically, as `seq2seq info`
does: the model built on the meta device, no memory used) is compared with the memory free on
the device, so a model far too large is one line instead of an allocation failure or a machine
swapping. And the host memory freed after a validation is given back (`give_back_freed`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from pathlib import Path

import torch

from seq2seq_cli.config import Config, ModelConfig
from seq2seq_cli.data.corpora import Part
from seq2seq_cli.errors import UserError
from seq2seq_cli.model.info import MemoryEstimate
from seq2seq_cli.model.transformer import build_model

GIB = 2**30


def parameter_count(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> int:
    """The parameters of the model `cfg` describes, counted on the meta device."""
    with torch.device("meta"):
        model = build_model(cfg, src_vocab, tgt_vocab, joint)
    return sum(p.numel() for p in model.parameters())


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this process on `device`: free CUDA memory, or on a CPU the host's
    available memory (MemAvailable), lowered to what a cgroup limit leaves. None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    free = None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None and hasattr(os, "sysconf"):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            pass
    limit, used = _read_int(Path("/sys/fs/cgroup/memory.max")), _read_int(Path("/sys/fs/cgroup/memory.current"))
    if limit is not None and used is not None:
        free = min(free, limit - used) if free is not None else limit - used
    return free


def check_fits(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool, device: torch.device) -> None:
    """UserError when the weights, gradients and Adam moments of the model (fp32, activations
    not counted) need more memory than `device` has free."""
    params = parameter_count(cfg, src_vocab, tgt_vocab, joint)
    need = MemoryEstimate(params).training
    free = available_bytes(device)
    if free is not None and need > free:
        raise UserError(
            f"model: {params:,} parameters need {need / GIB:,.1f} GiB for weights, gradients and Adam state "
            f"before any activation, but {device.type} has {free / GIB:,.1f} GiB free; make the model smaller "
            f"(model.d_model {cfg.d_model}, ffn_size {cfg.ffn_size}, encoder_layers {cfg.encoder_layers}, "
            f"decoder_layers {cfg.decoder_layers}) or train on a device with more memory"
        )


EPOCH_BYTES_PER_PAIR = 24  # an epoch's drawn rows, their order and length keys while its batches are planned


def check_epoch_fits(config: Config, parts: list[Part]) -> None:
    """UserError naming the weight of the corpus that draws the most when the pairs an epoch of
    the weighted corpora draws need more host memory to plan than there is free."""
    pairs = sum(p.per_epoch for p in parts)
    need = pairs * EPOCH_BYTES_PER_PAIR
    free = available_bytes(torch.device("cpu"))
    if free is None or need <= free:
        return
    i, heaviest = max(enumerate(parts), key=lambda item: item[1].per_epoch)
    raise UserError(
        f"{config.where('data', 'train', i, 'weight')}: weight {heaviest.weight:g} draws {heaviest.per_epoch:,} pairs per "
        f"epoch ({pairs:,} with the other corpora); planning an epoch of them needs {need / GIB:,.1f} GiB, but the host "
        f"has {free / GIB:,.1f} GiB free; lower the weight"
    )


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def give_back_freed() -> None:
    """Return to the system the host memory the process has freed (glibc's malloc_trim), after
    each validation and its checkpoint. glibc keeps freed blocks for reuse: 30 quick-start
    updates in bf16 left 570 MB of the trainer's heap free but resident, which a trim gave back."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
