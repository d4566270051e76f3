"""Run setup: everything a run needs before its loop.

`setup_run` claims the run directory (the lock; checkpoints there need --resume or
--overwrite), sets up fine-tuning (--init-from: the init run's architecture, tokenizer and
weights), applies the tokenizer policy (trained or copied into the run, and checked against
the config and the checkpoints), prepares the data, builds the model, optimizer and scaler,
and the `TrainState` to start from: fresh, or the newest intact checkpoint's with --resume.
The result is a `Run`, what the loop (`loop.py`) works with.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from seq2seq_cli.config import Config, TokenizerConfig, TrainConfig
from seq2seq_cli.config_load import inherit_architecture, save_config, validate_config
from seq2seq_cli.data.tokenizer import (
    TOKENIZER_SHA256,
    check_fingerprint,
    id_files,
    load_tokenizers,
    model_paths,
)
from seq2seq_cli.device import cpu_description, describe_cpu, resolve_precision
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.model.transformer import Seq2SeqTransformer, build_model
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.run import runlock
from seq2seq_cli.train import distributed
from seq2seq_cli.train.data import TrainData, prepare_data, write_shortlist
from seq2seq_cli.train.distributed import Processes
from seq2seq_cli.train.ema import averaged_copy, restore_count
from seq2seq_cli.train.memory import check_fits
from seq2seq_cli.train.metrics import MetricsLog
from seq2seq_cli.train.state import DeviceTally, TrainState, set_rng_state


def make_optimizer(model: nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay; the fused kernel (one pass over all parameters) where
    this build of torch has one for the device."""
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay, fused=fused)


@dataclass
class Run:
    """What the loop works with, built once by `setup_run`."""

    config: Config
    procs: Processes
    device: torch.device
    data: TrainData
    model: Seq2SeqTransformer  # what is saved and validated (parameter names unprefixed)
    net: nn.Module  # what trains: the same parameters, compiled and/or wrapped for DDP
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    metrics: MetricsLog | None  # rank 0 only
    log: Callable[[str], None]
    average: torch.optim.swa_utils.AveragedModel | None = None  # the weights' moving average (train.ema_decay)
    tally: DeviceTally | None = None  # the updates' sums and skips, on the device until read (set by setup_run)
    release: Callable[[], object] = lambda: None  # gives the run lock back (set by setup_run); once only

    @property
    def scored(self) -> Seq2SeqTransformer:
        """The model that is validated and saved: the moving average where there is one."""
        return self.average.module if self.average is not None else self.model  # type: ignore[return-value]

    @property
    def ckpt_dir(self) -> Path:
        return self.layout.checkpoints

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.config.run_path)


def resume_state(config: Config, model: Seq2SeqTransformer, average: torch.optim.swa_utils.AveragedModel | None,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, data: TrainData, procs: Processes,
                 device: torch.device, log: Callable[[str], None]) -> TrainState:
    """Load the newest intact checkpoint into the model (and its moving average), optimizer
    and scaler, restore this process's random generators -> the saved `TrainState`. A run
    saved with a moving average keeps the trained weights in its training state and the
    average in its weights file."""
    layout = RunLayout(config.run_path)
    name, damaged = ckpt.find_resumable(layout.checkpoints)
    for problem in damaged:
        log(f"warning: not resuming from damaged checkpoint {problem}")
    weights = layout.weights(name)
    ckpt.check_compatible(weights, config, data.src_sp.get_piece_size(), data.tgt_sp.get_piece_size())
    ckpt.load_weights(model, weights, device)
    saved = ckpt.load_train_state(layout.train_state(name))
    if average is not None:  # the weights file holds the average (or, saved without one, the weights)
        average.module.load_state_dict(model.state_dict())
        restore_count(average, saved["step"])
    if "trained_weights" in saved:
        model.load_state_dict(saved["trained_weights"])
    optimizer.load_state_dict(saved["optimizer"])
    if saved["scaler"]:  # empty when saved without loss scaling: an fp16 resume starts the scaler afresh
        scaler.load_state_dict(saved["scaler"])
    state = TrainState()
    state.load_state_dict(saved)
    set_rng_state(state.rng_for(procs))
    log(f"resumed from {weights} at step {state.step} (epoch {state.epoch + 1}, batch {state.batch_in_epoch})")
    return state


def check_resume_tokenizer(config: Config) -> None:
    """--resume with a tokenizer that is not the one the last checkpoint was trained with is
    refused before the corpus is encoded with it. Only the metadata of `last` is read; where it
    is missing or damaged, `resume_state` checks the checkpoint it resumes from instead."""
    last = RunLayout(config.run_path).last
    try:
        meta = ckpt.read_metadata(last)
    except UserError:
        return
    check_fingerprint(config.run_path, last, meta.get(TOKENIZER_SHA256))


def check_tokenizer_size(config: Config) -> None:
    """The recorded config must be the truth: a tokenizer already in the run that was trained
    with another tokenizer.vocab_size than the config's is refused, not used under a wrong record."""
    t = config.tokenizer
    paths = model_paths(config.run_path, t.joint)
    if t.src_model is not None or t.vocabulary != "sentencepiece" or not all(p.is_file() for p in paths):
        return
    for path, sp in zip(paths, load_tokenizers(config.run_path, t.joint)):
        if sp.get_piece_size() != t.vocab_size:
            raise UserError(
                f"{path}: the run's tokenizer has {sp.get_piece_size()} pieces but tokenizer.vocab_size is "
                f"{t.vocab_size}; keep vocab_size {sp.get_piece_size()}, or train a new tokenizer with "
                f"`seq2seq tokenize` (or in another run_dir)"
            )


def claim_run_dir(config: Config, resume: bool, overwrite: bool, procs: Processes,
                  log: Callable[[str], None]) -> Path | None:
    """Lock the run directory (rank 0; see `runlock`) and check that this start loses no earlier
    run: checkpoints there need --resume or --overwrite; --overwrite clears the old run's
    outputs -> the lock to release (None on the other ranks)."""
    lock = runlock.acquire(config.run_path, runlock.command_line()) if procs.main else None
    try:
        runlock.check_fresh_start(config.run_path, resume, overwrite)
        check_tokenizer_size(config)
        if overwrite and procs.main:
            for path in runlock.clear_run(config.run_path):
                log(f"--overwrite: removed {path}")
    except BaseException:
        if lock is not None:
            runlock.release(lock)
        raise
    return lock


def tokenizer_files(run_dir: Path, t: TokenizerConfig) -> list[Path]:
    """The files of a run's tokenizer: SentencePiece model(s) (with their .vocab listings when
    present), or source.spm/target.spm and the vocabulary file(s): the `id_files` and the listings."""
    files = id_files(run_dir, t.joint, t.vocabulary)
    if t.vocabulary == "file":
        return files
    return files + [p.with_suffix(".vocab") for p in files if p.with_suffix(".vocab").is_file()]


@dataclass
class Init:
    """Where a fine-tuning run (--init-from) starts: a checkpoint and the run that holds it."""

    run_dir: Path
    weights: Path


def init_from_run(config: Config, init_from: str | Path) -> tuple[Config, Init]:
    """Resolve --init-from (a run directory: its best checkpoint, else last; or a checkpoint
    file in a run's checkpoints/) -> (this run's config with that run's architecture and
    vocabulary, where to start). A config that contradicts them is refused, naming the key."""
    run_dir, weights = ckpt.resolve_checkpoint(init_from)
    if run_dir.resolve() == config.run_path.resolve():
        raise UserError(f"--init-from {init_from}: that is this run's own directory; continue it with --resume, "
                        "or give the fine-tuning run another name or run_dir")
    ckpt.verify_weights(weights)  # as translate would: sha256 against its manifest, finite values
    meta = ckpt.read_metadata(weights)
    saved = validate_config(json.loads(meta["config"]), f"{weights} (embedded config)")
    return inherit_architecture(config, saved, str(init_from)), Init(run_dir, weights)


def copy_tokenizer(init: Init, config: Config, resume: bool) -> None:
    """Copy the init run's tokenizer into this run, which then stands alone (translate,
    evaluate and export need nothing else); on --resume the copy made at the start is kept."""
    for src in tokenizer_files(init.run_dir, config.tokenizer):
        dest = config.run_path / src.name
        if resume and dest.is_file():
            continue
        if not src.is_file():
            raise UserError(f"{src}: tokenizer file of the --init-from run not found")
        atomic_write(dest, functools.partial(shutil.copyfile, src))


def setup_run(config: Config, resume: bool, procs: Processes, device: torch.device,
              log: Callable[[str], None] | None = None, overwrite: bool = False,
              init_from: str | Path | None = None, warm_start: Path | None = None) -> tuple[Run, TrainState]:
    """Everything a run needs before its loop: the run directory (locked for as long as the
    returned `Run` lives), data and tokenizer, model, optimizer and scaler, and the state to
    start from (fresh, or the checkpoint's with --resume; --overwrite starts over).
    With `init_from` the model starts from that run's weights, with its architecture and
    tokenizer, and a fresh optimizer, schedule and step count; --resume then continues from
    this run's own checkpoints. With `warm_start` (a checkpoint of a model with the same
    tokenizer, such as a student's teacher) a fresh run starts from its tensors that fit
    (`checkpoint.load_matching`), the rest initialised as usual."""
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    log = log if procs.main else (lambda msg: None)  # only the main process logs
    init = None
    if init_from is not None:
        config, init = init_from_run(config, init_from)
    lock = claim_run_dir(config, resume, overwrite, procs, log)
    try:
        distributed.check_shared(procs, config.run_path)
        run, state = build_run(config, resume, procs, device, log, init, warm_start)
    except BaseException:
        if lock is not None:
            runlock.release(lock)
        raise
    if lock is not None:  # given back when train returns or fails (`Run.release`), or else when the run is collected
        run.release = weakref.finalize(run, runlock.release, lock)
    return run, state


def build_run(config: Config, resume: bool, procs: Processes, device: torch.device,
              log: Callable[[str], None], init: Init | None = None, warm_start: Path | None = None) -> tuple[Run, TrainState]:
    """The body of `setup_run`, in a run directory already claimed."""
    t = config.train
    config.run_path.mkdir(parents=True, exist_ok=True)
    if init is not None and procs.main:
        copy_tokenizer(init, config, resume)
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    if resume:
        check_resume_tokenizer(config)
    data = prepare_data(config, procs, log)
    listed = RunLayout(config.run_path).shortlist
    if procs.main and not listed.is_file():
        write_shortlist(data, listed, log)

    vocab_sizes = data.src_sp.get_piece_size(), data.tgt_sp.get_piece_size()
    check_fits(config.model, *vocab_sizes, config.tokenizer.joint, device)
    model = build_model(config.model, *vocab_sizes, config.tokenizer.joint).to(device)
    optimizer = make_optimizer(model, t, device)
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")  # fp16 overflow handling
    where = f"{procs.world} processes ({device.type})" if procs.world > 1 else str(device)
    log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {where}, {resolve_precision(t.precision, device)}"
        + (f"; CPU {describe_cpu()}" if device.type == "cpu" else ""))
    if procs.world > 1:
        torch.manual_seed(t.seed + procs.rank)  # the same initial weights, but each process its own dropout
    if init is not None and not resume:
        ckpt.check_compatible(init.weights, config, data.src_sp.get_piece_size(), data.tgt_sp.get_piece_size())
        ckpt.load_weights(model, init.weights, device)
        log(f"initialised from {init.weights}; fresh optimizer and schedule from step 0")
    elif warm_start is not None and not resume:
        copied, total = ckpt.load_matching(model, warm_start, device)
        log(f"{copied} of {total} tensors start from {warm_start} (those of the same name and shape); the rest as initialised")
    average = averaged_copy(model, t.ema_decay) if t.ema_decay else None
    state = resume_state(config, model, average, optimizer, scaler, data, procs, device, log) if resume else TrainState()

    net: nn.Module = model
    if procs.world > 1:
        # the only buffers are constant position tables: nothing to re-broadcast every forward
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    if t.compile:
        net = torch.compile(net)  # type: ignore[assignment]  # torch's stubs type compile(Module) as a function; it returns a Module
    if procs.main:
        save_config(config, RunLayout(config.run_path).config)
    metrics = MetricsLog(config.run_path, state.step if resume else None, t.tensorboard) if procs.main else None
    if metrics is not None and not resume:
        metrics.write({**data.record(), "device": str(device), "precision": resolve_precision(t.precision, device),
                       **({"cpu": cpu_description()} if device.type == "cpu" else {})})
    return Run(config, procs, device, data, model, net, optimizer, scaler, metrics, log, average, DeviceTally(device)), state

