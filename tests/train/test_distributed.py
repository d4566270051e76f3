"""Training on two processes (torchrun, gloo on CPU) follows one process that accumulates the
same batches; only rank 0 writes; a two-process run resumes from its checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from helpers import make_config, quiet, train_records

STEPS = 12  # the tiny corpus makes 21 batches an epoch: step 11 has one batch, for rank 0 only


def torchrun(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "seq2seq_cli", "train", "--config", str(cfg), "--no-progress",
           "--set", "train.threads=1", "--set", "train.device=cpu", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def files(run: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and "cache" not in p.parts}


def test_two_processes_match_one_process_accumulating_their_batches(tmp_path):
    common = dict(max_steps=STEPS, log_every=1, valid_every=5, clip_norm=1.0)
    single = quiet(make_config(tmp_path, "single", update_freq=2, **common), False, "model.dropout=0.0")

    cfg = make_config(tmp_path, "ddp", update_freq=1, **common)
    first = torchrun(cfg, "--set", "model.dropout=0.0", "--set", "train.max_steps=5")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = torchrun(cfg, "--set", "model.dropout=0.0", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "2 processes (cpu)" in first.stderr and "resumed from" in resumed.stderr

    ddp = tmp_path / "ddp"
    one, two = train_records(single), train_records(ddp)
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))  # each step logged once
    for a, b in zip(one, two, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4), a["step"]
        assert b["train_nll"] == pytest.approx(a["train_nll"], rel=1e-4), a["step"]
        assert b["epoch"] == a["epoch"]
    assert two[-1]["epoch"] == 2  # the epoch boundary (and its one-batch update) was crossed
    # rank 0 alone wrote: the same files as the one-process run, nothing per rank
    assert files(ddp) == files(single)


def test_batches_are_dealt_round_robin_and_an_idle_process_gets_a_weightless_stand_in():
    from seq2seq_cli.train.distributed import Processes
    from seq2seq_cli.train.loop import my_batches

    update = [np.array([i]) for i in range(3)]  # update_freq 2 on 2 processes, the epoch's last: one short
    zero, one = Processes(rank=0, world=2), Processes(rank=1, world=2)
    assert [int(b[0]) for b in my_batches(update, zero)[0]] == [0, 2]
    assert [int(b[0]) for b in my_batches(update, one)[0]] == [1]
    assert my_batches(update[:1], zero) == (update[:1], True)
    assert my_batches(update[:1], one) == (update[:1], False)  # runs batch 0 with weight 0


def test_accumulation_under_ddp_skips_the_all_reduce_of_all_but_the_last_batch_compiled_or_not(tmp_path, monkeypatch):
    """DDP's no_sync is entered for every micro-batch but the last, also when the DDP module is
    wrapped by torch.compile (the gradients are then summed across processes once per update)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from conftest import tiny_model
    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.data.batching import Batch
    from seq2seq_cli.train.distributed import Processes
    from seq2seq_cli.train.loop import accumulate_gradients, wrapped_ddp

    entered: list[int] = []
    real_no_sync = DDP.no_sync

    @contextlib.contextmanager
    def recording_no_sync(self):
        entered.append(1)
        with real_no_sync(self):
            yield

    monkeypatch.setattr(DDP, "no_sync", recording_no_sync)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = DDP(tiny_model().train())
        config = load_config(make_config(tmp_path, "run"))
        src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
        tgt = torch.tensor([[2, 5, 6], [2, 7, 0]])
        micro = [Batch(src, tgt, tgt.roll(-1, 1), 7, 5)] * 3
        for net in (ddp, torch.compile(ddp, backend="eager")):
            assert wrapped_ddp(net) is ddp
            entered.clear()
            scaler = torch.amp.GradScaler("cpu", enabled=False)
            sums = accumulate_gradients(net, micro, 1.0, config, torch.device("cpu"), scaler, Processes())
            assert sums is not None and entered == [1, 1]
    finally:
        dist.destroy_process_group()
    assert wrapped_ddp(tiny_model()) is None
