"""CTranslate2 export: the exported model's beam search output equals ours up to ties of
float32 rounding, and scores each token as ours does; the output directory is replaced as a
whole or not at all. Argos export: the real argostranslate installs the package and translates
with it offline as we do; the package file is replaced as a whole or not at all."""

import json
from pathlib import Path

import pytest
import torch
from interop_helpers import ARGOS_OFFLINE, argos_env
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from helpers import sequence_log_prob
from seq2seq_cli.cli import app
from seq2seq_cli.decode.translate import Translator

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'seq2seq[ctranslate2]')")

@pytest.fixture(scope="module")
def run_dir(small_run) -> Path:
    """A small model trained enough (150 updates) to give sentences of words (shared, read only)."""
    return small_run


def test_ctranslate2_beam_output_equals_ours(run_dir, tmp_path):
    out = tmp_path / "ct2"
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "ctranslate2", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "model.bin").is_file()
    limit = 60
    tr = Translator.load(run_dir, "cpu", {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 0.0, "max_len_b": limit})
    lines = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:36]
    ours = tr.translate_hypotheses(lines)
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    pieces = [tr.src_sp.encode(line, out_type=str) for line in lines]
    # EOS counted: an output of `limit` tokens and EOS, or one of limit + 1 ended there
    theirs = ct.translate_batch(pieces, beam_size=4, length_penalty=1.0, max_decoding_length=limit + 1, return_scores=True)
    differ = 0
    for line, o, t in zip(lines, ours, theirs):
        if [tr.tgt_sp.id_to_piece(i) for i in o[0].tokens] == t.hypotheses[0]:
            continue
        # Both engines compute in float32 with different kernels: two hypotheses whose scores
        # tie to rounding can come out in either order. Any other difference is an error.
        differ += 1
        src = torch.tensor(tr.encode([line])[0])
        other = [tr.tgt_sp.piece_to_id(p) for p in t.hypotheses[0]]
        with torch.no_grad():
            mine = sequence_log_prob(tr.model, src, o[0].tokens, o[0].eos) / (len(o[0].tokens) + o[0].eos)
            eos = len(other) <= limit  # a longer output ended at the limit, without EOS
            theirs_under_ours = sequence_log_prob(tr.model, src, other, eos) / (len(other) + eos)
        assert abs(mine - theirs_under_ours) < 1e-3, (line, mine, theirs_under_ours)
    assert differ <= 2


def test_export_refuses_to_overwrite(run_dir, tmp_path):
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "ctranslate2", str(out)])
    assert r.exit_code != 0
    assert r.stderr.strip() == f"error: {out}: already exists and is not empty; use --force to overwrite"
    assert (out / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("activation", ["swish", "gelu"])
def test_ctranslate2_export_keeps_the_activation_and_the_logits_bias(activation, tmp_path):
    """A model whose feed-forward activation is not ReLU and whose logits carry a fixed bias
    (as a Marian import does) decodes in CTranslate2 as in ours."""
    from conftest import random_sources, tiny_model
    from seq2seq_cli.config import DecodeConfig
    from seq2seq_cli.convert.export import convert_ctranslate2
    from seq2seq_cli.decode.search import greedy_search
    from seq2seq_cli.ids import EOS, PAD

    model = tiny_model(vocab=23, activation=activation, logits_bias=True)
    with torch.no_grad():  # weights large enough for the activation and the bias to decide the outputs
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.logits_bias.normal_(0.0, 2.0)
    vocab = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, 23)]
    out = convert_ctranslate2(model, vocab, vocab, tmp_path / "ct2")
    src = random_sources(8)
    ours = greedy_search(model, src, DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=12))
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    pieces = [[vocab[t] for t in row.tolist() if t not in (PAD, EOS)] for row in src]
    theirs = ct.translate_batch(pieces, beam_size=1, max_decoding_length=13)  # 12 tokens and EOS, or 13 cut
    assert [[vocab[t] for t in h.tokens] for h in ours] == [t.hypotheses[0] for t in theirs]


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("fmt", ["ctranslate2", "hf"])
def test_export_force_replaces_the_directory_as_a_whole(run_dir, tmp_path, fmt):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x", encoding="utf-8")
    (out / "model.bin").write_bytes(b"old")
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", fmt, str(out), "--force"])
    assert r.exit_code == 0, r.output
    written = {"ctranslate2": "model.bin", "hf": "model.safetensors"}[fmt]
    assert (out / written).is_file() and (out / written).read_bytes() != b"old"
    assert not (out / "keep.txt").exists() and (fmt == "ctranslate2" or not (out / "model.bin").exists())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directory left beside it


@pytest.mark.parametrize("fmt", ["ctranslate2", "hf"])
def test_export_force_onto_a_run_in_use_is_refused_and_keeps_it(run_dir, tmp_path, fmt):
    from helpers import held_lock, snapshot

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "config.yaml").write_text("name: busy\n", encoding="utf-8")
    with held_lock(busy) as pid:
        line = _error_line(CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", fmt, str(busy), "--force"]))
    assert line.startswith(f"error: {busy}: run directory is in use by pid {pid} (seq2seq train, since "), line
    assert snapshot(busy) == {"config.yaml": b"name: busy\n"}


def test_an_interrupted_export_leaves_the_old_directory(run_dir, tmp_path, monkeypatch):
    from helpers import snapshot
    from seq2seq_cli.convert import export

    out = tmp_path / "ct2"
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), str(out)])
    assert r.exit_code == 0, r.output
    before = snapshot(out)

    def convert_then_fail(model, src_vocab, tgt_vocab, output_dir, quantization=None):
        (Path(output_dir) / "model.bin").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "convert_ctranslate2", convert_then_fail)
    with pytest.raises(OSError, match="No space left"):
        export.export_ctranslate2(run_dir, out, force=True)
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


@pytest.mark.parametrize("fmt", ["ctranslate2", "hf"])
def test_export_force_onto_a_symlink_names_it(run_dir, tmp_path, fmt):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    line = _error_line(CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", fmt, str(link), "--force"]))
    assert line == f"error: {link}: is a symbolic link; write into a directory that is not a link"
    assert link.is_symlink() and (elsewhere / "keep.txt").read_text(encoding="utf-8") == "x"


@pytest.mark.parametrize("scale_embedding", [False, True], ids=["unscaled", "scaled"])
def test_ctranslate2_export_keeps_the_embedding_scale(scale_embedding, tmp_path):
    """model.scale_embedding false (token embeddings not multiplied by sqrt(d_model)) is kept:
    CTranslate2 gives each target token the log-probability ours gives it."""
    from conftest import random_sources, tiny_model
    from seq2seq_cli.convert.export import convert_ctranslate2
    from seq2seq_cli.ids import BOS, EOS, PAD

    model = tiny_model(vocab=23, scale_embedding=scale_embedding)
    with torch.no_grad():  # token embeddings of the size of the positional table's, so their scale matters
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    vocab = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, 23)]
    out = convert_ctranslate2(model, vocab, vocab, tmp_path / "ct2")
    src, tgt = random_sources(6), random_sources(6, seed=5)
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    rows = [[vocab[t] for t in row.tolist() if t not in (PAD, EOS)] for row in src]
    targets = [[vocab[t] for t in row.tolist() if t not in (PAD, EOS)] for row in tgt]
    theirs = ct.score_batch(rows, targets)
    for i, (target, scored) in enumerate(zip(targets, theirs)):
        ids = [vocab.index(p) for p in target]
        with torch.no_grad():
            logits = model(src[i : i + 1], torch.tensor([[BOS, *ids]]))[0]
        mine = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) + 1), torch.tensor([*ids, EOS])]
        assert torch.allclose(mine, torch.tensor(scored.log_probs), atol=1e-4), (scored.log_probs, mine.tolist())


# Runs in a fresh interpreter whose HOME, XDG directories and ARGOS_PACKAGES_DIR lie in the
# test's temporary directory: argostranslate reads its settings and creates its directories
# when imported. Every network connection is refused and recorded, to show the package
# installs and translates offline. With ARGOS_CHUNK_TYPE=SPACY argostranslate fetches spaCy's
# multilingual sentence model when imported, for packages that carry no sentence splitter of
# their own; ours carries one (spacy/), so that fetch is replaced by "none cached".
ARGOS_SCRIPT = ARGOS_OFFLINE + r"""
path, from_code, to_code, text = sys.argv[1:5]
argostranslate.package.install_from_path(path)
packages = [(p.from_code, p.to_code, p.package_path.name) for p in argostranslate.package.get_installed_packages()]
out = {"packages": packages}
translation = argostranslate.translate.get_translation_from_codes(from_code, to_code)
for beam in (1, 4):
    argostranslate.settings.beam_size = beam
    translation.cache = {}  # it keeps each paragraph's last translation: clear it so that this search runs
    out[f"beam{beam}"] = translation.translate(text)
out["network"] = attempts
print(json.dumps(out))
"""


def test_argos_package_installs_and_translates_offline_as_ours(run_dir, tmp_path):
    """The real argostranslate installs the exported .argosmodel with install_from_path and
    translates with it, offline, as our own search does: greedy (ARGOS_BEAM_SIZE 1) and beam 4
    with its length penalty 0.2."""
    import json
    import subprocess
    import sys
    import zipfile

    out = tmp_path / "es_en.argosmodel"
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "argos", str(out)])
    assert r.exit_code == 0, r.output
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
    assert {n.split("/")[0] for n in names} == {"translate-es_en-1_0"}
    for member in ("model/model.bin", "sentencepiece.model", "metadata.json", "spacy/config.cfg", "README.md"):
        assert f"translate-es_en-1_0/{member}" in names

    # One sentence (Argos splits text into sentences first), which our search ends before its length limit.
    limits = {"max_len_a": 0.0, "max_len_b": 200}
    greedy = Translator.load(run_dir, "cpu", {"beam_size": 1, **limits})
    beam = Translator.load(run_dir, "cpu", {"beam_size": 4, "length_penalty": 0.2, **limits})
    lines = [line for line in (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()
             if sum(line.count(c) for c in ".!?") == 1 and line.endswith(".")]
    text = next(line for line in lines if len(greedy.translate_hypotheses([line])[0][0].tokens) < 150)
    ours = {"beam1": greedy.translate([text])[0], "beam4": beam.translate([text])[0]}

    proc = subprocess.run([sys.executable, "-c", ARGOS_SCRIPT, str(out), "es", "en", text], env=argos_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["packages"] == [["es", "en", "translate-es_en-1_0"]]
    assert got["network"] == []
    assert got["beam1"] == ours["beam1"], (text, got, ours)
    assert got["beam4"] == ours["beam4"], (text, got, ours)


# Put first on the path of docs/interop.md's snippet: every network connection is refused and
# recorded in the file $NETWORK_LOG.
REFUSE_NETWORK = r"""
import os, socket
def refuse(*args, **kwargs):
    with open(os.environ["NETWORK_LOG"], "a") as log:
        log.write(repr(args[1:2]) + "\n")
    raise OSError("network use refused by the test")
socket.socket.connect = refuse
socket.getaddrinfo = refuse
"""


def test_readme_argos_snippet_fetches_nothing(run_dir, tmp_path):
    """docs/interop.md's snippet, run as written on the package `export` wrote, translates without
    a network connection tried and without an error printed."""
    import os
    import shlex
    import subprocess
    import sys

    page = (REPO / "docs" / "interop.md").read_text(encoding="utf-8")
    block = next(b for b in page.split("```")[1::2] if "install_from_path" in b)
    export_line, snippet = block.strip().split("\n", 1)
    assert export_line.startswith("seq2seq export --model runs/quickstart --format argos es_en.argosmodel")
    *assignments, python, flag, code = shlex.split(snippet)
    assert (python, flag) == ("python", "-c")
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "argos", str(tmp_path / "es_en.argosmodel")])
    assert r.exit_code == 0, r.output
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSE_NETWORK, encoding="utf-8")
    log = tmp_path / "network.log"
    env = {k: v for k, v in argos_env(tmp_path).items() if k != "ARGOS_CHUNK_TYPE"}
    env.update(dict(a.split("=", 1) for a in assignments), PYTHONPATH=str(site), NETWORK_LOG=str(log))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    if "No module named 'argostranslate'" in proc.stderr:
        pytest.skip("argostranslate is not installed (pip install -e '.[argos]')")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not log.exists(), log.read_text()
    assert "HTTPSConnectionPool" not in proc.stdout + proc.stderr and "rror" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.stdout.strip(), proc.stderr  # the translation
    assert os.listdir(tmp_path / "argos-packages") == ["translate-es_en-1_0"]


# The rows of docs/errors.md, section "Argos packages", each checked below.
ARGOS_CASES = {"argos-output-exists", "argos-output-directory", "argos-output-in-run", "argos-vocabulary-file",
               "argos-separate-tokenizers", "argos-several-pairs"}  # the last in test_multilingual_interop.py


def _argos_error(args: list[str]) -> str:
    r = CliRunner().invoke(app, ["export", "--format", "argos", *args])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    return r.stderr.strip()


def test_argos_export_refuses_outputs_that_would_lose_data(run_dir, tmp_path):
    """argos-output-exists, argos-output-directory, argos-output-in-run: refused before any
    conversion, the file or directory there left as it was."""
    old = tmp_path / "old.argosmodel"
    old.write_bytes(b"old package")
    assert _argos_error(["--model", str(run_dir), str(old)]) == f"error: {old}: already exists; use --force to overwrite"
    assert old.read_bytes() == b"old package"
    folder = tmp_path / "folder"
    folder.mkdir()
    assert _argos_error(["--model", str(run_dir), str(folder), "--force"]) == \
        f"error: {folder}: is a directory, expected a file name to write"
    ckpt = run_dir / "checkpoints" / "best.safetensors"
    before = ckpt.read_bytes()
    assert _argos_error(["--model", str(run_dir), str(ckpt), "--force"]) == \
        f"error: {ckpt}: is a file of the run being exported ({run_dir}); write elsewhere"
    assert ckpt.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "old.argosmodel"]  # no temporary file left


def test_argos_export_replaces_a_package_only_when_complete(run_dir, tmp_path, monkeypatch):
    """--force replaces an existing package with a complete one; an export that fails midway
    leaves the old package as it was, and no temporary file beside it."""
    import zipfile

    import seq2seq_cli.convert.argos as argos

    out = tmp_path / "es_en.argosmodel"
    out.write_bytes(b"old package")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(argos, "write_sentence_splitter", broken)
        r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "argos", str(out), "--force"])
    assert r.exit_code != 0
    assert out.read_bytes() == b"old package"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    r = CliRunner().invoke(app, ["export", "--model", str(run_dir), "--format", "argos", str(out), "--force"])
    assert r.exit_code == 0, r.output
    with zipfile.ZipFile(out) as zf:
        meta = json.loads(zf.read("translate-es_en-1_0/metadata.json"))
    assert meta == {"package_version": "1.0", "argos_version": "1.10", "type": "translate", "from_code": "es",
                    "from_name": "Spanish", "to_code": "en", "to_name": "English", "links": []}


def test_argos_export_needs_one_sentencepiece_model(run_dir, tmp_path, monkeypatch):
    """argos-vocabulary-file, argos-separate-tokenizers: Argos encodes and decodes with one
    SentencePiece model, so a run with a vocabulary file (a Marian import) or separate source
    and target models is refused, and nothing is written."""
    import dataclasses

    import seq2seq_cli.convert.argos as argos

    real, real_config = argos.load_run, argos.run_config
    out = tmp_path / "x.argosmodel"

    def with_vocabulary_file(path):
        config = real_config(path)
        return config.model_copy(update={"tokenizer": config.tokenizer.model_copy(update={"vocabulary": "file"})})

    monkeypatch.setattr(argos, "run_config", with_vocabulary_file)
    assert _argos_error(["--model", str(run_dir), str(out)]) == (
        f"error: {run_dir}: cannot be exported for Argos: it tokenizes with SentencePiece models alone, "
        "and this run uses tokenizer.vocabulary: file")

    class OtherModel:
        def serialized_model_proto(self) -> bytes:
            return b"another SentencePiece model"

    monkeypatch.setattr(argos, "run_config", real_config)
    monkeypatch.setattr(argos, "load_run", lambda path, device: dataclasses.replace(real(path, device), tgt_sp=OtherModel()))
    assert _argos_error(["--model", str(run_dir), str(out)]) == (
        f"error: {run_dir}: cannot be exported for Argos: a package holds one SentencePiece model for both "
        "languages, and this run's source and target tokenizers differ (tokenizer.joint: false)")
    assert not out.exists()


def test_argos_errors_are_documented():
    import re

    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Argos packages", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| ([a-z0-9-]+) \|", section, flags=re.MULTILINE)) - {"case"} == ARGOS_CASES
