"""Multi-process training on torch.distributed: which process this is, and the few
collectives the training loop needs.

Launched by `torchrun` (WORLD_SIZE, RANK and LOCAL_RANK set in the environment), training
joins a process group: NCCL when the processes train on CUDA, gloo on CPU. Each process then
trains on its own share of every update's batches; rank 0 alone writes files, into a run
directory every process must see (on several machines: a shared filesystem, mounted at the
same path; `check_shared` refuses one that is not). Without those variables (or with
WORLD_SIZE=1) everything here is a no-op and training is one process.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from seq2seq_cli.device import pick_device
from seq2seq_cli.errors import UserError


@dataclass(frozen=True)
class Processes:
    """This process's place among the training processes."""

    rank: int = 0  # 0 .. world - 1, across all nodes
    world: int = 1  # number of training processes
    local_rank: int = 0  # index on this node: picks the GPU
    owns_group: bool = False  # this process created the process group (and destroys it)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, metrics, plots and logs."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise UserError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def start(device_name: str) -> tuple[Processes, torch.device]:
    """Join the process group torchrun describes (if any) -> (this process, its device)."""
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    device = pick_device(device_name, local_rank if world > 1 else 0)
    if world == 1:
        return Processes(), device
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Processes(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, owns_group=owns), device


def stop(procs: Processes, wait: bool) -> None:
    """Leave the process group, after every process got here when `wait` (a normal end; not
    after an error or an interrupt, where the others may never arrive)."""
    if procs.world > 1:
        if wait:
            dist.barrier()
        if procs.owns_group:
            dist.destroy_process_group()


def barrier(procs: Processes) -> None:
    if procs.world > 1:
        dist.barrier()


def sum_across(procs: Processes, values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of `values` over all processes (in place; returned for chaining)."""
    if procs.world > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def from_main(procs: Processes, value: Any) -> Any:
    """Rank 0's `value` on every process (a decision every process must take alike)."""
    if procs.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_all(procs: Processes, value: Any) -> list[Any]:
    """Every process's `value`, in rank order, on every process."""
    if procs.world == 1:
        return [value]
    out: list[Any] = [None] * procs.world
    dist.all_gather_object(out, value)
    return out


def check_shared(procs: Processes, run_dir: Path) -> None:
    """Refuse a run directory that some process does not share with rank 0 (a disk local to
    each machine, or another run_dir in its config): rank 0 writes the tokenizer, the encoded
    data and the checkpoints there, and every other process reads them. Rank 0 writes a file
    of a new name, every process looks for it; each raises the same UserError when one did
    not see it."""
    if procs.world == 1:
        return
    token = from_main(procs, secrets.token_hex(8))
    probe = Path(run_dir) / f".shared-{token}"
    if procs.main:
        probe.write_text(token, encoding="utf-8")
    barrier(procs)
    try:
        sees = probe.is_file() and probe.read_text(encoding="utf-8") == token
    except OSError:
        sees = False
    try:
        seen = gather_to_all(procs, (sees, socket.gethostname()))
    finally:
        if procs.main:
            probe.unlink(missing_ok=True)
    blind = [f"{rank} on {host}" for rank, (sees, host) in enumerate(seen) if not sees]
    if blind:
        raise UserError(
            f"{run_dir}: run directory is not shared by all training processes: process {', '.join(blind)} "
            f"does not see what process 0 on {seen[0][1]} writes there; put run_dir on a filesystem every "
            "machine mounts at the same path (see 'Several machines' in README.md)"
        )
