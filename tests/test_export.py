"""CTranslate2 export: the exported model's beam search output equals ours up to ties of
float32 rounding, and scores each token as ours does; the output directory is replaced as a
whole or not at all."""

from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from helpers import sequence_log_prob
from seq2seq_cli.cli import app
from seq2seq_cli.config import load_config
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.train.loop import train

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'seq2seq[ctranslate2]')")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("export")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"]["train"] = raw["data"]["valid"] = str(SHIPPED / "valid")
    raw["model"].update(d_model=64, heads=4, ffn_size=128, encoder_layers=2, decoder_layers=2)
    raw["train"].update(max_steps=150, lr=0.005, warmup_steps=30)
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return train(load_config(path), progress=False, log=lambda _: None)


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
    theirs = ct.translate_batch(pieces, beam_size=4, length_penalty=1.0, max_decoding_length=limit, return_scores=True)
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
            mine = sequence_log_prob(tr.model, src, o[0].tokens) / (len(o[0].tokens) + 1)
            theirs_under_ours = sequence_log_prob(tr.model, src, other) / (len(other) + 1)
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
    from seq2seq_cli.decode.search import greedy_search
    from seq2seq_cli.ids import EOS, PAD
    from seq2seq_cli.interop.export import convert_ctranslate2

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
    theirs = ct.translate_batch(pieces, beam_size=1, max_decoding_length=12)
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
    from seq2seq_cli.interop import export

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
    from seq2seq_cli.ids import BOS, EOS, PAD
    from seq2seq_cli.interop.export import convert_ctranslate2

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
