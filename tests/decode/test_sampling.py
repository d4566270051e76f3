"""Sampling seeds: copies of a line get samples of their own, and the samples depend on the seed
only, not on batches, chunks or threads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture
def run(short_run: Path) -> Path:
    """The shared 4-update run, read only."""
    return short_run


def test_copies_of_a_line_get_different_samples(run):
    args = ["translate", "-m", str(run), "--sampling", "--seed", "3", "--max-len-a", "0", "--max-len-b", "8",
            "--batch-tokens", "8"]  # a few sentences per batch: each batch must not start the same samples over
    r = runner.invoke(app, args, input="hola amigo\n" * 40)
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 40 and len(set(rows)) >= 20


def test_samples_do_not_depend_on_batches_chunks_or_threads(run, sentences):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    lines = sentences[:6] * 2
    settings = {"sampling": True, "seed": 5, "max_len_a": 0, "max_len_b": 8}
    outputs = []
    threads = torch.get_num_threads()
    try:
        for batch_tokens, chunk_lines, n_threads in ((100000, 10000, 1), (8, 5, 1), (30, 7, 2)):
            torch.set_num_threads(n_threads)
            tr = Translator.load(run, "cpu", {**settings, "batch_tokens": batch_tokens})
            outputs.append(list(translate_stream(tr, lines, OutputOptions(nbest=2), chunk_lines=chunk_lines)))
    finally:
        torch.set_num_threads(threads)
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 24 and outputs[0][:12] != outputs[0][12:]  # the copies got samples of their own
    tr = Translator.load(run, "cpu", {**settings, "seed": 6})
    assert list(translate_stream(tr, lines, OutputOptions(nbest=2))) != outputs[0]
