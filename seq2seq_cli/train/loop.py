"""`train(config) -> run_dir`: one loop, top to bottom.

text files -> tokenizer -> encoded pairs -> token-budget batches -> model -> label-smoothed
cross-entropy -> Adam with inverse-sqrt warmup -> checkpoints and metrics.jsonl.

`setup_run` builds what a run needs (data, tokenizer, model, optimizer, the `TrainState`,
fresh or resumed); `train` then loops over `one_update`, `log_progress`, `validate_and_save`
and `should_stop`. `TrainState` is the record of where training stands: its `state_dict()`
is what a checkpoint's training state holds, beside the optimizer's and the scaler's.

Under `torchrun` the same loop runs in every process (see `distributed.py`): the batches of
each update are dealt out to the processes, gradients are summed across them (DDP), and
rank 0 alone writes the run directory.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import json
import math
import random
import shutil
import signal
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from seq2seq_cli.config import (
    Config,
    TokenizerConfig,
    TrainConfig,
    inherit_architecture,
    save_config,
    validate_config,
)
from seq2seq_cli.data.batching import Batch, collate, epoch_batches, token_batches
from seq2seq_cli.data.encoding import (
    Drop,
    EncodedCorpus,
    check_no_empty_lines,
    describe_drops,
    encoded_split,
)
from seq2seq_cli.data.formats import read_split, split_source
from seq2seq_cli.data.tokenizer import (
    TOKENIZER_SHA256,
    check_fingerprint,
    id_files,
    load_tokenizers,
    model_paths,
)
from seq2seq_cli.device import cpu_description, describe_cpu
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write
from seq2seq_cli.model.transformer import Seq2SeqTransformer, build_model
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.run import runlock
from seq2seq_cli.run.tokenizing import train_tokenizer
from seq2seq_cli.train import distributed
from seq2seq_cli.train.distributed import Processes
from seq2seq_cli.train.ema import averaged_copy, restore_count
from seq2seq_cli.train.loss import label_smoothed_nll
from seq2seq_cli.train.memory import check_fits
from seq2seq_cli.train.metrics import MetricsLog, plot_curves, read_metrics


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16); asked
    once per process (autocast resolves the precision for every batch)."""
    try:
        caps = torch._C._cpu._get_cpu_capability()
    except (AttributeError, RuntimeError):  # a build of torch without the query: assume not
        return False
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` -> bf16 on CUDA and on CPUs with native bf16 instructions, fp32 elsewhere."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16()) else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 or fp16 autocast as the (resolved) precision says; plain fp32 otherwise."""
    precision = resolve_precision(precision, device)
    if precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def inverse_sqrt_lr(step: int, lr: float, warmup: int, init_lr: float) -> float:
    """Linear warmup from init_lr to lr over `warmup` steps, then lr * sqrt(warmup / step)."""
    if warmup and step < warmup:
        return init_lr + (lr - init_lr) * step / warmup
    return lr * math.sqrt(max(warmup, 1) / max(step, 1))


def learning_rate(step: int, t: TrainConfig) -> float:
    """The learning rate of update `step` (1-based): linear warmup, then the configured schedule."""
    if t.schedule == "inverse_sqrt" or (t.warmup_steps and step < t.warmup_steps):
        return inverse_sqrt_lr(step, t.lr, t.warmup_steps, t.warmup_init_lr)
    if t.schedule == "constant":
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))  # type: ignore[operator]
    return t.min_lr + (t.lr - t.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay; the fused kernel (one pass over all parameters) where
    this build of torch has one for the device."""
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay, fused=fused)


def my_batches(update: list[np.ndarray], procs: Processes) -> tuple[list[np.ndarray], bool]:
    """This process's share of one update's batches: batches rank, rank + world, ...
    -> (batches, real). A process left without any (the short last update of an epoch) gets
    the update's first batch with `real` False: it runs it with weight 0, so that every
    process takes part in the gradient sum."""
    mine = update[procs.rank :: procs.world]
    return (mine, True) if mine else (update[:1], False)


def wrapped_ddp(model: nn.Module) -> DDP | None:
    """The DDP wrapper of the module that trains, under torch.compile's wrapper (which keeps
    it as `_orig_mod`) or not; None without DDP."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DDP) else None


def accumulate_gradients(
    model: nn.Module, micro: list[Batch], weight: float, config: Config,
    device: torch.device, scaler: torch.amp.GradScaler, procs: Processes,
) -> dict[str, float] | None:
    """Forward and backward over this process's batches of one update (gradient accumulation).

    The gradient is that of the label-smoothed loss summed over every target token of the
    update's batches on all processes, divided by their number, as if they were one batch:
    the token count is summed across processes, and DDP's averaging over the `world`
    processes is undone by scaling each loss by `world`. `weight` is 1, or 0 for a stand-in
    batch. The host reads the device once, after the last backward. -> sums over all
    processes for logging, or None (the update must be skipped) when a loss is not finite.
    """
    tokens = float(sum(b.tgt_tokens for b in micro)) * weight
    src_tokens = float(sum(b.src_tokens for b in micro)) * weight
    counts = torch.tensor([tokens, src_tokens], dtype=torch.float64, device=device if procs.world > 1 else "cpu")
    total, all_src = distributed.sum_across(procs, counts).tolist()  # (NCCL sums device tensors only)
    loss_sum = torch.zeros((), device=device)
    nll_sum = torch.zeros((), device=device)
    divisor = max(total, 1.0) / procs.world
    ddp = wrapped_ddp(model)
    for i, batch in enumerate(micro):
        b = batch.to(device, non_blocking=True)
        # DDP sums gradients across processes in the last backward only
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last or ddp is None else ddp.no_sync():
            with autocast(device, config.train.precision):
                logits = model(b.src, b.tgt_in)
            loss, nll, _ = label_smoothed_nll(logits, b.tgt_out, config.train.label_smoothing)
            scaler.scale(loss / divisor * weight).backward()
        loss_sum += loss.detach() * weight
        nll_sum += nll.detach() * weight
    stats = distributed.sum_across(procs, torch.stack([loss_sum, nll_sum]).float()).tolist()
    if not all(math.isfinite(v) for v in stats):
        return None
    return {"loss": stats[0], "nll": stats[1], "tokens": int(total), "src_tokens": int(all_src)}


def validation_bleu(
    model: Seq2SeqTransformer, src_sp: Any, tgt_sp: Any, valid_raw: Any, config: Config, device: torch.device
) -> tuple[float, str]:
    """Greedy translation of the validation sources scored with sacreBLEU -> (BLEU, signature)."""
    from seq2seq_cli.decode.evaluate import score
    from seq2seq_cli.decode.onednn import for_decoding
    from seq2seq_cli.decode.translate import Translator

    decode = config.decode.model_copy(update={"beam_size": 1, "sampling": False})
    model.eval()
    # weights are fixed during validation: pack them for decoding once, not once per batch
    hyps = Translator(for_decoding(model), src_sp, tgt_sp, decode, device).translate(list(valid_raw["src"]))
    model.train()
    scores = score(hyps, list(valid_raw["tgt"]))
    return scores.bleu, scores.bleu_signature


@torch.no_grad()
def validate(
    model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device, procs: Processes | None = None
) -> dict[str, float]:
    """Validation loss, nll and perplexity; each process scores every world-th batch and the
    sums are added up across processes (one process when `procs` is None)."""
    procs = procs or Processes()
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, tokens
    batches = token_batches(corpus.src_lens, corpus.tgt_lens, config.train.max_tokens)
    for index in batches[procs.rank :: procs.world]:
        b = collate(corpus, index).to(device)
        with autocast(device, config.train.precision):
            logits = model(b.src, b.tgt_in)
        sums += torch.stack(label_smoothed_nll(logits, b.tgt_out, config.train.label_smoothing)).double()
    loss_sum, nll_sum, tokens = distributed.sum_across(procs, sums).tolist()
    model.train()
    nll_tok = nll_sum / max(tokens, 1)
    return {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_tok, "valid_ppl": math.exp(min(nll_tok, 50))}


class StopRequest:
    """Set by SIGINT (Ctrl-C) or SIGTERM while the loop runs; the loop looks at it between
    updates, once an update, its validation and its saves are complete, so the `last` it then
    saves resumes exactly. A second signal interrupts at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM set the yielded `StopRequest` instead of interrupting (in the main
    thread; elsewhere signals keep their handlers and the request is never set)."""
    stop = StopRequest()
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, stop)
    except ValueError:  # not the main thread
        pass
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def rng_state() -> dict[str, Any]:
    """This process's random generators: torch (CPU and every CUDA device) and Python's
    `random` (as its repr: a checkpoint's state loads with `weights_only`)."""
    state = {"torch": torch.get_rng_state(), "python": repr(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` saved."""
    torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(ast.literal_eval(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- the state of a run


def new_window() -> dict[str, float]:
    """Sums over the current logging interval (saved with checkpoints so resumed logs match)."""
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0}


def new_counters() -> dict[str, int]:
    return {"skipped_nonfinite": 0, "fp16_overflows": 0}


@dataclass
class TrainState:
    """Where training stands. `state_dict()` is the one list of what a checkpoint's training
    state holds (the optimizer's and the scaler's states are saved beside it); the fields
    after `rngs` only describe the running process and are not saved."""

    step: int = 0  # updates applied
    epoch: int = 0  # 0-based
    batch_in_epoch: int = 0  # batches of this epoch's order consumed
    best: float = float("-inf")  # best validation score so far (higher is better)
    since_best: int = 0  # validations since the best one (the patience counter)
    elapsed: float = 0.0  # seconds trained before this process started its loop
    window: dict[str, float] = field(default_factory=new_window)
    counters: dict[str, int] = field(default_factory=new_counters)
    rngs: list[dict[str, Any]] = field(default_factory=list)  # each process's generators, at the last save
    started: float = field(default_factory=time.time)  # when this process's loop began
    window_start: float = field(default_factory=time.time)
    consecutive_bad: int = 0  # non-finite updates in a row
    validated_at: int = 0  # the step of the last validation (or the start)

    def seconds(self) -> float:
        """Training time so far, this process's and the saved runs' before it."""
        return self.elapsed + time.time() - self.started

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "rng": self.rngs[0],
            **({"rng_ranks": self.rngs} if len(self.rngs) > 1 else {}),
            "best": self.best,
            "since_best": self.since_best,
            "elapsed": self.seconds(),
            "window": self.window,
            "counters": self.counters,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best, self.since_best, self.elapsed = state["best"], state["since_best"], state["elapsed"]
        self.window, self.counters = state["window"], state["counters"]
        self.rngs = state.get("rng_ranks", [state["rng"]])
        self.validated_at = self.step

    def rng_for(self, procs: Processes) -> dict[str, Any]:
        """This process's saved generators; rank 0's when the run was saved by another number
        of processes."""
        return self.rngs[procs.rank] if len(self.rngs) == procs.world else self.rngs[0]


@dataclass
class TrainData:
    """The corpora a run trains and validates on, and the tokenizers that encoded them."""

    train: EncodedCorpus
    valid: EncodedCorpus | None
    valid_raw: Any  # the validation text (a `datasets.Dataset`), for BLEU
    src_sp: Any
    tgt_sp: Any

    def record(self) -> dict[str, Any]:
        """The first metrics record: pairs kept and dropped."""
        dropped = {f"train_dropped_{k}": v for k, v in self.train.dropped.items()}
        rec: dict[str, Any] = {"step": 0, "train_pairs": len(self.train), **dropped}
        if self.valid is not None:
            rec.update({"valid_pairs": len(self.valid), "valid_dropped_empty": self.valid.dropped["empty"],
                        "valid_dropped_too_long": self.valid.dropped.get(Drop.TOO_LONG.key, 0)})
        return rec


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

    @property
    def scored(self) -> Seq2SeqTransformer:
        """The model that is validated and saved: the moving average where there is one."""
        return self.average.module if self.average is not None else self.model  # type: ignore[return-value]

    @property
    def ckpt_dir(self) -> Path:
        return self.config.run_path / ckpt.CHECKPOINT_DIR


class Outcome(enum.Enum):
    """What became of one update."""

    APPLIED = "applied"
    FP16_OVERFLOW = "fp16_overflow"  # the scaler skipped it and lowered its scale
    NONFINITE = "nonfinite"  # skipped: a loss or the gradient norm was not finite


# --------------------------------------------------------------------------- before the loop


def prepare_data(config: Config, procs: Processes, log: Callable[[str], None]) -> TrainData:
    """Data (checked line by line before anything is trained), tokenizer, encoding (cached as
    Arrow in RUN/cache, memory-mapped). Rank 0 checks the data, trains the tokenizer and fills
    the cache; the other processes wait, then read what it wrote."""
    d, run_dir = config.data, config.run_path
    for split in (d.train, d.valid):  # a missing file is reported before anything else happens
        if split:
            split_source(split, d.src_lang, d.tgt_lang, d.format)
    if not procs.main:
        distributed.barrier(procs)
    valid_raw = read_split(config, d.valid) if d.valid else None
    if d.on_empty == "error":
        check_no_empty_lines(read_split(config, d.train), d.train, d)
    # a vocabulary file comes with its run (imported, or copied by --init-from): never trained here
    have_tokenizer = all(p.is_file() for p in model_paths(run_dir, config.tokenizer.joint))
    if config.tokenizer.vocabulary == "sentencepiece" and not have_tokenizer:
        log(f"no tokenizer in {run_dir}; training SentencePiece first")
        train_tokenizer(config)
    src_sp, tgt_sp = load_tokenizers(run_dir, config.tokenizer.joint, config.tokenizer.vocabulary)
    train_data = encoded_split(config, d.train, src_sp, tgt_sp, training=True, log=log)
    log(f"train: {len(train_data)} pairs from {d.train}; {describe_drops(train_data, config)}")
    if not len(train_data):
        raise UserError(f"{d.train}: no training pairs left after filtering ({describe_drops(train_data, config)})")
    valid_data = encoded_split(config, d.valid, src_sp, tgt_sp, training=False, log=log) if d.valid else None
    if d.valid and valid_data is not None and valid_data.dropped.get(Drop.TOO_LONG.key):
        if not len(valid_data):
            raise UserError(f"{d.valid}: no validation pair fits the model's {config.model.max_positions} positions "
                            "(EOS or start counted); give a validation split of shorter sentences")
        log(describe_skipped(d.valid, valid_data.dropped[Drop.TOO_LONG.key], config.model.max_positions))
    if procs.main:
        distributed.barrier(procs)
    return TrainData(train_data, valid_data, valid_raw, src_sp, tgt_sp)


def describe_skipped(valid: str, skipped: int, max_positions: int) -> str:
    """The one warning of a validation split with pairs longer than the model's positions."""
    return (f"warning: {valid}: {skipped} pair(s) longer than the model's {max_positions} positions (EOS or start "
            "counted) are left out of the validation loss; validation BLEU translates every line, cut to fit")


def resume_state(config: Config, model: Seq2SeqTransformer, average: torch.optim.swa_utils.AveragedModel | None,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, data: TrainData, procs: Processes,
                 device: torch.device, log: Callable[[str], None]) -> TrainState:
    """Load the newest intact checkpoint into the model (and its moving average), optimizer
    and scaler, restore this process's random generators -> the saved `TrainState`. A run
    saved with a moving average keeps the trained weights in its training state and the
    average in its weights file."""
    ckpt_dir = config.run_path / ckpt.CHECKPOINT_DIR
    name, damaged = ckpt.find_resumable(ckpt_dir)
    for problem in damaged:
        log(f"warning: not resuming from damaged checkpoint {problem}")
    weights = ckpt_dir / f"{name}.safetensors"
    ckpt.check_compatible(weights, config, data.src_sp.get_piece_size(), data.tgt_sp.get_piece_size())
    ckpt.load_weights(model, weights, device)
    saved = ckpt.load_train_state(ckpt_dir / f"{name}.state.pt")
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
    last = config.run_path / ckpt.CHECKPOINT_DIR / "last.safetensors"
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
              init_from: str | Path | None = None) -> tuple[Run, TrainState]:
    """Everything a run needs before its loop: the run directory (locked for as long as the
    returned `Run` lives), data and tokenizer, model, optimizer and scaler, and the state to
    start from (fresh, or the checkpoint's with --resume; --overwrite starts over).
    With `init_from` the model starts from that run's weights, with its architecture and
    tokenizer, and a fresh optimizer, schedule and step count; --resume then continues from
    this run's own checkpoints."""
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    log = log if procs.main else (lambda msg: None)  # only the main process logs
    init = None
    if init_from is not None:
        config, init = init_from_run(config, init_from)
    lock = claim_run_dir(config, resume, overwrite, procs, log)
    try:
        run, state = build_run(config, resume, procs, device, log, init)
    except BaseException:
        if lock is not None:
            runlock.release(lock)
        raise
    if lock is not None:
        weakref.finalize(run, runlock.release, lock)
    return run, state


def build_run(config: Config, resume: bool, procs: Processes, device: torch.device,
              log: Callable[[str], None], init: Init | None = None) -> tuple[Run, TrainState]:
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
    average = averaged_copy(model, t.ema_decay) if t.ema_decay else None
    state = resume_state(config, model, average, optimizer, scaler, data, procs, device, log) if resume else TrainState()

    net: nn.Module = model
    if procs.world > 1:
        # the only buffers are constant position tables: nothing to re-broadcast every forward
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    if t.compile:
        net = torch.compile(net)  # type: ignore[assignment]  # torch's stubs type compile(Module) as a function; it returns a Module
    if procs.main:
        save_config(config, config.run_path / "config.yaml")
    metrics = MetricsLog(config.run_path, state.step if resume else None, t.tensorboard) if procs.main else None
    if metrics is not None and not resume:
        metrics.write({**data.record(), "device": str(device), "precision": resolve_precision(t.precision, device),
                       **({"cpu": cpu_description()} if device.type == "cpu" else {})})
    return Run(config, procs, device, data, model, net, optimizer, scaler, metrics, log, average), state


# --------------------------------------------------------------------------- the steps of the loop


def one_update(run: Run, state: TrainState, batches: list[np.ndarray]) -> Outcome:
    """Take the next update's batches of this epoch's order, accumulate their gradients and
    step the optimizer unless a loss or the gradient is not finite."""
    t, procs, optimizer, scaler = run.config.train, run.procs, run.optimizer, run.scaler
    first = state.batch_in_epoch
    update = batches[first : first + t.update_freq * procs.world]
    state.batch_in_epoch += len(update)
    mine, real = my_batches(update, procs)
    # subword sampling is keyed by each batch's index in the epoch (rank + j * world)
    first += procs.rank if real else 0
    micro = [collate(run.data.train, b, (t.seed, state.epoch, first + j * procs.world)) for j, b in enumerate(mine)]
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(state.step + 1, t)
    optimizer.zero_grad(set_to_none=True)
    sums = accumulate_gradients(run.net, micro, 1.0 if real else 0.0, run.config, run.device, scaler, procs)
    if sums is not None:
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.clip_norm or float("inf"))
        if scaler.is_enabled() and not torch.isfinite(grad_norm):
            scaler.step(optimizer)  # skipped by the scaler, which lowers its scale
            scaler.update()
            state.counters["fp16_overflows"] += 1
            return Outcome.FP16_OVERFLOW
    if sums is None or not torch.isfinite(grad_norm):
        state.counters["skipped_nonfinite"] += 1
        state.consecutive_bad += 1
        return Outcome.NONFINITE
    state.consecutive_bad = 0
    scaler.step(optimizer)
    scaler.update()
    state.step += 1
    if run.average is not None:
        run.average.update_parameters(run.model)
    for key in state.window:
        state.window[key] += sums[key]
    return Outcome.APPLIED


def report_nonfinite(run: Run, state: TrainState) -> None:
    """Warn about a skipped update; stop the run after train.max_nonfinite in a row."""
    run.log(f"warning: non-finite loss or gradients at step {state.step + 1}; batch skipped "
            f"({state.counters['skipped_nonfinite']} so far)")
    if state.consecutive_bad >= run.config.train.max_nonfinite:
        last = run.ckpt_dir / "last.safetensors"
        saved = (f"stopped without saving, so {last} is the last good state" if last.is_file()
                 else "stopped before any checkpoint was saved")
        raise UserError(
            f"non-finite loss or gradients in {state.consecutive_bad} consecutive batches at step {state.step + 1}; "
            f"{saved}; lower train.lr, raise train.warmup_steps or set train.clip_norm"
        )


def log_progress(run: Run, state: TrainState, bar: tqdm) -> None:
    """Write the training record of the logging window that ends at this step; start the next."""
    now = time.time()
    window, lr = state.window, learning_rate(state.step, run.config.train)
    tps = (window["tokens"] + window["src_tokens"]) / max(now - state.window_start, 1e-9)
    record = {
        "step": state.step,
        "epoch": state.epoch + 1,
        "train_loss": window["loss"] / window["tokens"],
        "train_nll": window["nll"] / window["tokens"],
        "lr": lr,
        "tokens_per_s": tps,
        "elapsed_s": state.elapsed + now - state.started,
        **state.counters,
    }
    if run.metrics is not None:
        run.metrics.write(record)
    bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
    state.window, state.window_start = new_window(), now


def save(run: Run, state: TrainState, improved: bool) -> None:
    """Write a checkpoint (rank 0). Each process's RNG state is gathered, so that a resume with
    as many processes is exact."""
    state.rngs = distributed.gather_to_all(run.procs, rng_state())
    if not run.procs.main:
        return
    saved = {**state.state_dict(), "optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict()}
    if run.average is not None:  # the weights file holds the average; the trained weights resume training
        saved["trained_weights"] = run.model.state_dict()
    ckpt.save_checkpoint(run.ckpt_dir, state.step, run.scored, run.config, {"step": state.step, "epoch": state.epoch},
                         saved, best=improved, keep_last=run.config.train.keep_last)


def validate_and_save(run: Run, state: TrainState) -> None:
    """Validation loss (and BLEU), the metrics record, the patience counter, a checkpoint
    (`best` too when the score improved) and the curves."""
    t, procs = run.config.train, run.procs
    record: dict[str, Any] = {"step": state.step, "epoch": state.epoch + 1, "elapsed_s": state.seconds()}
    improved = False
    if run.data.valid is not None:
        record.update(validate(run.scored, run.data.valid, run.config, run.device, procs))
        text = (f"step {state.step}: valid loss {record['valid_loss']:.3f}, nll {record['valid_nll']:.3f}, "
                f"ppl {record['valid_ppl']:.2f}")
        if t.valid_bleu:
            d = run.data
            bleu = validation_bleu(run.scored, d.src_sp, d.tgt_sp, d.valid_raw, run.config, run.device) if procs.main else None
            record["valid_bleu"], record["valid_bleu_signature"] = distributed.from_main(procs, bleu)
            text += f", BLEU {record['valid_bleu']:.2f} ({record['valid_bleu_signature']})"
        score = record["valid_bleu"] if t.best_metric == "bleu" else -record["valid_nll"]
        improved, state.since_best = score > state.best, 0 if score > state.best else state.since_best + 1
        state.best = max(state.best, score)
        run.log(text)
    if run.metrics is not None:
        run.metrics.write(record)
    save(run, state, improved)
    state.validated_at = state.step
    if t.plot and run.metrics is not None:
        plot_curves(read_metrics(run.metrics.path), run.config.run_path / "plots" / "curves.png")
    if t.patience and state.since_best >= t.patience:
        run.log(f"early stopping: no better validation {t.best_metric} in {state.since_best} validations")


def should_stop(run: Run, state: TrainState) -> bool:
    """Patience, steps, epochs or minutes spent. Only the clock can differ between processes:
    rank 0's reading decides for all (a collective, so this is asked once per update)."""
    t = run.config.train
    minutes = distributed.from_main(run.procs, state.seconds() / 60) if t.max_minutes else 0.0
    return (
        (t.patience is not None and state.since_best >= t.patience)
        or (t.max_steps is not None and state.step >= t.max_steps)
        or (t.max_epochs is not None and state.epoch >= t.max_epochs)
        or (t.max_minutes is not None and minutes >= t.max_minutes)
    )


def next_epoch(run: Run, state: TrainState) -> list[np.ndarray]:
    """Move on to the next epoch -> its batches (a pure function of the seed and the epoch)."""
    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    return epoch_batches(run.data.train, run.config.train.max_tokens, run.config.train.seed, state.epoch)


# --------------------------------------------------------------------------- the loop


def train(config: Config, resume: bool = False, log: Callable[[str], None] | None = None, progress: bool = True,
          overwrite: bool = False, init_from: str | Path | None = None) -> Path:
    """Train the model a config describes; return the run directory. `init_from` (a run
    directory or checkpoint) starts from its weights instead of random ones: fine-tuning.

    Under torchrun every process calls this; see the module docstring."""
    procs, device = distributed.start(config.train.device)
    finished = False
    try:
        run, state = setup_run(config, resume, procs, device, log, overwrite, init_from)
        config = run.config  # with --init-from, the architecture and tokenizer of the init run
        t, ckpt_dir = config.train, run.ckpt_dir
        state.started = state.window_start = time.time()
        run.model.train()
        bar = tqdm(total=t.max_steps, initial=state.step, disable=not (progress and procs.main), unit="step",
                   dynamic_ncols=True, file=sys.stderr)
        batches = epoch_batches(run.data.train, t.max_tokens, t.seed, state.epoch)
        try:
            with stop_on_signals() as stop:
                while not should_stop(run, state):
                    if state.batch_in_epoch < len(batches):  # (not so only when resumed at an epoch's end)
                        outcome = one_update(run, state, batches)
                        if outcome is Outcome.NONFINITE:
                            report_nonfinite(run, state)
                        elif outcome is Outcome.APPLIED:
                            bar.update(1)
                            if state.step % t.log_every == 0:
                                log_progress(run, state, bar)
                            if state.step % t.valid_every == 0:
                                validate_and_save(run, state)
                    if state.batch_in_epoch >= len(batches):
                        batches = next_epoch(run, state)
                    if distributed.from_main(procs, stop.requested):  # rank 0's signal stops every process
                        bar.close()
                        save(run, state, improved=False)
                        run.log(f"interrupted at step {state.step}; saved {ckpt_dir / 'last.safetensors'}. "
                                f"Resume with: seq2seq train --config {config.run_path / 'config.yaml'} --resume")
                        raise KeyboardInterrupt
                if (state.validated_at != state.step
                        or not distributed.from_main(procs, (ckpt_dir / "last.safetensors").is_file())):
                    validate_and_save(run, state)
        finally:
            bar.close()
            if run.metrics is not None:
                run.metrics.close()
        minutes = state.seconds() / 60
        run.log(f"finished at step {state.step} (epoch {state.epoch + 1}) in {minutes:.1f} min; run in {config.run_path}")
        finished = True
        return config.run_path
    finally:
        distributed.stop(procs, wait=finished)
