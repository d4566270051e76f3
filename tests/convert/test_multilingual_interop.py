"""Several languages through import and export: an OPUS-MT multi-target Marian model (its
`>>xx<<` tokens in the vocabulary) imports with its targets and translates to each as
transformers' `generate` does with the token in front; a one-to-many run (en -> es, en -> ny,
its sources starting with the target's token) exports to CTranslate2, a Marian directory and one
Argos package per pair, each decoding as our search does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from interop_helpers import ARGOS_OFFLINE, argos_env, ending_as_ours, marian_dir, marian_spm
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.convert.hf_import import import_marian
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.run.loaded import run_config

transformers = pytest.importorskip("transformers")
runner = CliRunner()
LIMIT = 12  # output tokens before EOS; an output still going ends with one more, in both toolkits
LINES = ["en el principio", "y dijo dios", "la tierra estaba desordenada y vacía", "hola", "y fue la tarde y la mañana"]


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- import


@pytest.fixture(scope="module")
def multi_target(tmp_path_factory):
    """An OPUS-MT-style multi-target Marian directory (targets es and fra), its import as a run
    with source language en, and transformers' model and tokenizer of it."""
    root = tmp_path_factory.mktemp("multi")
    src = marian_dir(root, marian_spm(root), True, "swish", ("es", "fra"))
    run = import_marian(src, root / "run", src_lang="en")
    hf = transformers.MarianMTModel.from_pretrained(src).eval()
    return src, run, hf, transformers.MarianTokenizer.from_pretrained(src)


def _generate(hf, tok, lines: list[str]) -> list[list[int]]:
    """transformers' greedy outputs (its ids, EOS and padding left out) with LIMIT tokens at most."""
    enc = tok(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = ending_as_ours(hf).generate(**enc, num_beams=1, do_sample=False, max_new_tokens=LIMIT + 1,
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


def test_multi_target_import_exports_to_ctranslate2_with_its_tokens(multi_target, tmp_path):
    """The imported multi-target run (its own vocabulary file) exports to CTranslate2, which gives
    transformers' outputs when the target's token comes first."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import sentencepiece

    src, run, hf, tok = multi_target
    out = tmp_path / "ct2"
    result = runner.invoke(app, ["export", str(out), "--model", str(run), "--format", "ctranslate2"])
    assert result.exit_code == 0, result.output
    assert "the target named by the source token: es >>es<<, fra >>fra<<" in result.stdout
    sp = sentencepiece.SentencePieceProcessor(model_file=str(src / "source.spm"))
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    for lang in ("es", "fra"):
        pieces = [[f">>{lang}<<", *sp.encode(line, out_type=str)] for line in LINES]
        theirs = ct.translate_batch(pieces, beam_size=1, max_decoding_length=LIMIT + 1)  # EOS counted
        expected = _generate(hf, tok, [f">>{lang}<< {line}" for line in LINES])
        assert [t.hypotheses[0] for t in theirs] == [tok.convert_ids_to_tokens(ids) for ids in expected], lang


def test_multi_target_import_needs_the_target(multi_target, tmp_path):
    src, run, _, _ = multi_target
    (tmp_path / "in.txt").write_text("hola\n", encoding="utf-8")
    line = _error_line(runner.invoke(app, ["translate", "-m", str(run), "-i", str(tmp_path / "in.txt"), "--no-progress"]))
    assert line == f"error: {run} translates into es, fra (en -> es, en -> fra): give the target language with --tgt-lang"
    line = _error_line(runner.invoke(app, ["export", str(tmp_path / "x.argosmodel"), "-m", str(run), "--format", "argos"]))
    assert line == (f"error: {run}: cannot be exported for Argos: it tokenizes with SentencePiece models alone, "
                    "and this run uses tokenizer.vocabulary: file")  # said first: a directory would not help
    line = _error_line(runner.invoke(app, ["import", str(src), str(tmp_path / "run"), "--tgt-lang", "de"]))
    assert line == (f"error: --tgt-lang de: {src / 'vocab.json'} names the targets es, fra by their tokens "
                    "(>>es<< >>fra<<); give one of them, or leave out --tgt-lang")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- export of a one-to-many run

TARGETS = ("es", "ny")
LONG = 60  # the length limit of the exported run's outputs


@pytest.fixture(scope="module")
def one_to_many(tmp_path_factory) -> Path:
    """configs/tiny.yaml as a one-to-many run: en -> es (the Spanish Bible's validation split)
    and en -> ny (the Chichewa one's), every source starting with >>es<< or >>ny<<, trained for
    30 updates. Its weights are then drawn at random, large enough that the outputs are strings
    of pieces that depend on the source and its token (30 updates of a tiny model give every
    line the same output), with a logits bias that keeps <s>, <pad> and <unk> out of the outputs
    (our search never gives <s> or <pad> and CTranslate2's may; Argos replaces <unk>) and makes
    EOS likely enough that most outputs end before the length limit."""
    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.ids import BOS, EOS, PAD, UNK
    from seq2seq_cli.run.checkpoint import save_checkpoint
    from seq2seq_cli.run.loaded import load_run
    from seq2seq_cli.train.loop import train

    tmp = tmp_path_factory.mktemp("one-to-many")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    corpora = [{"path": str(SHIPPED / "valid"), "src_lang": "en", "tgt_lang": "es"},
               {"path": str(REPO / "data" / "bible-ny-en" / "valid"), "src_lang": "en", "tgt_lang": "ny"}]
    raw["run_dir"] = str(tmp / "run")
    raw["data"].update(src_lang="en", tgt_lang="es", train=corpora, valid=corpora[:1], test=None, filters="off")
    raw["model"]["logits_bias"] = True
    raw["train"].update(max_steps=30, valid_every=30)
    (tmp / "config.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = train(load_config(tmp / "config.yaml"), progress=False, log=lambda _: None)
    loaded = load_run(run, "cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if ".norm." not in name:
                p.normal_(0.0, 0.5)
        loaded.model.logits_bias[[BOS, PAD, UNK]] = -30.0
        loaded.model.logits_bias[EOS] = 5.0
    save_checkpoint(run / "checkpoints", 31, loaded.model, loaded.config, {"step": 31}, {}, best=True, keep_last=1)
    return run


def _sources(n: int = 24) -> list[str]:
    return (REPO / "data" / "bible-es-en" / "test.en").read_text(encoding="utf-8").splitlines()[:n]


def _translator(run: Path, tgt: str, beam: int, length_penalty: float = 1.0, limit: int = LONG) -> Translator:
    """Our search (torch) for en -> tgt, the target's token in front of each source; at least one
    piece, as CTranslate2's search gives."""
    opts = {"beam_size": beam, "max_len_a": 0.0, "max_len_b": limit, "length_penalty": length_penalty, "min_len": 1}
    return Translator.load(run, "cpu", opts).with_pair("en", tgt)


def _ours(run: Path, tgt: str, lines: list[str], beam: int) -> list[list[str]]:
    """Our search's pieces (`_translator`)."""
    tr = _translator(run, tgt, beam)
    return [[tr.tgt_sp.id_to_piece(t) for t in h[0].tokens] for h in tr.translate_hypotheses(lines)]


def _same(ours: list[list[str]], theirs: list[list[str]]) -> None:
    """Equal outputs, those that reach the length limit included (both end them there alike)."""
    assert ours == theirs


def test_multilingual_ctranslate2_export_decodes_as_ours_with_the_token_in_front(one_to_many, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    import sentencepiece

    out = tmp_path / "ct2"
    result = runner.invoke(app, ["export", str(out), "--model", str(one_to_many), "--format", "ctranslate2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"wrote {out}", "language pairs: en -> es, en -> ny; the target named by the source token: es >>es<<, ny >>ny<<"]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(one_to_many / "spm.model"))
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    lines = _sources()
    outputs = {}
    for tgt in TARGETS:
        pieces = [[f">>{tgt}<<", *sp.encode(line, out_type=str)] for line in lines]
        for beam in (1, 4):
            theirs = ct.translate_batch(pieces, beam_size=beam, length_penalty=1.0, max_decoding_length=LONG + 1)
            outputs[tgt, beam] = _ours(one_to_many, tgt, lines, beam)
            _same(outputs[tgt, beam], [t.hypotheses[0] for t in theirs])
    assert sum(a != b for a, b in zip(outputs["es", 1], outputs["ny", 1])) >= len(lines) // 4  # the token is read


def test_multilingual_run_translates_through_the_ctranslate2_engine_as_through_ours(one_to_many, tmp_path):
    """`translate --engine ctranslate2 --tgt-lang X` (the run converted on first use, the token in
    front of each source) writes what `--engine torch` writes, for each target."""
    pytest.importorskip("ctranslate2")
    import shutil

    run = tmp_path / "run"
    shutil.copytree(one_to_many, run)  # the engine writes its conversion into the run
    (tmp_path / "in.en").write_text("\n".join(_sources()) + "\n", encoding="utf-8")
    written = {}
    for tgt in TARGETS:
        for engine in ("torch", "ctranslate2"):
            out = tmp_path / f"{engine}.{tgt}"
            result = runner.invoke(app, ["translate", "-m", str(run), "--tgt-lang", tgt, "-i", str(tmp_path / "in.en"),
                                         "-o", str(out), "--engine", engine, "--beam-size", "1", "--min-len", "1",
                                         "--max-len-a", "0", "--max-len-b", str(LONG), "--no-progress", "--device", "cpu"])
            assert result.exit_code == 0, result.output
            written[engine, tgt] = out.read_text(encoding="utf-8")
        assert written["ctranslate2", tgt] == written["torch", tgt], tgt
    assert written["torch", "es"] != written["torch", "ny"]


def test_multilingual_hf_export_is_an_opus_mt_multi_target_model(one_to_many, tmp_path):
    """`export --format hf` writes a Marian directory as OPUS-MT writes a multi-target model (the
    tokens in vocab.json, target_lang mul): transformers' `generate` of `>>es<< line` gives our
    translation, and the directory imports back as a run with the same targets and outputs."""
    out = tmp_path / "hf"
    result = runner.invoke(app, ["export", str(out), "--model", str(one_to_many), "--format", "hf"])
    assert result.exit_code == 0, result.output
    tok = transformers.MarianTokenizer.from_pretrained(out)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    assert sorted(tok.supported_language_codes) == [">>es<<", ">>ny<<"]
    assert (tok.source_lang, tok.target_lang) == ("en", "mul")
    back = import_marian(out, tmp_path / "back", src_lang="en")
    assert run_config(back).data.target_tokens == {"es": ">>es<<", "ny": ">>ny<<"}
    lines = _sources(12)
    for tgt in TARGETS:
        enc = tok([f">>{tgt}<< {line}" for line in lines], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = ending_as_ours(hf).generate(**enc, num_beams=1, do_sample=False, max_new_tokens=LONG + 1,
                                                    min_new_tokens=1)
        theirs = [[tok.convert_ids_to_tokens(t) for t in row[1:] if t not in (hf.config.pad_token_id, hf.config.eos_token_id)]
                  for row in generated.tolist()]
        assert _ours(one_to_many, tgt, lines, 1) == theirs, tgt
        assert _ours(back, tgt, lines, 1) == theirs, tgt


# Runs in a fresh interpreter (see test_export.py's ARGOS_SCRIPT): installs the packages, then
# translates one text into each target with Argos's greedy and beam-4 searches, offline.
ARGOS_PAIRS_SCRIPT = ARGOS_OFFLINE + r"""
request = json.loads(sys.argv[1])
for path in request["packages"]:
    argostranslate.package.install_from_path(path)
out = {"installed": sorted([p.from_code, p.to_code] for p in argostranslate.package.get_installed_packages())}
for tgt, text in request["texts"].items():
    translation = argostranslate.translate.get_translation_from_codes("en", tgt)
    for beam in (1, 4):
        argostranslate.settings.beam_size = beam
        translation.cache = {}
        out[f"{tgt} beam{beam}"] = translation.translate(text)
out["network"] = attempts
print(json.dumps(out))
"""


def test_multilingual_argos_export_writes_a_package_per_pair_that_argos_translates_as_ours(one_to_many, tmp_path):
    """`export --format argos DIR` of a one-to-many run writes en_es.argosmodel and
    en_ny.argosmodel; the real argostranslate installs both and translates into each target as
    our search does with the target's token in front (greedy, and beam 4 with Argos's length
    penalty 0.2): the package's CTranslate2 model puts the token there itself."""
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("ctranslate2")
    out = tmp_path / "packages"
    result = runner.invoke(app, ["export", str(out), "--model", str(one_to_many), "--format", "argos"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == [f"wrote {out / 'en_es.argosmodel'}", f"wrote {out / 'en_ny.argosmodel'}"]
    assert sorted(p.name for p in out.iterdir()) == ["en_es.argosmodel", "en_ny.argosmodel"]
    for tgt in TARGETS:
        with zipfile.ZipFile(out / f"en_{tgt}.argosmodel") as zf:
            root = f"translate-en_{tgt}-1_0"
            assert {n.split("/")[0] for n in zf.namelist()} == {root}
            meta = json.loads(zf.read(f"{root}/metadata.json"))
            model_config = json.loads(zf.read(f"{root}/model/config.json"))
            readme = zf.read(f"{root}/README.md").decode()
        assert (meta["from_code"], meta["to_code"]) == ("en", tgt) and "target_prefix" not in meta
        assert (model_config["bos_token"], model_config["add_source_bos"]) == (f">>{tgt}<<", True)
        assert f"the token >>{tgt}<< in" in readme

    # A sentence (Argos splits text into sentences first) whose outputs end before the length
    # limit, and differ from one target to the other.
    limit = 200
    searches = {f"{tgt} beam{beam}": _translator(one_to_many, tgt, beam, 0.2 if beam > 1 else 1.0, limit=limit)
                for tgt in TARGETS for beam in (1, 4)}

    def outputs(line: str) -> dict[str, list[int]]:
        return {key: tr.translate_hypotheses([line])[0][0].tokens for key, tr in searches.items()}

    candidates = [line for line in _sources(200) if sum(line.count(c) for c in ".!?") == 1 and line.endswith(".")]
    text = next(line for line in candidates if max(map(len, (got := outputs(line)).values())) < limit
                and got["es beam1"] != got["ny beam1"] and min(map(len, got.values())) > 2)
    ours = {key: tr.translate([text])[0] for key, tr in searches.items()}
    texts = dict.fromkeys(TARGETS, text)
    request = {"packages": [str(out / f"en_{tgt}.argosmodel") for tgt in TARGETS], "texts": texts}
    proc = subprocess.run([sys.executable, "-c", ARGOS_PAIRS_SCRIPT, json.dumps(request)], env=argos_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got.pop("installed") == [["en", "es"], ["en", "ny"]]
    assert got.pop("network") == []
    assert got == ours, text


def test_multilingual_argos_export_needs_a_directory(one_to_many, tmp_path):
    """A run of several pairs is written as a directory of packages: a file name is refused, and
    an existing directory is replaced (as a whole) only with --force."""
    one = tmp_path / "en_es.argosmodel"
    line = _error_line(runner.invoke(app, ["export", str(one), "--model", str(one_to_many), "--format", "argos"]))
    assert line == (f"error: {one}: {one_to_many} translates 2 language pairs (en -> es, en -> ny), a package each: "
                    "give a directory to write them into")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("x", encoding="utf-8")
    line = _error_line(runner.invoke(app, ["export", str(folder), "--model", str(one_to_many), "--format", "argos"]))
    assert line == f"error: {folder}: already exists and is not empty; use --force to overwrite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"] and (folder / "keep.txt").is_file()
    result = runner.invoke(app, ["export", str(folder), "--model", str(one_to_many), "--format", "argos", "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["en_es.argosmodel", "en_ny.argosmodel"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_many_to_one_argos_export_is_the_same_model_under_each_source(tmp_path):
    """A many-to-one run (es -> en, ny -> en) has no language token: its packages es_en and ny_en
    hold the same CTranslate2 model, which adds nothing to the source."""
    import zipfile

    pytest.importorskip("ctranslate2")
    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.train.loop import train

    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    corpora = [{"path": str(SHIPPED / "valid"), "src_lang": "es", "tgt_lang": "en"},
               {"path": str(REPO / "data" / "bible-ny-en" / "valid"), "src_lang": "ny", "tgt_lang": "en"}]
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update(train=corpora, valid=corpora[:1], test=None, filters="off")
    raw["train"].update(max_steps=2, valid_every=2)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = train(load_config(tmp_path / "config.yaml"), progress=False, log=lambda _: None)
    out = tmp_path / "packages"
    result = runner.invoke(app, ["export", str(out), "--model", str(run), "--format", "argos"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"wrote {out / 'es_en.argosmodel'}", f"wrote {out / 'ny_en.argosmodel'}",
                                          "language pairs: es -> en, ny -> en"]
    models = {}
    for src in ("es", "ny"):
        with zipfile.ZipFile(out / f"{src}_en.argosmodel") as zf:
            root = f"translate-{src}_en-1_0"
            meta = json.loads(zf.read(f"{root}/metadata.json"))
            models[src] = zf.read(f"{root}/model/model.bin"), json.loads(zf.read(f"{root}/model/config.json"))
        assert (meta["from_code"], meta["to_code"]) == (src, "en")
    assert models["es"] == models["ny"]
    assert (models["es"][1]["bos_token"], models["es"][1]["add_source_bos"]) == ("<s>", False)


# LibreTranslate's server, in the interpreter that SEQ2SEQ_LIBRETRANSLATE_PYTHON names (LibreTranslate
# pins its own versions of argostranslate's fork, numpy and Flask, so it has an environment of its
# own: `python -m venv lt && lt/bin/pip install libretranslate spacy`): the packages installed
# offline, every outgoing connection refused and recorded in $NETWORK_LOG, then LibreTranslate's
# main() on the port given.
LIBRETRANSLATE_SERVER = r"""
import os, socket, sys
def refuse(*args, **kwargs):
    with open(os.environ["NETWORK_LOG"], "a") as log:
        log.write(repr(args[1:2]) + "\n")
    raise OSError("network use refused by the test")
socket.socket.connect = refuse
import argostranslate.networking
argostranslate.networking.cache_spacy = lambda: None
import argostranslate.package
port, *packages = sys.argv[1:]
for path in packages:
    argostranslate.package.install_from_path(path)
from libretranslate.main import main
sys.argv = ["libretranslate", "--host", "127.0.0.1", "--port", port, "--disable-web-ui", "--threads", "1"]
main()
"""
# LibreTranslate's own formatting of a translation (its first letter and final punctuation after
# the source's), applied to ours: what its /translate answers for our output.
LIBRETRANSLATE_FORMAT = r"""
import json, sys
from libretranslate.language import improve_translation_formatting
print(json.dumps([improve_translation_formatting(q, text) for q, text in json.load(sys.stdin)]))
"""


@pytest.mark.skipif(not os.environ.get("SEQ2SEQ_LIBRETRANSLATE_PYTHON"),
                    reason="set SEQ2SEQ_LIBRETRANSLATE_PYTHON to a Python with libretranslate and spacy installed")
def test_multilingual_argos_packages_answer_libretranslate(one_to_many, tmp_path):
    """LibreTranslate serves the packages of a one-to-many run: /languages offers en -> es and
    en -> ny, and /translate into each target answers our beam-4 translation with the token in
    front (as LibreTranslate formats it), offline. Runs where SEQ2SEQ_LIBRETRANSLATE_PYTHON names
    a Python with libretranslate and spacy installed."""
    import socket
    import subprocess
    import time
    import urllib.request

    pytest.importorskip("ctranslate2")
    python = os.environ["SEQ2SEQ_LIBRETRANSLATE_PYTHON"]
    out = tmp_path / "packages"
    result = runner.invoke(app, ["export", str(out), "--model", str(one_to_many), "--format", "argos"])
    assert result.exit_code == 0, result.output
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "network.log"
    env = {**argos_env(tmp_path), "NETWORK_LOG": str(log)}
    server = subprocess.Popen([python, "-c", LIBRETRANSLATE_SERVER, str(port), *map(str, sorted(out.iterdir()))],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())

    try:
        for _ in range(600):
            try:
                languages = call("/languages")
                break
            except OSError:
                assert server.poll() is None, server.communicate()[0][-3000:]
                time.sleep(0.2)
        english = next(lang for lang in languages if lang["code"] == "en")
        assert set(TARGETS) <= set(english["targets"]), languages
        lines = [line for line in _sources(40) if sum(line.count(c) for c in ".!?") == 1 and line.endswith(".")][:8]
        asked, got, ours = [], [], {}
        for tgt in TARGETS:
            beam = _translator(one_to_many, tgt, 4, 0.2, limit=200)
            for line in lines:
                if len(beam.translate_hypotheses([line])[0][0].tokens) < 200:  # ended before the length limit
                    ours[tgt, line] = beam.translate([line])[0]
                    asked.append([line, ours[tgt, line]])
                    got.append(call("/translate", {"q": line, "source": "en", "target": tgt})["translatedText"])
    finally:
        server.terminate()
        server.communicate(timeout=60)
    formatted = subprocess.run([python, "-c", LIBRETRANSLATE_FORMAT], input=json.dumps(asked), capture_output=True,
                               text=True, check=True, env=env).stdout
    assert len(got) >= len(lines) and got == json.loads(formatted)
    assert any(ours["es", line] != ours["ny", line] for line in lines if ("es", line) in ours and ("ny", line) in ours)
    assert not log.exists(), log.read_text()
