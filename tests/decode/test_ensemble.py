"""Ensembles (`translate -m RUN1 -m RUN2`): an ensemble of a run with itself is the run, in
every search; two runs give the log of their mean probability at each step, which is
neither run's output; runs with other vocabularies are refused in one line."""

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import SHIPPED
from helpers import train_shipped_tiny
from seq2seq_cli.cli import app
from seq2seq_cli.decode.ensemble import Ensemble
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.ids import EOS

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny runs on the same data and tokenizer, other seeds and lengths of training: a few
    updates, so that their outputs are long and differ from sentence to sentence (nonsense,
    but not empty)."""
    tmp = tmp_path_factory.mktemp("ensemble")
    return (train_shipped_tiny(tmp, "a", max_steps=3, valid_every=3, seed=1),
            train_shipped_tiny(tmp, "b", max_steps=2, valid_every=2, seed=2))


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:12]


SHORT = {"max_len_a": 0.0, "max_len_b": 8}  # outputs of at most 8 tokens: these runs would go on to the limit
SEARCHES = {
    "greedy": ({"beam_size": 1}, 1),
    "beam": ({"beam_size": 4}, 1),
    "nbest": ({"beam_size": 4}, 3),
    "sampling": ({"sampling": True, "seed": 7}, 2),
    "int8": ({"beam_size": 3, "quantize": "int8"}, 2),
}


@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_ensemble_of_a_run_with_itself_is_the_run(runs, sentences, search):
    overrides, nbest = SEARCHES[search]
    single = Translator.load(runs[0], "cpu", {**overrides, **SHORT})
    double = Translator.load([runs[0], runs[0]], "cpu", {**overrides, **SHORT})
    assert isinstance(double.model, Ensemble)
    one, two = single.translate_hypotheses(sentences, nbest), double.translate_hypotheses(sentences, nbest)
    assert [[h.tokens for h in hyps] for hyps in two] == [[h.tokens for h in hyps] for hyps in one]
    assert len({tuple(hyps[0].tokens) for hyps in one}) > 3  # not all empty, nor all alike
    assert [h.score for hyps in two for h in hyps] == pytest.approx([h.score for hyps in one for h in hyps], abs=1e-4)


def test_two_runs_average_their_probabilities(runs, sentences):
    a, b = (Translator.load(r, "cpu", {"beam_size": 4, **SHORT}) for r in runs)
    both = Translator.load(list(runs), "cpu", {"beam_size": 4, **SHORT})
    outputs = [t.translate(sentences) for t in (a, b, both)]
    assert all(outputs[2]) and outputs[2] != outputs[0] and outputs[2] != outputs[1]
    both = Translator.load(list(runs), "cpu", {"beam_size": 1, **SHORT})
    # each greedy output's log-probability is the sum of log((p_a + p_b) / 2), teacher-forced (EOS where it has one)
    ids = both.encode(sentences[:3])
    for src_ids, (h,) in zip(ids, both.translate_hypotheses(sentences[:3])):
        src = torch.tensor([src_ids])
        tgt_in = torch.tensor([[both.attention_model.cfg.decoder_start_id, *h.tokens]])
        with torch.no_grad():
            probs = [t.attention_model(src, tgt_in).float().softmax(-1)[0] for t in (a, b)]
        mean = (probs[0] + probs[1]) / 2
        want = sum(float(mean[i, t].log()) for i, t in enumerate([*h.tokens, EOS][: len(h.tokens) + h.eos]))
        assert h.log_prob == pytest.approx(want, abs=1e-3)


def test_translate_and_evaluate_take_several_models(runs, sentences, tmp_path):
    src, ref, out = tmp_path / "in.es", tmp_path / "ref.en", tmp_path / "out.en"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    refs = (SHIPPED / "test.en").read_text(encoding="utf-8").splitlines()[: len(sentences)]
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    models = ["-m", str(runs[0]), "-m", str(runs[1])]
    r = runner.invoke(app, ["translate", *models, "-i", str(src), "-o", str(out), "--no-progress", "-b", "3",
                            "--max-len-a", "0", "--max-len-b", "8", "--alignment", "--scores"])
    assert r.exit_code == 0, r.output
    got = out.read_text(encoding="utf-8").splitlines()
    expected = Translator.load(list(runs), "cpu", {"beam_size": 3, **SHORT}).translate(sentences)
    assert [line.split("\t")[0] for line in got] == expected
    r = runner.invoke(app, ["evaluate", *models, "--src", str(src), "--ref", str(ref), "--json", "-b", "3", "--max-len-b", "8"])
    assert r.exit_code == 0, r.output
    # an output that any member's run owns is refused
    r = runner.invoke(app, ["translate", *models, "-i", str(src), "-o", str(runs[1] / "metrics.jsonl")])
    assert r.exit_code == 1 and f"belongs to the model's run {runs[1]} (metrics.jsonl)" in r.stderr


class Pieces:
    """The part of a tokenizer `vocabulary_difference` reads."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]


def test_vocabularies_are_compared_piece_for_piece():
    from seq2seq_cli.decode.ensemble import vocabulary_difference

    first = Pieces(["<pad>", "<unk>", "▁the", "▁house"])
    assert vocabulary_difference(Pieces(list(first.pieces)), first) is None  # type: ignore[arg-type]
    assert vocabulary_difference(Pieces(["<pad>", "<unk>", "▁house", "▁the"]), first) == (  # type: ignore[arg-type]
        "piece 2 is '▁house' there, '▁the' in")
    assert vocabulary_difference(Pieces(first.pieces[:3]), first) == "3 pieces, 4 in"  # type: ignore[arg-type]
