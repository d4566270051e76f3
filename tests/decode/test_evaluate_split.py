"""`evaluate` says whether source lines were cut into sentences: on stderr and in --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from helpers import SHIPPED
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tiny_run):
    return tiny_run


def test_evaluate_says_whether_lines_were_split(run, tmp_path):
    verses = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:6]
    refs = (SHIPPED / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    src, ref = tmp_path / "p.es", tmp_path / "p.en"
    src.write_text(" ".join(verses[:3]) + "\n" + " ".join(verses[3:]) + "\n", encoding="utf-8")
    ref.write_text(" ".join(refs[:3]) + "\n" + " ".join(refs[3:]) + "\n", encoding="utf-8")
    base = ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--json", "--engine", "torch"]
    split = runner.invoke(app, base)
    whole = runner.invoke(app, [*base, "--no-split"])
    assert split.exit_code == 0 and whole.exit_code == 0, split.output + whole.output
    assert json.loads(split.stdout)["split"] is True and json.loads(whole.stdout)["split"] is False
    assert "cut into sentences" in split.stderr and "translated as one sentence" in whole.stderr
    hyp = tmp_path / "h.en"
    hyp.write_text(ref.read_text(encoding="utf-8"), encoding="utf-8")
    scored = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json"])
    assert scored.exit_code == 0 and json.loads(scored.stdout)["split"] is None and scored.stderr == ""
