"""Several languages through import and export: an OPUS-MT multi-target Marian model (its
`>>xx<<` tokens in the vocabulary) imports with its targets and translates to each as
transformers' `generate` does with the token in front; a one-to-many run (en -> es, en -> ny,
its sources starting with the target's token) exports to CTranslate2, a Marian directory and one
Argos package per pair, each decoding as our search does."""

from __future__ import annotations

import json

import pytest
import torch
from test_hf_interop import marian_dir, spm_model  # noqa: F401 - spm_model is the fixture marian_dir needs
from typer.testing import CliRunner

from seq2seq_cli.cli import app
from seq2seq_cli.convert.hf_import import import_marian
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.run.loaded import run_config

transformers = pytest.importorskip("transformers")
runner = CliRunner()
LIMIT = 12  # output tokens before EOS is forced, in both toolkits
LINES = ["en el principio", "y dijo dios", "la tierra estaba desordenada y vacía", "hola", "y fue la tarde y la mañana"]


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- import


@pytest.fixture(scope="module")
def multi_target(tmp_path_factory, spm_model):  # noqa: F811 - the fixture imported above
    """An OPUS-MT-style multi-target Marian directory (targets es and fra), its import as a run
    with source language en, and transformers' model and tokenizer of it."""
    root = tmp_path_factory.mktemp("multi")
    src = marian_dir(root, spm_model, True, "swish", ("es", "fra"))
    run = import_marian(src, root / "run", src_lang="en")
    hf = transformers.MarianMTModel.from_pretrained(src).eval()
    return src, run, hf, transformers.MarianTokenizer.from_pretrained(src)


def _generate(hf, tok, lines: list[str]) -> list[list[int]]:
    """transformers' greedy outputs (its ids, EOS and padding left out) with LIMIT tokens at most."""
    enc = tok(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=LIMIT + 1,
                          bad_words_ids=[[hf.config.pad_token_id]])
    return [[t for t in row[1:] if t not in (hf.config.pad_token_id, hf.config.eos_token_id)] for row in out.tolist()]


def test_multi_target_import_keeps_its_language_tokens_and_lists_its_targets(multi_target):
    src, run, _, _ = multi_target
    data = run_config(run).data
    assert data.target_tokens == {"es": ">>es<<", "fra": ">>fra<<"}
    assert data.pairs == [("en", "es"), ("en", "fra")] and (data.src_lang, data.tgt_lang) == ("en", "es")
    result = runner.invoke(app, ["info", "--model", str(run)])
    assert result.exit_code == 0, result.output
    assert "language pairs: en -> es, en -> fra; the target named by the source token: es >>es<<, fra >>fra<<" \
        in result.stdout.splitlines()


def test_multi_target_import_translates_to_each_target_as_transformers_generate(multi_target, tmp_path):
    """`translate --tgt-lang es` gives transformers' `generate` of `>>es<< line`, token for token
    and as text; the two targets give different outputs (the token is read)."""
    src, run, hf, tok = multi_target
    marian_vocab = json.loads((src / "vocab.json").read_text(encoding="utf-8"))
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    outputs = {}
    for lang in ("es", "fra"):
        theirs = _generate(hf, tok, [f">>{lang}<< {line}" for line in LINES])
        tr = Translator.load(run, "cpu", {"beam_size": 1, "max_len_a": 0.0, "max_len_b": LIMIT}).with_pair(None, lang)
        assert tr.encode(["hola"])[0][0] == tr.src_sp.vocab[f">>{lang}<<"]  # the token in front of the source
        ours = [[marian_vocab[tr.tgt_sp.id_to_piece(t)] for t in h[0].tokens] for h in tr.translate_hypotheses(LINES)]
        assert ours == theirs, lang
        out = tmp_path / f"out.{lang}"
        result = runner.invoke(app, ["translate", "-m", str(run), "--tgt-lang", lang, "-i", str(tmp_path / "in.txt"),
                                     "-o", str(out), "--beam-size", "1", "--max-len-a", "0", "--max-len-b", str(LIMIT),
                                     "--no-progress", "--device", "cpu", "--engine", "torch"])
        assert result.exit_code == 0, result.output
        assert "(en -> " + lang + "," in result.stderr, result.stderr
        outputs[lang] = out.read_text(encoding="utf-8").splitlines()
        assert outputs[lang] == [tok.decode(ids, skip_special_tokens=True) for ids in theirs], lang
    assert outputs["es"] != outputs["fra"]


def test_multi_target_import_needs_the_target(multi_target, tmp_path):
    src, run, _, _ = multi_target
    (tmp_path / "in.txt").write_text("hola\n", encoding="utf-8")
    line = _error_line(runner.invoke(app, ["translate", "-m", str(run), "-i", str(tmp_path / "in.txt"), "--no-progress"]))
    assert line == f"error: {run} translates into es, fra (en -> es, en -> fra): give the target language with --tgt-lang"
    line = _error_line(runner.invoke(app, ["import", str(src), str(tmp_path / "run"), "--tgt-lang", "de"]))
    assert line == (f"error: --tgt-lang de: {src / 'vocab.json'} names the targets es, fra by their tokens "
                    "(>>es<< >>fra<<); give one of them, or leave out --tgt-lang")
    assert not (tmp_path / "run").exists()
