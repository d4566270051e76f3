"""The outputs of translate and evaluate never destroy what they read or the run they use: an
output onto an input or a reference (or a symbolic link to one), onto a path the run owns, is
refused in one line; a new file beside the run's files is the user's; a translation interrupted
by SIGTERM leaves the earlier output as it was and no temporary file."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import SHIPPED
from helpers import one_error_line, subprocess_env
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture
def run(short_run: Path) -> Path:
    """The shared 4-update run, read only."""
    return short_run


@pytest.mark.parametrize("target", ["--ref", "--src"])
def test_evaluate_refuses_to_write_over_its_reference_or_source(run, tmp_path, target):
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    out = ref if target == "--ref" else src
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(out)])
    one_error_line(r, f"{out}: is the {target} file {out}; write the translations to another file")
    assert r.stdout == ""
    assert src.read_text(encoding="utf-8") == "hola\nadiós\n" and ref.read_text(encoding="utf-8") == "hello\ngoodbye\n"


def test_evaluate_refuses_a_symbolic_link_to_its_reference(run, tmp_path):
    src, ref, link = tmp_path / "e.es", tmp_path / "e.en", tmp_path / "link.en"
    src.write_text("hola\n", encoding="utf-8")
    ref.write_text("hello\n", encoding="utf-8")
    link.symlink_to(ref)
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(link)])
    one_error_line(r, f"{link}: is the --ref file {ref}")
    assert ref.read_text(encoding="utf-8") == "hello\n"


@pytest.mark.parametrize("name, owner", [("spm.model", "spm.model"), ("config.yaml", "config.yaml"),
                                         ("metrics.jsonl", "metrics.jsonl"), ("checkpoints/best.safetensors", "checkpoints"),
                                         ("checkpoints/x", "checkpoints"), ("cache/new.txt", "cache"), (".lock", ".lock")])
def test_translate_refuses_to_write_a_path_the_run_owns(run, name, owner):
    target = run / name
    before = target.read_bytes() if target.is_file() else None
    r = runner.invoke(app, ["translate", "-m", str(run), "-o", str(target), "--no-progress"], input="hola\n")
    one_error_line(r, f"{target}: belongs to the model's run {run} ({owner}); write the translation to another file")
    assert (target.read_bytes() if target.is_file() else None) == before


@pytest.mark.parametrize("name", ["spm.model", "config.yaml", "checkpoints/x"])
def test_evaluate_refuses_to_write_a_path_the_run_owns(run, name):
    target = run / name
    before = target.read_bytes() if target.is_file() else None
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(SHIPPED / "test.es"), "--ref", str(SHIPPED / "test.en"),
                            "-o", str(target)])
    one_error_line(r, f"{target}: belongs to the model's run {run}", "write the translations to another file")
    assert (target.read_bytes() if target.is_file() else None) == before


def test_a_new_file_beside_the_run_s_files_is_the_user_s(run, tmp_path):
    """evaluate -o RUN/test.hyp.en writes there (as the quick start does); training with --resume or
    --overwrite leaves such a file alone."""
    run = Path(shutil.copytree(run, tmp_path / "copy"))
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    hyp = run / "test.hyp.en"
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(hyp), "-b", "1"])
    assert r.exit_code == 0, r.output
    assert "BLEU|" in r.stdout and len(hyp.read_text(encoding="utf-8").splitlines()) == 2
    r = runner.invoke(app, ["translate", "-m", str(run), "-o", str(run / "mine.txt"), "--no-progress"], input="hola\n")
    assert r.exit_code == 0 and (run / "mine.txt").read_text(encoding="utf-8").count("\n") == 1
    written = hyp.read_bytes()
    for flag in ("--resume", "--overwrite"):
        r = runner.invoke(app, ["train", "-c", str(run / "config.yaml"), flag, "--no-progress",
                                "--set", "train.max_steps=5", "--set", "train.valid_every=5"])
        assert r.exit_code == 0, r.output
        assert hyp.read_bytes() == written, flag
        assert (run / "mine.txt").is_file(), flag


def test_translate_refuses_a_symbolic_link_to_its_input(run, tmp_path):
    src, link = tmp_path / "in.es", tmp_path / "link.txt"
    src.write_text("hola\n", encoding="utf-8")
    link.symlink_to(src)
    r = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(link), "--no-progress"])
    one_error_line(r, f"{link}: is the input file {src}")
    assert src.read_text(encoding="utf-8") == "hola\n"


def test_sigterm_while_writing_an_output_leaves_no_temporary_file(run, tmp_path, sentences):
    src, out = tmp_path / "many.es", tmp_path / "out.en"
    src.write_text("\n".join(sentences * 300) + "\n", encoding="utf-8")
    out.write_text("earlier results\n", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "-i", str(src), "-o", str(out),
         "--device", "cpu", "--batch-tokens", "64", "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob(".out.en.*.tmp")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no temporary output file appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.es", "out.en"]
    assert out.read_text(encoding="utf-8") == "earlier results\n"
