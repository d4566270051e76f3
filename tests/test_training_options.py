"""Training options: learning-rate schedules, checkpoint averaging."""

import math

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from helpers import make_config, quiet
from seq2seq_cli.cli import app
from seq2seq_cli.config import TrainConfig
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train.loop import learning_rate

runner = CliRunner()


def test_schedules():
    base = dict(lr=1e-3, warmup_steps=10, warmup_init_lr=0.0, max_steps=110)
    inv, cos, const = (TrainConfig(**base, schedule=s, min_lr=1e-5) for s in ("inverse_sqrt", "cosine", "constant"))
    for t in (inv, cos, const):
        assert learning_rate(5, t) == pytest.approx(5e-4)  # linear warmup, shared
        assert learning_rate(10, t) == pytest.approx(1e-3)
    assert learning_rate(40, inv) == pytest.approx(1e-3 * math.sqrt(10 / 40))
    assert learning_rate(60, cos) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)  # half way
    assert learning_rate(110, cos) == pytest.approx(1e-5) and learning_rate(500, cos) == pytest.approx(1e-5)
    assert learning_rate(500, const) == 1e-3
    with pytest.raises(ValueError, match="cosine decays over max_steps"):
        TrainConfig(max_epochs=1, schedule="cosine")


def test_average_last_checkpoints(tmp_path):
    run = quiet(make_config(tmp_path, "avg", max_steps=21, valid_every=7, keep_last=3))
    r = runner.invoke(app, ["average", "--model", str(run), "--last", "3"])
    assert r.exit_code == 0, r.output
    out = run / "checkpoints" / "average-last-3.safetensors"
    parts = [load_file(str(run / "checkpoints" / f"step-{s:08d}.safetensors")) for s in (7, 14, 21)]
    avg = load_file(str(out))
    for k in avg:
        assert torch.allclose(avg[k], (parts[0][k] + parts[1][k] + parts[2][k]) / 3, atol=1e-6)
    assert ckpt.read_metadata(out)["averaged"] == "step-00000021,step-00000014,step-00000007"
    r = runner.invoke(app, ["translate", "--model", str(out)], input="hola\n")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1
    r = runner.invoke(app, ["average", "--model", str(run), "--last", "4"])
    assert r.exit_code != 0
    assert r.stderr.strip() == (
        f"error: {run / 'checkpoints'}: 3 intact step checkpoints, --last 4 asked; keep more with train.keep_last"
    )
