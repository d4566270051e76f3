"""Training that cannot go on stops with one line naming what is wrong: a model too large
for the memory there is, a disk that fills up while a checkpoint or the metrics are written."""

from __future__ import annotations

import errno

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError
from typer.testing import CliRunner

from helpers import make_config
from seq2seq_cli.cli import app
from seq2seq_cli.run import checkpoint as ckpt

runner = CliRunner()


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_a_model_too_large_for_memory_is_refused_before_it_is_allocated(tmp_path):
    cfg = make_config(tmp_path, "run")
    r = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress", "--set", "model.d_model=1048576"])
    assert r.exit_code == 1
    [line] = error_lines(r.stderr)
    assert line.startswith("error: model: 13,194,747,707,520 parameters need 196,617.1 GiB for weights, gradients "
                           "and Adam state before any activation, but cpu has ")
    assert line.endswith("GiB free; make the model smaller (model.d_model 1048576, ffn_size 64, encoder_layers 1, "
                         "decoder_layers 1) or train on a device with more memory")
    assert not (tmp_path / "run" / "checkpoints").exists()


def full_disk_safetensors(*args, **kwargs):
    raise SafetensorError("Error while serializing: "
                          'IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')


def full_disk_torch_save(*args, **kwargs):
    raise RuntimeError("[enforce fail at inline_container.cc:778] . "
                       "PytorchStreamWriter failed writing file data/0: file write failed")


@pytest.mark.parametrize(("owner", "name", "writer", "suffix"), [
    (safetensors.torch, "save_model", full_disk_safetensors, "safetensors"),
    (torch, "save", full_disk_torch_save, "state.pt"),  # the checkpoint module imports torch when it saves
], ids=["weights", "state"])
def test_a_full_disk_during_a_checkpoint_save_is_one_line_naming_the_file(tmp_path, monkeypatch, owner, name, writer, suffix):
    cfg = make_config(tmp_path, "run", max_steps=8)
    monkeypatch.setattr(owner, name, writer)
    r = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress"])
    assert r.exit_code == 1
    path = tmp_path / "run" / "checkpoints" / f"step-00000007.{suffix}"
    assert error_lines(r.stderr) == [f"error: {path}: No space left on device"]
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_other_write_errors_keep_their_text(tmp_path):
    err = ckpt.write_error(RuntimeError("unexpected pos 64 vs 0"), str(tmp_path / "x"))
    expected = (errno.EIO, "could not be written (unexpected pos 64 vs 0)", str(tmp_path / "x"))
    assert (err.errno, err.strerror, err.filename) == expected


def test_a_full_disk_while_metrics_are_written_names_the_file(tmp_path):
    from seq2seq_cli.train.metrics import MetricsLog

    log = MetricsLog(tmp_path, None, tensorboard=False)

    class FullDisk:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    log.file.close()
    log.file = FullDisk()  # type: ignore[assignment]
    with pytest.raises(OSError) as err:
        log.write({"step": 1, "train_loss": 1.0})
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(tmp_path / "metrics.jsonl"))


def test_checkpoints_and_other_run_files_take_the_umask(tmp_path):
    import os
    import stat

    saved = os.umask(0o022)
    try:
        runner.invoke(app, ["train", "-c", str(make_config(tmp_path, "run", max_steps=2)), "--no-progress"])
    finally:
        os.umask(saved)
    run = tmp_path / "run"
    files = [*(run / "checkpoints").iterdir(), run / "config.yaml", run / "metrics.jsonl", run / "spm.model"]
    assert any(f.suffix == ".safetensors" for f in files)
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {f.name: "0o644" for f in files}


def test_nonfinite_stop_before_any_checkpoint_does_not_name_one(tmp_path, monkeypatch):
    from seq2seq_cli.train import loss as loss_module

    real = loss_module.label_smoothed_nll

    def nan_loss(logits, target, eps):
        loss, nll, n = real(logits, target, eps)
        return loss * float("nan"), nll, n

    monkeypatch.setattr(loss_module, "label_smoothed_nll", nan_loss)
    r = runner.invoke(app, ["train", "-c", str(make_config(tmp_path, "run", max_nonfinite=2)), "--no-progress"])
    assert r.exit_code == 1
    # the host reads the updates' tally every log_every (3) updates: 3 skipped in a row by then
    assert error_lines(r.stderr) == ["error: non-finite loss or gradients in 3 consecutive updates up to step 3; stopped before "
                                     "any checkpoint was saved; lower train.lr, raise train.warmup_steps or set train.clip_norm"]
    assert not (tmp_path / "run" / "checkpoints" / "last.safetensors").exists()
