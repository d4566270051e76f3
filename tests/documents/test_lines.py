"""Line output of translate: n-best rows whatever the output limit, a blank line scored as the
empty translation, attention plots (a file in the way, a warning when there are many)."""

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


@pytest.mark.parametrize("limits", [["--max-len-a", "0", "--max-len-b", "0"], ["--max-len-a", "0", "--max-len-b", "1"]])
def test_nbest_writes_exactly_n_lines_per_input_whatever_the_output_limit(run, sentences, tmp_path, limits):
    src = tmp_path / "in.es"
    src.write_text("\n".join(sentences[:5]) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    args = ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--beam-size", "4", "--nbest", "4",
            "--scores", "--no-progress", *limits]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    rows = out.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 20
    for k in range(5):
        scores = [float(row.rsplit("\t", 1)[1]) for row in rows[4 * k : 4 * k + 4]]
        assert scores == sorted(scores, reverse=True) and scores[0] > float("-inf")
    if limits[-1] == "0":  # no token before EOS: the empty output, or one piece ended at the limit
        assert all(" " not in row.split("\t")[0] for row in rows)
        assert any(row.split("\t")[0] for row in rows)


def test_a_blank_line_is_scored_as_the_empty_translation(run):
    import torch

    from helpers import sequence_log_prob
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import EOS

    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", "--scores", "--beam-size", "2", "--nbest", "2"],
                      input="hola\n\n")
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 4
    assert rows[2].split("\t")[0] == "" and rows[3] == "\t-inf"
    tr = Translator.load(run, "cpu")
    expected = sequence_log_prob(tr.model, torch.tensor([EOS]), [])  # log P(EOS | empty source), lp(1) = 1
    assert float(rows[2].split("\t")[1]) == pytest.approx(expected, abs=1e-4) and expected < 0


def test_attention_plots_onto_a_file_fails_before_decoding(run, tmp_path, monkeypatch):
    from seq2seq_cli.decode import search as module

    taken = tmp_path / "plots"
    taken.write_text("not a directory\n", encoding="utf-8")
    monkeypatch.setattr(module, "search", lambda *a, **k: pytest.fail("decoded before checking --attention-plots"))
    r = runner.invoke(app, ["translate", "-m", str(run), "--attention-plots", str(taken)], input="hola\n")
    one_error_line(r, f"{taken}: --attention-plots names a directory to write one PNG per sentence into; this is a file")
    r = runner.invoke(app, ["translate", "-m", str(run), "--attention-plots", str(taken / "sub")], input="hola\n")
    one_error_line(r, f"{taken / 'sub'}: cannot create the --attention-plots directory")


@pytest.mark.parametrize("from_file", [True, False])
def test_many_attention_plots_are_warned_about(run, tmp_path, monkeypatch, from_file):
    from seq2seq_cli.documents import lines, text

    drawn: list[Path] = []
    monkeypatch.setattr(text, "PLOT_WARNING", 3)
    monkeypatch.setattr(lines, "plot_attention", lambda weights, src, tgt, path: drawn.append(path))
    src = tmp_path / "in.es"
    src.write_text("hola\nadiós\nsí\nno\n", encoding="utf-8")
    args = ["translate", "-m", str(run), "--attention-plots", str(tmp_path / "plots"), "--no-progress"]
    few = runner.invoke(app, args, input="hola\nadiós\n")
    assert few.exit_code == 0 and "warning" not in few.stderr
    r = runner.invoke(app, [*args, "-i", str(src)] if from_file else args, input=None if from_file else src.read_text())
    assert r.exit_code == 0, r.output
    want = "4 sentences" if from_file else "more than 3 sentences"
    assert r.stderr.count("warning: --attention-plots draws one PNG per sentence") == 1 and want in r.stderr
    assert len(drawn) == 6
