"""Forced prefixes (`translate --prefix FILE`): every output starts with its prefix's target
pieces token for token, in every search and in batches mixing prefix lengths; an empty
prefix changes nothing; scores include the prefix's log-probabilities."""

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.ids import EOS

runner = CliRunner()

PREFIXES = ["The", "", "I would like", "Es", "", "yes, the house of my friend is"]


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    """A tiny model trained for a few dozen steps on the shipped validation split (shared, read only)."""
    return tiny_run


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[: len(PREFIXES)]


SEARCHES = {
    "greedy": ({"beam_size": 1}, 1),
    "beam": ({"beam_size": 4}, 1),
    "nbest": ({"beam_size": 4}, 3),
    "sampling": ({"sampling": True, "seed": 7}, 3),
    "int8": ({"beam_size": 3, "quantize": "int8"}, 2),
}


@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_prefix_is_kept_token_for_token(run_dir, sentences, search):
    overrides, nbest = SEARCHES[search]
    tr = Translator.load(run_dir, "cpu", {**overrides, "max_len_a": 0.0, "max_len_b": 3, "batch_tokens": 4096})
    prefixes = tr.encode_prefixes(PREFIXES, str)
    assert len(prefixes[-1]) > 3  # longer than the output limit: the limit grows to hold it
    got = tr.translate_hypotheses(sentences, nbest, prefixes=prefixes)
    for line, (prefix, hyps) in enumerate(zip(prefixes, got)):
        assert hyps[0].log_prob > float("-inf")
        for h in hyps:
            if h.log_prob == float("-inf"):
                continue  # the limit leaves fewer outputs than asked for: a filler (NO_HYPOTHESIS)
            assert h.tokens[: len(prefix)] == prefix, (line, prefix, h.tokens)
            assert len(h.tokens) <= max(3, len(prefix)) + (not h.eos)  # one more where it ends at the limit, without EOS


def test_empty_prefix_gives_the_unprefixed_output_exactly(run_dir, sentences):
    tr = Translator.load(run_dir, "cpu", {"beam_size": 3, "batch_tokens": 4096})
    plain = tr.translate_hypotheses(sentences, 2)
    mixed = tr.translate_hypotheses(sentences, 2, prefixes=tr.encode_prefixes(PREFIXES, str))
    none = tr.translate_hypotheses(sentences, 2, prefixes=tr.encode_prefixes([""] * len(sentences), str))
    assert none == plain
    for prefix, p, m in zip(PREFIXES, plain, mixed):
        if not prefix:  # its batch holds prefixed lines: its own output is untouched
            assert [h.tokens for h in m] == [h.tokens for h in p]
            assert [h.score for h in m] == pytest.approx([h.score for h in p], abs=1e-5)


def test_score_includes_the_prefix(run_dir, sentences):
    """The log-probability of a prefixed greedy output is the model's, teacher-forced over the
    whole output (prefix, continuation and EOS where it has one)."""
    tr = Translator.load(run_dir, "cpu", {"beam_size": 1})
    prefixes = tr.encode_prefixes(PREFIXES[:1], str)
    (h,), = tr.translate_hypotheses(sentences[:1], 1, prefixes=prefixes)
    src = torch.tensor([tr.encode(sentences[:1])[0]])
    tgt = [tr.model.cfg.decoder_start_id, *h.tokens]
    with torch.no_grad():
        lprobs = tr.model(src, torch.tensor([tgt])).float().log_softmax(-1)[0]
    want = sum(float(lprobs[i, t]) for i, t in enumerate([*h.tokens, EOS][: len(h.tokens) + h.eos]))
    assert h.log_prob == pytest.approx(want, abs=1e-3)


def test_blank_source_line_with_a_prefix_gives_the_prefix(run_dir):
    tr = Translator.load(run_dir, "cpu")
    prefixes = tr.encode_prefixes(["Hello there", ""], str)
    got = tr.translate_hypotheses(["", ""], 1, prefixes=prefixes)
    assert got[0][0].tokens == prefixes[0]
    assert got[1][0].tokens == []


def test_translate_prefix_flag(run_dir, sentences, tmp_path):
    src, pre, out = tmp_path / "in.es", tmp_path / "prefix.en", tmp_path / "out.en"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    pre.write_text("\n".join(PREFIXES) + "\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--prefix", str(pre),
                            "--no-progress", "--beam-size", "3"])
    assert r.exit_code == 0, r.output
    got = out.read_text(encoding="utf-8").splitlines()
    tr = Translator.load(run_dir, "cpu", {"beam_size": 3})
    assert len(got) == len(sentences)
    for line, prefix in zip(got, PREFIXES):
        assert tr.tgt_sp.encode(line)[: len(tr.tgt_sp.encode(prefix))] == tr.tgt_sp.encode(prefix)
    # stdin gives the same
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--prefix", str(pre), "--beam-size", "3"],
                      input="\n".join(sentences) + "\n")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == got


def test_prefix_line_count_on_stdin(run_dir, tmp_path):
    pre = tmp_path / "prefix.en"
    pre.write_text("The\n", encoding="utf-8")
    for given in ("hola\nadiós\n", ""):
        r = runner.invoke(app, ["translate", "-m", str(run_dir), "--prefix", str(pre)], input=given)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.exit_code == 1 and len(lines) == 1, r.output
        assert lines[0].startswith(f"error: {pre} has 1 lines but the input stdin has "), lines[0]
        assert "Traceback" not in r.output
