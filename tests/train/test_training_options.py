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
from seq2seq_cli.train.schedule import update_lr
from seq2seq_cli.train.state import TrainState

runner = CliRunner()


def lr_sequence(t: TrainConfig, steps: int, minutes=None, batches: int = 1000) -> list[float]:
    """The rates `update_lr` gives updates 1..steps, the clock reading `minutes(step)`."""
    state, plan, out = TrainState(), list(range(batches)), []
    for step in range(1, steps + 1):
        state.minutes = minutes(step) if minutes else 0.0
        state.batch_in_epoch += 1  # (one_update takes the update's batches, then its rate)
        out.append(update_lr(t, state, plan))
        state.step = step
    return out


def test_schedules():
    base = dict(lr=1e-3, warmup_steps=10, warmup_init_lr=0.0, max_steps=110)
    inv, cos, lin, const = (TrainConfig(**base, schedule=s, min_lr=1e-5)
                            for s in ("inverse_sqrt", "cosine", "linear", "constant"))
    rates = {t.schedule: lr_sequence(t, 500) for t in (inv, cos, lin, const)}
    for r in rates.values():
        assert r[4] == pytest.approx(5e-4)  # update 5: linear warmup, shared
        assert r[9] == pytest.approx(1e-3)  # update 10: the peak
    assert rates["inverse_sqrt"][39] == pytest.approx(1e-3 * math.sqrt(10 / 40))
    assert rates["cosine"][59] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)  # half way from warmup to max_steps
    assert rates["linear"][59] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)
    assert rates["linear"][34] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.75)  # a quarter of the way
    for s in ("cosine", "linear"):
        assert rates[s][109] == pytest.approx(1e-5) and rates[s][499] == pytest.approx(1e-5)
    assert rates["constant"][499] == 1e-3


def test_decay_ends_where_the_first_budget_runs_out():
    """With max_minutes, cosine and linear decay over the clock when it runs out before
    max_steps: from the minute warmup ended to max_minutes."""
    t = TrainConfig(lr=1e-3, warmup_steps=10, warmup_init_lr=0.0, max_steps=6000, max_minutes=10,
                    schedule="linear", min_lr=0.0)
    minutes = lambda step: 0.2 * step  # noqa: E731 (update 10 ends warmup at minute 2)
    r = lr_sequence(t, 50, minutes)
    assert r[9] == pytest.approx(1e-3)
    assert r[29] == pytest.approx(1e-3 * 0.5)  # minute 6: half way from minute 2 to 10
    assert r[49] == pytest.approx(0.0)  # minute 10
    # the steps budget decides when it runs out first
    fast = lr_sequence(t.model_copy(update={"max_steps": 30}), 30, lambda step: 0.001 * step)
    assert fast[19] == pytest.approx(1e-3 * 0.5)  # update 20: half way from update 10 to 30
    # and max_epochs when it does (100 batches an epoch, 1 epoch)
    epoch = lr_sequence(t.model_copy(update={"max_steps": None, "max_minutes": None, "max_epochs": 1}), 100,
                        batches=100)
    assert epoch[54] == pytest.approx(1e-3 * 0.5)  # after 55 of 100 batches: half way from 10 to 100


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
