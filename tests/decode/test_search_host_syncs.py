"""The host does not wait for the device inside a decoding step.

On a GPU each read of a device value into Python (item, tolist, bool, a boolean mask, ...)
stalls the host until the device has caught up; the work of a step is then no longer queued
ahead. No GPU is needed to see them: `HostSyncs` counts the operations that would be such a
read, on the CPU, while the searches run as they run on a GPU."""

from __future__ import annotations

import math

import pytest

from conftest import random_sources, tiny_model
from helpers import HostSyncs
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode import search


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
