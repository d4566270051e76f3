"""`seq2seq evaluate`: empty translations scored, n-best files and --hyp with an output refused,
byte-order marks ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import one_error_line
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture
def run(short_run: Path) -> Path:
    """The shared 4-update run, read only."""
    return short_run


def test_evaluate_with_a_zero_output_limit_scores_empty_translations(run, tmp_path):
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--json",
                            "--max-len-a", "0", "--max-len-b", "0"])
    assert r.exit_code == 0, r.output
    assert '"bleu": 0.0' in r.stdout


def test_evaluate_refuses_an_nbest_file_against_one_reference_per_line(run, tmp_path):
    src, ref, hyp = tmp_path / "e.es", tmp_path / "e.en", tmp_path / "nbest.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(hyp), "--beam-size", "2", "--nbest", "2",
                            "--max-len-b", "0", "--max-len-a", "0", "--no-progress"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref)])
    one_error_line(r, f"{hyp} has 4 lines but {ref} has 2; they must be aligned")


def test_evaluate_ignores_a_byte_order_mark(tmp_path):
    hyp, bom, ref = tmp_path / "hyp.en", tmp_path / "bom.en", tmp_path / "ref.en"
    hyp.write_text("the cat sat on the mat\ngood morning\n", encoding="utf-8")
    bom.write_text("\ufeffthe cat sat on the mat\ngood morning\n", encoding="utf-8")
    ref.write_text("\ufeffthe cat sat on the mat\ngood morning\n", encoding="utf-8")
    plain = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json"])
    marked = runner.invoke(app, ["evaluate", "--hyp", str(bom), "--ref", str(ref), "--json"])
    assert plain.exit_code == marked.exit_code == 0, plain.output + marked.output
    assert plain.stdout == marked.stdout and '"bleu": 100.0' in plain.stdout


def test_evaluate_hyp_with_an_output_is_refused(tmp_path):
    hyp, ref, out = tmp_path / "hyp.en", tmp_path / "ref.en", tmp_path / "x.en"
    hyp.write_text("hello\n", encoding="utf-8")
    ref.write_text("hello\n", encoding="utf-8")
    r = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "-o", str(out)])
    one_error_line(r, f"-o {out}: --output writes the translations of --src; with --hyp {hyp} there is nothing to translate")
    assert not out.exists()
