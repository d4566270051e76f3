"""Decoding options checked once, up front: out-of-range values refused in one line, a beam
from the run's config larger than the vocabulary named as such, one function owning the
output limit."""

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


@pytest.mark.parametrize("flags", [
    ["--sampling", "--temperature", "1e-45"], ["--sampling", "--temperature", "inf"], ["--sampling", "--temperature", "nan"],
    ["--max-len-b", "100000000000000000000"], ["--max-len-a", "1e30"], ["--max-len-a", "inf"],
    ["--length-penalty", "-1e308"], ["--length-penalty", "inf"], ["--beam-size", "301"],
])
def test_out_of_range_decoding_options_are_refused_up_front(run, flags):
    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", *flags], input="hola\n")
    one_error_line(r, flags[-2])
    assert r.stdout == ""


def test_the_run_config_beam_size_above_the_vocabulary_names_the_config(run, monkeypatch):
    from seq2seq_cli.decode import translate as module
    from seq2seq_cli.errors import UserError
    from seq2seq_cli.run import loaded

    real = loaded.load_run

    def with_beam(*args, **kwargs):
        loaded = real(*args, **kwargs)
        decode = loaded.config.decode.model_copy(update={"beam_size": 500})
        loaded.config = loaded.config.model_copy(update={"decode": decode})
        return loaded

    monkeypatch.setattr(loaded, "load_run", with_beam)
    with pytest.raises(UserError, match=r"^decode.beam_size \(the run's config\) 500: larger than the target vocabulary"):
        module.Translator.load(run, "cpu")


def test_one_function_owns_the_output_limit(run):
    import torch

    from seq2seq_cli.decode.steps import max_lengths, max_source_subwords
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import EOS, PAD

    tr = Translator.load(run, "cpu")
    cap = max_source_subwords(tr.model)
    assert cap == tr.model.cfg.max_positions - 2
    src = torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, EOS]])
    assert max_lengths(src, tr.model, 1000.0, 1_000_000).tolist() == [cap, cap]  # never overflows to 0
    assert max_lengths(src, tr.model, 1.5, 1).tolist() == [5, 7]
    long_line = " ".join(["Jerusalén"] * 400)
    assert len(tr.encode([long_line])[0]) == cap + 1  # the source cut to the same cap, EOS added
