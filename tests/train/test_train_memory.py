"""The trainer's memory policy: oneDNN's and ideep's caches of compiled kernels are bounded
before anything computes, so that a trainer meeting thousands of batch shapes does not keep a
kernel for each (a capacity the user set in the environment is kept); the output layer sees a
batch's targets in blocks of rows, so that its largest tensors come in a few sizes."""

from __future__ import annotations

import os

import numpy as np
import torch

from conftest import tiny_model
from helpers import make_config, quiet
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.batching import Batch, target_rows
from seq2seq_cli.device import KERNEL_CACHE, KERNEL_CACHE_VARIABLES
from seq2seq_cli.ids import BOS, PAD
from seq2seq_cli.train import loop
from seq2seq_cli.train.loss import ROW_BLOCK, batch_loss, label_smoothed_nll


def capacities_at_setup(tmp_path, monkeypatch) -> dict[str, str | None]:
    """Train a few updates; the kernel cache variables as they were when the run was set up,
    before the model computed anything."""
    seen: dict[str, str | None] = {}
    real = loop.setup_run

    def spy(*args, **kwargs):
        seen.update({name: os.environ.get(name) for name in KERNEL_CACHE_VARIABLES})
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "setup_run", spy)
    quiet(make_config(tmp_path, "run", max_steps=2, valid_every=2))
    return seen


def test_training_bounds_the_kernel_caches_before_it_computes(tmp_path, monkeypatch):
    for name in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert capacities_at_setup(tmp_path, monkeypatch) == {name: str(KERNEL_CACHE) for name in KERNEL_CACHE_VARIABLES}


def test_a_capacity_set_in_the_environment_is_kept(tmp_path, monkeypatch):
    first, *others = KERNEL_CACHE_VARIABLES
    monkeypatch.setenv(first, "7")
    for name in others:
        monkeypatch.delenv(name, raising=False)
    assert capacities_at_setup(tmp_path, monkeypatch) == {first: "7", **{name: str(KERNEL_CACHE) for name in others}}


def test_the_output_layer_sees_the_targets_in_blocks_of_rows_that_add_no_loss_and_no_gradient(tmp_path):
    """A batch's target positions reach the output layer padded to a multiple of ROW_BLOCK rows
    (so that its largest tensors come in a few sizes); the loss, the token count and every
    gradient are those of the unpadded positions."""
    torch.manual_seed(0)
    model = tiny_model(vocab=40).train()
    config = load_config(make_config(tmp_path, "run", precision="fp32", label_smoothing=0.1))
    lengths = np.array([5, 3, 7])  # targets per row, EOS counted
    width = int(lengths.max())
    tgt_out = torch.full((3, width), PAD)
    for i, n in enumerate(lengths):
        tgt_out[i, :n] = torch.randint(4, 40, (n,))
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt_out[:, :-1]], dim=1).masked_fill(tgt_out == PAD, PAD)
    b = Batch(torch.randint(4, 40, (3, 6)), tgt_in, tgt_out, 18, int(lengths.sum()), target_rows(lengths, width))

    seen: list[int] = []
    forward = model.forward
    model.forward = lambda src, tgt, rows=None: (seen.append(rows.numel()), forward(src, tgt, rows))[1]
    padded = batch_loss(model, b, config, torch.device("cpu"))
    padded[0].backward()
    padded_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    assert seen == [ROW_BLOCK] and lengths.sum() < ROW_BLOCK

    logits = forward(b.src, b.tgt_in, b.tgt_rows)
    plain = label_smoothed_nll(logits, b.tgt_out.reshape(-1)[b.tgt_rows], 0.1)
    plain[0].backward()
    assert int(padded[2]) == int(plain[2]) == lengths.sum()
    assert torch.allclose(padded[0], plain[0]) and torch.allclose(padded[1], plain[1])
    assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(padded_grads, model.parameters()))
