"""Checkpoints that never lose a run: exact resume, integrity, fallback, refusal of unsafe or
mismatched files, non-finite losses."""

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from helpers import assert_same, make_config, quiet, train_records
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.errors import UserError
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train import loop as train_module
from seq2seq_cli.train import loss as loss_module
from seq2seq_cli.train.loop import train

runner = CliRunner()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 30-step run."""
    tmp = tmp_path_factory.mktemp("reference")
    return quiet(make_config(tmp, "ref"))


@pytest.mark.parametrize("stop_at", [5, 7, 16])
def test_interrupted_and_resumed_run_is_bit_identical(reference, tmp_path, stop_at):
    cfg = make_config(tmp_path, "run")
    quiet(cfg, False, f"train.max_steps={stop_at}")
    run = quiet(cfg, True)
    assert_same(reference, run)


def test_checkpoint_files_and_manifest(reference):
    d = reference / "checkpoints"
    names = ckpt.step_names(d)
    assert len(names) == 2 and names[0] == "step-00000030"  # keep_last: 2
    manifest = json.loads((d / "last.json").read_text())
    assert manifest["step"] == 30 and manifest["format_version"] == ckpt.FORMAT_VERSION
    assert manifest["sha256"]["weights"] == ckpt.sha256(d / "last.safetensors")
    assert ckpt.verify_checkpoint(d, "best", need_state=False) is None
    meta = ckpt.read_metadata(d / "last.safetensors")
    assert meta["step"] == "30" and json.loads(meta["config"])["model"]["d_model"] == 32
    state = torch.load(d / "last.state.pt", weights_only=True)
    assert state["step"] == 30 and "optimizer" in state and "rng" in state


def test_corrupted_last_falls_back_to_newest_intact_checkpoint(reference, tmp_path):
    cfg = make_config(tmp_path, "run")
    quiet(cfg, False, "train.max_steps=16")
    d = tmp_path / "run" / "checkpoints"
    data = bytearray((d / "last.safetensors").read_bytes())
    data[-10:] = b"\x00" * 10  # flip the last bytes of the weights
    (d / "step-00000016.safetensors").unlink()  # last was a hard link: corrupt a separate copy
    (d / "last.safetensors").write_bytes(bytes(data))
    messages = []
    run = train(load_config(cfg), resume=True, progress=False, log=messages.append)
    assert any("not resuming from damaged checkpoint last: last.safetensors is corrupted" in m for m in messages)
    assert any("resumed from" in m and "step-00000014" in m for m in messages)
    assert_same(reference, run)


def test_corrupted_or_truncated_checkpoint_is_refused_on_load(reference, tmp_path):
    run = tmp_path / "copy"
    (run / "checkpoints").mkdir(parents=True)
    for f in (reference / "checkpoints").glob("last.*"):
        (run / "checkpoints" / f.name).write_bytes(f.read_bytes())
    (run / "spm.model").write_bytes((reference / "spm.model").read_bytes())
    w = run / "checkpoints" / "last.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    r = runner.invoke(app, ["translate", "-m", str(run)], input="hola\n")
    assert r.exit_code != 0
    assert r.stderr.strip() == f"error: {w}: last.safetensors is corrupted or truncated (sha256 does not match last.json)"
    (run / "checkpoints" / "last.json").unlink()  # without a manifest the file format itself is checked
    r = runner.invoke(app, ["translate", "-m", str(run)], input="hola\n")
    assert r.exit_code != 0 and r.stderr.startswith(f"error: {w}: not a readable checkpoint")
    assert len(r.stderr.strip().splitlines()) == 1


class _Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path):
    cfg = make_config(tmp_path, "run")
    quiet(cfg, False, "train.max_steps=7")
    d = tmp_path / "run" / "checkpoints"
    marker = tmp_path / "pwned"
    state = d / "last.state.pt"
    state.unlink()  # break the hard link, then plant the payload
    with open(state, "wb") as f:
        pickle.dump({"step": 7, "x": _Payload(str(marker))}, f)
    manifest = json.loads((d / "last.json").read_text())
    manifest["sha256"]["state"] = ckpt.sha256(state)  # a forger can fix the hash; loading must still be safe
    (d / "last.json").unlink()
    (d / "last.json").write_text(json.dumps(manifest))
    r = runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--no-progress"])
    assert r.exit_code != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [errors[0]] and f"{state}: training state could not be loaded safely" in errors[0]
    assert not marker.exists()


def test_checkpoint_of_another_architecture_is_refused_with_the_mismatch(tmp_path):
    cfg = make_config(tmp_path, "run")
    quiet(cfg, False, "train.max_steps=7")
    r = runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--no-progress", "--set", "model.ffn_size=48"])
    assert r.exit_code != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert "checkpoint does not match: model.ffn_size 64 in the checkpoint, 48 in the config" in errors[0]


def test_nonfinite_losses_are_skipped_then_stop_training(tmp_path, monkeypatch):
    real = loss_module.label_smoothed_nll
    calls = {"n": 0}

    def flaky(logits, target, eps, bad=frozenset({3, 4})):
        calls["n"] += 1
        loss, nll, n = real(logits, target, eps)
        return (loss * float("nan"), nll, n) if calls["n"] in bad else (loss, nll, n)

    monkeypatch.setattr(loss_module, "label_smoothed_nll", flaky)
    messages = []
    run = train(load_config(make_config(tmp_path, "run")), progress=False, log=messages.append)
    assert sum("non-finite loss" in m for m in messages) == 2
    last = train_records(run)[-1]
    assert last["step"] == 30 and last["skipped_nonfinite"] == 2

    calls["n"] = 0
    monkeypatch.setattr(loss_module, "label_smoothed_nll", lambda *a, **k: flaky(*a, **k, bad=frozenset(range(12, 99))))
    cfg = make_config(tmp_path, "stop", max_nonfinite=4)
    # every loss from the 12th on (validation's included) fails; the host reads the updates' tally
    # every 3 updates (log_every) and at each save: it stops at the first reading with 4 in a row
    with pytest.raises(UserError, match=r"non-finite loss or gradients in \d+ consecutive updates up to step \d+") as caught:
        train(load_config(cfg), progress=False, log=lambda _: None)
    in_a_row, step = map(int, re.search(r"in (\d+) consecutive updates up to step (\d+)", str(caught.value)).groups())
    assert 4 <= in_a_row < 4 + 3 and step % 3 == 0
    d = tmp_path / "stop" / "checkpoints"
    assert ckpt.verify_checkpoint(d, "last", need_state=True) is None
    assert json.loads((d / "last.json").read_text())["step"] == 7  # the last save before the failures
    assert all(torch.isfinite(w).all() for w in load_file(str(d / "last.safetensors")).values())


def test_fp16_overflow_is_handled_by_the_scaler_and_resume_stays_exact(tmp_path, monkeypatch):
    """A huge initial loss scale overflows fp16 gradients: the scaler skips those steps and
    lowers the scale; training still completes, and an interrupted fp16 run resumes exactly
    (the scaler's state is in the checkpoint)."""
    import functools

    monkeypatch.setattr(train_module.torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**40))
    common = ("train.precision=fp16",)
    ref = quiet(make_config(tmp_path, "ref", max_steps=12), False, *common)
    records = train_records(ref)
    assert records[-1]["step"] == 12
    state = torch.load(ref / "checkpoints" / "last.state.pt", weights_only=True)
    assert state["scaler"]["scale"] < 2.0**40 and state["counters"]["fp16_overflows"] > 0
    cfg = make_config(tmp_path, "run", max_steps=12)
    quiet(cfg, False, *common, "train.max_steps=5")
    assert_same(ref, quiet(cfg, True, *common))


def test_a_decaying_schedule_resumes_exactly(tmp_path, monkeypatch):
    """`linear` over an epochs budget: the decay starts where warmup ended, a share of the
    budget the checkpoint keeps (no steps budget to derive it from), so a run stopped after
    warmup and resumed equals the uninterrupted one."""
    common = ("train.schedule=linear", "train.max_steps=null", "train.max_epochs=2")
    ref = quiet(make_config(tmp_path, "ref"), False, *common)
    assert train_records(ref)[-1]["lr"] < 0.2 * load_config(make_config(tmp_path, "x")).train.lr
    original = train_module.should_stop
    monkeypatch.setattr(train_module, "should_stop", lambda run, state: original(run, state) or state.step >= 9)
    cfg = make_config(tmp_path, "run")
    quiet(cfg, False, *common)
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.state.pt", weights_only=True)["step"] == 9
    monkeypatch.setattr(train_module, "should_stop", original)
    assert_same(ref, quiet(cfg, True, *common))


def test_average_written_outside_the_run_is_refused_and_the_run_stays_usable(reference, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "avg.safetensors"
    r = runner.invoke(app, ["average", "-m", str(reference), "--last", "2", "-o", str(out)])
    assert r.exit_code != 0 and not out.exists() and list(elsewhere.iterdir()) == []
    errors = r.stderr.strip().splitlines()
    assert errors == [(
        f"error: {out}: an averaged checkpoint is written into its run's checkpoints directory "
        f"{reference / 'checkpoints'}, where --model finds the run's tokenizer "
        "(to use it elsewhere, copy the whole run directory)"
    )]
    inside = reference / "checkpoints" / "avg-outside-test.safetensors"
    r = runner.invoke(app, ["average", "-m", str(reference), "--last", "2", "-o", str(inside)])
    assert r.exit_code == 0, r.output
    try:
        r = runner.invoke(app, ["translate", "-m", str(inside)], input="hola\n")
        assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1, r.output
    finally:
        inside.unlink()


def test_checkpoint_file_outside_a_run_is_refused_with_what_to_give(reference, tmp_path):
    stray = tmp_path / "last.safetensors"
    stray.write_bytes((reference / "checkpoints" / "last.safetensors").read_bytes())
    r = runner.invoke(app, ["translate", "-m", str(stray)], input="hola\n")
    assert r.exit_code != 0
    assert r.stderr.strip().splitlines() == [(
        f"error: {stray}: a checkpoint file is used from its run directory (RUN/checkpoints/last.safetensors), "
        "where its tokenizer lies; give the run directory or a checkpoint inside it"
    )]
