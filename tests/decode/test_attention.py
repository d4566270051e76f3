"""Cross-attention in the translator: unknown words replaced by the most attended source piece,
attention computed only for hypotheses that use it, --attention-layer and --attention-head
choosing the weights or refused in one line."""

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


def test_replace_unk_puts_the_most_attended_source_piece_in_place_of_unk(run):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import UNK

    tr = Translator.load(run, "cpu", {"replace_unk": True})
    line = "Jerusalén grande"
    surfaces = [p.surface for p in tr.src_sp.encode(line, return_type="proto").pieces]
    the = tr.tgt_sp.piece_to_id("\u2581the")
    assert the != UNK
    for i in range(len(surfaces)):
        attention = torch.zeros(3, len(surfaces) + 1)  # rows: the, <unk>, EOS; columns: pieces, EOS
        attention[1, i] = 1.0
        assert tr.render([the, UNK], line, attention) == ("the" + surfaces[i]).strip()
    plain = Translator.load(run, "cpu")
    assert plain.render([the, UNK], line, attention) == tr.tgt_sp.decode([the, UNK])


def test_replace_unk_in_translation_follows_the_cross_attention(run, monkeypatch):
    from seq2seq_cli.decode import search as search_module
    from seq2seq_cli.decode import translate as module
    from seq2seq_cli.decode.hypotheses import Hypothesis
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream
    from seq2seq_cli.ids import UNK

    tr = module.Translator.load(run, "cpu", {"replace_unk": True, "beam_size": 1})
    the = tr.tgt_sp.piece_to_id("\u2581the")
    monkeypatch.setattr(search_module, "search", lambda model, src, opts, nbest=1, lines=None: [
        [Hypothesis([the, UNK], -1.0, -1.0)] for _ in range(src.size(0))])
    line = "Jerusalén grande"
    [row] = translate_stream(tr, [line], OutputOptions())
    ids = tr.encode([line])[0]
    column = int(tr.cross_attention(ids, [the, UNK], -1, None)[1, : len(ids) - 1].argmax())
    surfaces = [p.surface for p in tr.src_sp.encode(line, return_type="proto").pieces]
    assert row == ("the" + surfaces[column]).strip() and "\u2047" not in row


def test_attention_is_computed_only_for_hypotheses_that_use_it(run, sentences, monkeypatch):
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    calls: list[int] = []
    tr = Translator.load(run, "cpu", {"replace_unk": True, "ban_unk": True, "beam_size": 3})
    real = tr.cross_attention
    monkeypatch.setattr(tr, "cross_attention", lambda *a: calls.append(1) or real(*a))
    rows = list(translate_stream(tr, sentences[:4], OutputOptions(nbest=3)))
    assert len(rows) == 12 and calls == []  # no <unk> in any output: no extra attention pass
    list(translate_stream(tr, sentences[:4], OutputOptions(nbest=3, attention_plots=None, alignment=True)))
    assert len(calls) == 12


def test_attention_layer_and_head_choose_the_weights(run, sentences):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    tr = Translator.load(run, "cpu", {"beam_size": 1})
    ids = tr.encode(sentences[:1])[0]
    tokens = tr.translate_hypotheses(sentences[:1])[0][0].tokens
    heads = [tr.cross_attention(ids, tokens, -1, h) for h in range(tr.model.cfg.heads)]
    assert torch.allclose(tr.cross_attention(ids, tokens, 0, None), torch.stack(heads).mean(dim=0), atol=1e-6)
    assert not torch.allclose(heads[0], heads[1])
    for h in range(tr.model.cfg.heads):
        [row] = translate_stream(tr, sentences[:1], OutputOptions(alignment=True, attention_head=h))
        pairs = [tuple(map(int, p.split("-"))) for p in row.split("\t")[1].split()]
        assert [i for i, _ in pairs] == heads[h][: len(tokens), : len(ids) - 1].argmax(dim=1).tolist()


@pytest.mark.parametrize("flags, message", [
    (["--attention-layer", "1"], "--attention-layer 1: the model has 1 decoder layers"),
    (["--attention-layer", "-2"], "--attention-layer -2: the model has 1 decoder layers"),
    (["--attention-head", "2"], "--attention-head 2: the model has 2 heads"),
])
def test_attention_layer_or_head_out_of_range_is_one_line(run, flags, message):
    r = runner.invoke(app, ["translate", "-m", str(run), "--alignment", *flags], input="hola\n")
    one_error_line(r, message)
