"""The host does not wait for the device inside a training update or a decoding step.

On a GPU each read of a device value into Python (item, tolist, bool, a boolean mask, ...)
stalls the host until the device has caught up; the work of a step is then no longer queued
ahead. No GPU is needed to see them: `HostSyncs` counts the operations that would be such a
read, on the CPU, while the trainer and the searches run as they run on a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import random_sources, tiny_model
from helpers import HostSyncs, make_config
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.config_load import load_config
from seq2seq_cli.decode import search
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


def looks(steps: int, every: int) -> int:
    return math.ceil((steps + 1) / every) + 1


@pytest.mark.parametrize("beam", [1, 4])
def test_a_search_reads_the_device_only_when_it_looks(beam, monkeypatch):
    """With the GPU's cadence (a look every 8 steps), a batch of 12 sentences makes one read per
    batch (its longest output limit, which sizes the cache) and, per look, one read of which
    sentences are done and four of the finished ones' hypotheses; the steps between looks
    make none. Before, each step read about six times."""
    model = tiny_model(seed=2, vocab=40)
    src = random_sources(12, seed=4)
    opts = DecodeConfig(beam_size=beam, max_len_a=1.0, max_len_b=12)
    steps = 0
    real_step = search.step_log_probs

    def counting_step(*args, **kwargs):
        nonlocal steps
        steps += 1
        return real_step(*args, **kwargs)

    monkeypatch.setattr(search, "step_log_probs", counting_step)
    with HostSyncs() as s:
        found = search.search(model, src, opts, every=search.LOOK_EVERY)
    assert steps >= 16 and all(h[0].tokens or h[0].log_prob < 0 for h in found)
    assert s.count <= 1 + 5 * looks(steps, search.LOOK_EVERY), (steps, s.where)


@pytest.mark.parametrize("beam", [1, 4])
def test_looking_less_often_finds_the_same_hypotheses(beam):
    """Sentences that are done ride along, ignored, until the host looks: every 8 steps gives
    the hypotheses of every step (the batch's matrices differ in rows, so scores agree to rounding)."""
    for seed in (0, 2, 3):
        model = tiny_model(seed=seed, vocab=40)
        src = random_sources(9, seed=seed)
        opts = DecodeConfig(beam_size=beam)
        each = search.search(model, src, opts, nbest=1 if beam == 1 else 2, every=1)
        eight = search.search(model, src, opts, nbest=1 if beam == 1 else 2, every=8)
        assert [[h.tokens for h in hs] for hs in each] == [[h.tokens for h in hs] for hs in eight]
        for a, b in zip(each, eight):
            for x, y in zip(a, b):
                assert x.score == pytest.approx(y.score, rel=1e-5)
