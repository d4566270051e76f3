"""The host does not wait for the device inside a training update.

On a GPU each read of a device value into Python (item, tolist, bool, a boolean mask, ...)
stalls the host until the device has caught up; the work of a step is then no longer queued
ahead. No GPU is needed to see them: `HostSyncs` counts the operations that would be such a
read, on the CPU, while the trainer runs as it runs on a GPU."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers import HostSyncs, make_config
from seq2seq_cli.config_load import load_config
from seq2seq_cli.train import loop


def test_the_counter_sees_each_kind_of_read():
    x = torch.arange(6.0)
    with HostSyncs() as s:
        x.sum().item()
        x.tolist()
        bool(x.any())
        x[x > 2]
        x[x > 4] = 0.0
        x.nonzero()
        torch.where(x > 1, x, 0.0).sum(0, keepdim=True) * 2  # no read
    assert [w.split(" at ")[0] for w in s.where] == ["item", "tolist", "__bool__", "index[bool mask]",
                                                     "index_put_[bool mask]", "nonzero"]


def counted_calls(monkeypatch, module, name: str) -> list[list[str]]:
    """Replace module.name by a wrapper recording the syncs of each call."""
    real = getattr(module, name)
    calls: list[list[str]] = []

    def wrapper(*args, **kwargs):
        with HostSyncs() as s:
            out = real(*args, **kwargs)
        calls.append(s.where)
        return out

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_a_training_update_reads_nothing_and_a_logging_one_reads_once(tmp_path: Path, monkeypatch):
    """12 updates of the tiny model with a moving average of the weights: the updates make no
    host read (the losses, token counts, skip decision and counters stay on the device); the
    log record every 4 updates reads them once."""
    updates = counted_calls(monkeypatch, loop, "one_update")
    logs = counted_calls(monkeypatch, loop, "log_progress")
    cfg = make_config(tmp_path, "run", max_steps=12, valid_every=12, log_every=4)
    loop.train(load_config(cfg, ["train.ema_decay=0.99"]), progress=False, log=lambda _: None)
    assert len(updates) == 12 and len(logs) == 3
    assert updates == [[]] * 12, updates[0]
    assert [len(w) for w in logs] == [1, 1, 1], logs
