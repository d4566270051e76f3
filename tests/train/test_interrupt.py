"""Ctrl-C and SIGTERM during training: the signal is taken between updates, once an update,
its validation and its saves are done, so `last` resumes to the very run that was never
interrupted (weights, training and validation records, `best`)."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import assert_same, make_config, quiet
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train import loop as train_module
from seq2seq_cli.train import loss as loss_module
from seq2seq_cli.train import validation

runner = CliRunner()
SETTINGS = {"max_steps": 16}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 16-step run (validation at steps 7, 14 and 16, so best moves)."""
    return quiet(make_config(tmp_path_factory.mktemp("reference"), "ref", **SETTINGS))


def records(run: Path) -> list[dict]:
    """Every metrics record, timings aside."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if k not in ("elapsed_s", "tokens_per_s")})
    return out


def assert_resumed_exactly(reference: Path, run: Path) -> None:
    assert_same(reference, run)
    assert records(run) == records(reference)
    for name in ("best", "last"):
        assert (json.loads((run / "checkpoints" / f"{name}.json").read_text())["step"]
                == json.loads((reference / "checkpoints" / f"{name}.json").read_text())["step"])


def signal_on_call(monkeypatch, owner, name: str, call: int, signum: int, when=lambda *a, **k: True) -> list[int]:
    """Replace owner.name by a wrapper that sends `signum` to this process at its `call`-th
    call (counting calls for which `when` holds), then carries on -> the calls so far."""
    real = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        if when(*args, **kwargs):
            calls[0] += 1
            if calls[0] == call:
                os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def interrupted_then_resumed(cfg: Path, monkeypatch, messages: list[str]) -> Path:
    with pytest.raises(KeyboardInterrupt):
        train_module.train(load_config(cfg), progress=False, log=messages.append)
    monkeypatch.undo()
    ckpt_dir = load_config(cfg).run_path / "checkpoints"
    for name in ("last", "best"):  # both whole at the moment of the stop
        assert ckpt.verify_checkpoint(ckpt_dir, name, need_state=name == "last") is None
    return quiet(cfg, True)


# where the signal lands: in the middle of an update's forward pass, in a validation, while the
# checkpoint of a validation is written, while `best` is pointed at a new best
POINTS = {
    "update": (loss_module, "label_smoothed_nll", 10, signal.SIGINT, lambda *a, **k: True),
    "validation": (validation, "validation_sums", 2, signal.SIGTERM, lambda *a, **k: True),
    "checkpoint": (ckpt, "save_weights", 1, signal.SIGTERM, lambda *a, **k: True),
    "best": (ckpt, "_link_set", 1, signal.SIGINT, lambda ckpt_dir, src, dst, roles: dst == "best" and src != "step-00000007"),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_signal_anywhere_saves_last_and_resumes_exactly(reference, tmp_path, monkeypatch, point):
    owner, name, call, signum, when = POINTS[point]
    cfg = make_config(tmp_path, "run", **SETTINGS)
    calls = signal_on_call(monkeypatch, owner, name, call, signum, when)
    messages: list[str] = []
    run = interrupted_then_resumed(cfg, monkeypatch, messages)
    assert calls[0] >= call  # the signal was sent
    stopped = [m for m in messages if m.startswith("interrupted at step")]
    assert len(stopped) == 1 and f"saved {run / 'checkpoints' / 'last.safetensors'}" in stopped[0]
    assert_resumed_exactly(reference, run)


def test_the_handlers_are_restored_after_training(tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    quiet(make_config(tmp_path, "run", max_steps=3))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_ctrl_c_exits_130_with_one_line(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, "run", **SETTINGS)
    signal_on_call(monkeypatch, validation, "validation_sums", 1, signal.SIGINT)
    r = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress"])
    assert r.exit_code == 130
    run = tmp_path / "run"
    stopped = [line for line in r.stderr.splitlines() if "interrupted" in line]
    assert stopped == [f"interrupted at step 7; saved {run / 'checkpoints' / 'last.safetensors'}. "
                       f"Resume with: seq2seq train --config {run / 'config.yaml'} --resume"]
    assert "Traceback" not in r.stderr
    assert ckpt.verify_checkpoint(run / "checkpoints", "last", need_state=True) is None


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_signals_at_random_moments_resume_exactly(reference, tmp_path, seed):
    """SIGINT or SIGTERM from another thread at a random moment of each of three runs, each
    followed by a resume: the run ends as the uninterrupted one did. (A signal that lands
    outside the training loop, where the test's own do-nothing handlers are in place, is
    ignored: that run then goes on.)"""
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    rng = random.Random(seed)
    cfg = make_config(tmp_path, "run", **SETTINGS)
    run = tmp_path / "run"
    try:
        for _ in range(3):
            resume = (run / "checkpoints" / "last.json").is_file()
            signum = rng.choice([signal.SIGINT, signal.SIGTERM])
            timer = threading.Timer(rng.uniform(0.5, 6.0), os.kill, (os.getpid(), signum))
            timer.start()
            try:
                quiet(cfg, resume)
            except KeyboardInterrupt:  # stopped by the signal: resumed next time round
                pass
            finally:
                timer.cancel()
                timer.join()
        quiet(cfg, (run / "checkpoints" / "last.json").is_file())
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert_resumed_exactly(reference, run)
