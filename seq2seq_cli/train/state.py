"""`TrainState`: where training stands, the record a checkpoint's training state holds, and
the random generators saved with it."""

from __future__ import annotations

import ast
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from seq2seq_cli.train.distributed import Processes


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
    decay_from: float | None = None  # share of the budget spent when warmup ended (cosine, linear)
    window: dict[str, float] = field(default_factory=new_window)
    counters: dict[str, int] = field(default_factory=new_counters)
    rngs: list[dict[str, Any]] = field(default_factory=list)  # each process's generators, at the last save
    started: float = field(default_factory=time.time)  # when this process's loop began
    window_start: float = field(default_factory=time.time)
    consecutive_bad: int = 0  # non-finite updates in a row
    validated_at: int = 0  # the step of the last validation (or the start)
    minutes: float = 0.0  # training minutes at the last stop check (rank 0's clock)
    lr: float = 0.0  # the learning rate of the last update

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
            "decay_from": self.decay_from,
            "window": self.window,
            "counters": self.counters,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best, self.since_best, self.elapsed = state["best"], state["since_best"], state["elapsed"]
        self.window, self.counters = state["window"], state["counters"]
        self.decay_from = state.get("decay_from")
        self.rngs = state.get("rng_ranks", [state["rng"]])
        self.validated_at = self.step

    def rng_for(self, procs: Processes) -> dict[str, Any]:
        """This process's saved generators; rank 0's when the run was saved by another number
        of processes."""
        return self.rngs[procs.rank] if len(self.rngs) == procs.world else self.rngs[0]


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



class DeviceTally:
    """The sums of the updates since the host last read them, kept on the training device so
    that an update reads nothing back: the smoothed loss, the nll and the token counts of the
    updates applied, the updates skipped (a loss or the gradient not finite), the skipped ones
    in a row now, and the most in a row since the last reading. `read()` is the one host sync."""

    FIELDS = ("loss", "nll", "tokens", "src_tokens", "skipped", "in_a_row", "most_in_a_row")

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(len(self.FIELDS), dtype=torch.float64, device=device)
        self.pending = False

    def add(self, losses: Tensor, tokens: int, src_tokens: int, bad: Tensor) -> None:
        """One update: `losses` (2,) its loss and nll sums, `bad` () whether it was skipped."""
        skipped = bad.double()
        kept = torch.where(bad, 0.0, losses.double())  # a skipped update's losses may be NaN
        applied = 1.0 - skipped
        in_a_row = (self.sums[5] + 1.0) * skipped
        self.sums[:5] += torch.stack([kept[0], kept[1], applied * tokens, applied * src_tokens, skipped])
        self.sums[5] = in_a_row
        self.sums[6] = torch.maximum(self.sums[6], in_a_row)
        self.pending = True

    def read(self) -> dict[str, float] | None:
        """What the updates since the last reading did (None when there were none); starts the next tally."""
        if not self.pending:
            return None
        values = dict(zip(self.FIELDS, self.sums.tolist()))
        self.sums[:5] = 0.0
        self.sums[6] = self.sums[5]
        self.pending = False
        return values
