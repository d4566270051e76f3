"""`seq2seq average` beside the run's own checkpoints: the names of managed checkpoints and names
that are not .safetensors are refused in one line, a name of its own is usable, a rotation of
the step checkpoints while they are read is listed again, then reported in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import one_error_line
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture
def run(short_run: Path, tmp_path: Path) -> Path:
    """A copy of the shared 4-update run (step checkpoints at 2 and 4): averaging writes into it."""
    return Path(shutil.copytree(short_run, tmp_path / "run"))


@pytest.mark.parametrize("name", ["best.safetensors", "last.safetensors", "step-00000002.safetensors"])
def test_average_refuses_the_name_of_a_managed_checkpoint(run, name):
    ckpt = run / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(ckpt / name)])
    one_error_line(r, f"{ckpt / name}: {name} is a checkpoint the run manages (best, last, step-N)")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


@pytest.mark.parametrize("name", ["best.json", "mine.json", "mine", ".safetensors"])
def test_average_refuses_a_name_that_is_not_safetensors(run, name):
    ckpt = run / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(ckpt / name)])
    one_error_line(r, f"{ckpt / name}: an averaged checkpoint is a NAME.safetensors file (its manifest is NAME.json)")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    assert runner.invoke(app, ["translate", "-m", str(run)], input="hola\n").exit_code == 0


def test_average_with_a_name_of_its_own_is_usable(run):
    out = run / "checkpoints" / "mine.safetensors"
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert runner.invoke(app, ["translate", "-m", str(out)], input="hola\n").exit_code == 0


def test_average_racing_checkpoint_rotation_lists_again_then_reports_one_line(run, monkeypatch):
    """A checkpoint that goes away between the listing and the reading: listed again once;
    when it keeps happening, one line, no traceback."""
    import safetensors.torch

    from seq2seq_cli.run import checkpoint

    real = safetensors.torch.load_file
    calls: list[str] = []

    def vanishing(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1 or always:
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "load_file", vanishing)
    monkeypatch.setattr(checkpoint.time, "sleep", lambda s: None)
    always = False
    out = run / "checkpoints" / "raced.safetensors"
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file()
    always = True
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    one_error_line(r, "step checkpoints changed while they were read", "training is rotating them")
