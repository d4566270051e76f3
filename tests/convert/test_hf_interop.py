"""HF Marian interop: a MarianMTModel built here (random weights, a SentencePiece model
trained here) imported as a run gives transformers' logits and `generate` outputs; runs
exported with `--format hf` load in transformers with the same logits; bad input is one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from interop_helpers import ending_as_ours, marian_dir, marian_spm, shipped_lines
from typer.testing import CliRunner

from conftest import REPO, tiny_model
from helpers import held_lock, snapshot
from seq2seq_cli.cli import app
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.convert.hf import export_hf
from seq2seq_cli.convert.hf_import import import_marian
from seq2seq_cli.data.tokenizer import load_tokenizers
from seq2seq_cli.decode.search import beam_search, greedy_search
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, PAD
from seq2seq_cli.run.loaded import load_run

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
runner = CliRunner()
LIMIT = 12  # output tokens before EOS; an output still going ends with one more, in both toolkits


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A SentencePiece model in Marian's id layout (eos 0, unk 1, no bos/pad)."""
    return marian_spm(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module", params=[(True, "swish"), (False, "relu")], ids=["shared-swish", "separate-relu"])
def imported(request, tmp_path_factory, spm_model):
    root = tmp_path_factory.mktemp("hf")
    src = marian_dir(root, spm_model, *request.param)
    run = import_marian(src, root / "run")
    hf = transformers.MarianMTModel.from_pretrained(src).eval()
    return src, run, hf


def test_imported_model_gives_transformers_logits_and_outputs(imported):
    src, run, hf = imported
    loaded = load_run(run)
    model, config = loaded.model, loaded.config
    src_tok, tgt_tok = load_tokenizers(run, config.tokenizer.joint, config.tokenizer.vocabulary)
    assert config.model.activation in ("swish", "relu") and config.model.position_layout == "halves"
    hf_tok = transformers.MarianTokenizer.from_pretrained(src)
    marian_vocab = json.loads((src / "vocab.json").read_text(encoding="utf-8"))
    to_hf = [marian_vocab[tgt_tok.id_to_piece(i)] for i in range(tgt_tok.get_piece_size())]
    lines = shipped_lines()[:50]
    ours_ids = [s + [EOS] for s in src_tok.encode(lines)]
    enc = hf_tok(lines, return_tensors="pt", padding=True)
    for mine, theirs, mask in zip(ours_ids, enc.input_ids.tolist(), enc.attention_mask.tolist()):
        assert [to_hf[i] for i in mine] == theirs[: sum(mask)]  # the tokenizer layer: same pieces, same ids
    width = max(map(len, ours_ids))
    src_ours = torch.tensor([s + [PAD] * (width - len(s)) for s in ours_ids])

    # Logits of a teacher-forced pass, fp32, every real position.
    start = hf.config.decoder_start_token_id
    tgt_hf = torch.tensor([[start, 5, 7, 9, 11], [start, 12, 4, 6, 8]])
    from_hf = {m: i for i, m in enumerate(to_hf)}
    tgt_ours = torch.tensor([[from_hf[i] for i in row] for row in tgt_hf.tolist()])
    with torch.no_grad():
        theirs = hf(input_ids=enc.input_ids[:2], attention_mask=enc.attention_mask[:2], decoder_input_ids=tgt_hf).logits
        mine = model(src_ours[:2], tgt_ours)
    assert torch.allclose(mine, theirs[..., to_hf], atol=1e-5, rtol=0)

    # Greedy and beam-4 search against generate with the same settings.
    for beams in (1, 4):
        opts = DecodeConfig(beam_size=beams, max_len_a=0, max_len_b=LIMIT, length_penalty=1.0)
        hyps = greedy_search(model, src_ours, opts) if beams == 1 else [h[0] for h in beam_search(model, src_ours, opts)]
        out = ending_as_ours(hf).generate(
            input_ids=enc.input_ids, attention_mask=enc.attention_mask, num_beams=beams, do_sample=False,
            max_new_tokens=LIMIT + 1, length_penalty=1.0, early_stopping=True if beams > 1 else None,
            bad_words_ids=[[hf.config.pad_token_id]], num_return_sequences=1,
        )
        for h, row in zip(hyps, out.tolist()):
            theirs_tokens = [t for t in row[1:] if t != hf.config.pad_token_id]
            # at the limit: no EOS in either
            assert [to_hf[t] for t in h.tokens] + [hf.config.eos_token_id] * h.eos == theirs_tokens, beams


@pytest.mark.parametrize("overrides", [
    {}, {"activation": "swish", "bias": False}, {"tie_embeddings": False, "activation": "gelu", "scale_embedding": False},
], ids=["default", "swish-no-bias", "untied-gelu"])
def test_export_hf_loads_in_transformers_with_the_same_logits(tmp_path, overrides):
    from seq2seq_cli.config_load import validate_config
    from seq2seq_cli.run.checkpoint import save_checkpoint

    run = tmp_path / "run"
    model = tiny_model(vocab=120, **overrides)
    config = validate_config({"name": "t", "run_dir": str(run), "data": {"train": "x", "max_src_len": 60, "max_tgt_len": 60},
                              "tokenizer": {"vocab_size": 120}, "model": model.cfg.model_dump()}, "test")
    run.mkdir()
    (tmp_path / "text.txt").write_text("\n".join(shipped_lines()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "text.txt"), model_prefix=str(run / "spm"), vocab_size=120,
                                   minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3)
    save_checkpoint(run / "checkpoints", 1, model, config, {"step": 1}, {}, best=True, keep_last=1)
    out = export_hf(run, tmp_path / "hf")
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    tok = transformers.MarianTokenizer.from_pretrained(out)
    lines = shipped_lines()[:4]
    enc = tok(lines, return_tensors="pt", padding=True)
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    assert enc.input_ids[0].tolist()[: enc.attention_mask[0].sum()] == sp.encode(lines[0]) + [EOS]
    tgt = torch.tensor([[2, 5, 7, 9], [2, 11, 4, 6], [2, 8, 9, 10], [2, 30, 40, 50]])
    with torch.no_grad():
        theirs = hf(input_ids=enc.input_ids, attention_mask=enc.attention_mask, decoder_input_ids=tgt).logits
        mine = model(enc.input_ids.masked_fill(enc.attention_mask == 0, PAD), tgt)
    assert torch.allclose(mine, theirs, atol=1e-5, rtol=0)


def test_export_hf_refuses_an_architecture_marian_lacks(tmp_path):
    from seq2seq_cli.config_load import validate_config
    from seq2seq_cli.run.checkpoint import save_checkpoint

    model = tiny_model(positions="learned", norm="pre")
    config = validate_config({"name": "t", "data": {"train": "x", "max_src_len": 60, "max_tgt_len": 60},
                              "model": model.cfg.model_dump()}, "test")
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, config, {"step": 1}, {}, best=True, keep_last=1)
    with pytest.raises(UserError, match="model.norm pre.*model.positions learned"):
        export_hf(tmp_path / "run", tmp_path / "hf")


# --------------------------------------------------------------------------- bad input


def _broken(root: Path, spm_model: Path, name: str) -> Path:
    """A Marian directory with one thing wrong (`name`)."""
    src = marian_dir(root, spm_model, True, "relu")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    if name == "import-not-marian":
        (src / "config.json").unlink()
    elif name == "import-missing-spm":
        (src / "target.spm").unlink()
    elif name == "import-activation":
        config["activation_function"] = "gelu_new"
    elif name == "import-layout":
        config["static_position_embeddings"] = False
    elif name == "import-vocab-size":
        config["vocab_size"] = config["decoder_vocab_size"] = config["vocab_size"] + 1
    elif name == "import-vocab-other-pieces":  # ids kept, most pieces not those of source.spm
        vocab = json.loads((src / "vocab.json").read_text(encoding="utf-8"))
        vocab = {(f"x{piece}" if 20 <= i < len(vocab) - 1 else piece): i for piece, i in vocab.items()}
        (src / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    if name != "import-not-marian":
        (src / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return src


IMPORT_CASES = {
    "import-not-marian": ("not a Marian model directory (no config.json)", 1),
    "import-missing-spm": ("target.spm: missing (a Marian directory holds source.spm, target.spm and vocab.json)", 1),
    "import-activation": ("activation_function 'gelu_new' is not supported", 1),
    "import-layout": ("static_position_embeddings False is not supported", 1),
    "import-vocab-size": ("vocab.json: 121 entries for ids 0..121", 1),
    "import-vocab-other-pieces": ("vocab.json: holds 18 of the 118 pieces of source.spm; it is not the vocabulary "
                                  "of this SentencePiece model (each piece it lacks would become <unk>)", 1),
}


@pytest.mark.parametrize("case", sorted(IMPORT_CASES))
def test_bad_import_is_one_line(tmp_path, spm_model, case):
    src = _broken(tmp_path, spm_model, case)
    result = runner.invoke(app, ["import", str(src), str(tmp_path / "run")])
    fragment, code = IMPORT_CASES[case]
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def marian_src(tmp_path_factory, spm_model) -> Path:
    return marian_dir(tmp_path_factory.mktemp("marian"), spm_model, True, "relu")


# config.json keys set to a bad value -> the one line naming config.json and the key.
CONFIG_CASES = {
    "import-config-heads-zero": ({"encoder_attention_heads": 0, "decoder_attention_heads": 0},
                                 "config.json: encoder_attention_heads 0 is not supported (expected a positive integer)"),
    "import-config-heads-divide": ({"encoder_attention_heads": 3, "decoder_attention_heads": 3},
                                   "config.json: d_model 16 is not divisible by encoder_attention_heads 3"),
    "import-config-size-negative": ({"d_model": -16}, "config.json: d_model -16 is not supported (expected a positive integer)"),
    "import-config-no-layers": ({"decoder_layers": 0},
                                "config.json: decoder_layers 0 is not supported (expected a positive integer)"),
    "import-config-positions-huge": ({"max_position_embeddings": 10**13},
                                     "config.json: max_position_embeddings 10000000000000 is out of range (expected 3 to 65536)"),
    "import-config-positions-float": ({"max_position_embeddings": 1e13},
                                      "config.json: max_position_embeddings 10000000000000.0 is not supported "
                                      "(expected one integer)"),
    "import-config-positions-one": ({"max_position_embeddings": 1},
                                    "config.json: max_position_embeddings 1 is out of range (expected 3 to 65536)"),
    "import-config-decoder-vocab": ({"decoder_vocab_size": "many"},
                                    "config.json: decoder_vocab_size 'many' is not supported (expected one integer)"),
    "import-config-activation-list": ({"activation_function": ["relu"]},
                                      "config.json: activation_function ['relu'] is not supported (supported: relu, swish, "
                                      "silu, gelu)"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_json_is_one_line_naming_the_key(tmp_path, marian_src, case):
    changes, message = CONFIG_CASES[case]
    src = tmp_path / "opus"
    shutil.copytree(marian_src, src)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    (src / "config.json").write_text(json.dumps({**config, **changes}), encoding="utf-8")
    line = _error_line(runner.invoke(app, ["import", str(src), str(tmp_path / "run")]))
    assert line == f"error: {src / message}", line
    assert not (tmp_path / "run").exists()


def test_export_refusal_is_one_line(tmp_path):
    from seq2seq_cli.config_load import validate_config
    from seq2seq_cli.run.checkpoint import save_checkpoint

    model = tiny_model(positions="learned")
    config = validate_config({"name": "t", "data": {"train": "x", "max_src_len": 60, "max_tgt_len": 60},
                              "model": model.cfg.model_dump()}, "test")
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, config, {"step": 1}, {}, best=True, keep_last=1)
    result = runner.invoke(app, ["export", str(tmp_path / "hf"), "-m", str(tmp_path / "run"), "--format", "hf"])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: ") and "model.positions learned" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- the output directory

# The rows of docs/errors.md about the output directory, each checked by the tests below.
OUTPUT_CASES = {"output-holds-input", "output-in-use", "output-symlink", "output-file", "output-not-empty"}


def test_import_onto_its_own_source_or_a_parent_keeps_the_source(tmp_path, spm_model):
    src = marian_dir(tmp_path, spm_model, True, "relu")
    before = snapshot(tmp_path)
    for target in (src, tmp_path):
        line = _error_line(runner.invoke(app, ["import", str(src), str(target), "--force"]))
        assert line == f"error: {target}: holds the model being imported ({src.resolve()}); write into another directory"
    assert snapshot(tmp_path) == before


def test_import_force_onto_a_run_in_use_is_refused_and_keeps_it(tmp_path, spm_model):
    src = marian_dir(tmp_path, spm_model, True, "relu")
    run = import_marian(src, tmp_path / "run")
    before = snapshot(run)
    with held_lock(run) as pid:
        line = _error_line(runner.invoke(app, ["import", str(src), str(run), "--force"]))
    assert line.startswith(f"error: {run}: run directory is in use by pid {pid} (seq2seq train, since "), line
    assert line.endswith("; wait for it to finish, or write into another directory"), line
    assert snapshot(run) == before


def test_an_interrupted_import_leaves_the_old_run_and_a_finished_one_replaces_it(tmp_path, spm_model, monkeypatch):
    from seq2seq_cli.run import checkpoint

    src = marian_dir(tmp_path, spm_model, True, "relu")
    run = import_marian(src, tmp_path / "run")
    (run / "notes.txt").write_text("mine", encoding="utf-8")
    before = snapshot(run)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_checkpoint", disk_full)
    with pytest.raises(OSError, match="No space left"):
        import_marian(src, run, force=True)
    assert snapshot(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, run.name])  # no temporary directory left
    monkeypatch.undo()
    line = _error_line(runner.invoke(app, ["import", str(src), str(run)]))
    assert line == f"error: {run}: already exists and is not empty; use --force to overwrite"
    import_marian(src, run, force=True)  # the whole directory is replaced: what the old one held besides is gone
    assert not (run / "notes.txt").exists() and (run / "checkpoints" / "best.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, run.name])


def test_import_force_onto_a_symlink_or_a_file_names_it(tmp_path, spm_model):
    src = marian_dir(tmp_path, spm_model, True, "relu")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    line = _error_line(runner.invoke(app, ["import", str(src), str(link), "--force"]))
    assert line == f"error: {link}: is a symbolic link; write into a directory that is not a link"
    assert link.is_symlink() and (elsewhere / "keep.txt").read_text(encoding="utf-8") == "x"
    line = _error_line(runner.invoke(app, ["import", str(src), str(elsewhere / "keep.txt"), "--force"]))
    assert line == f"error: {elsewhere / 'keep.txt'}: is a file, expected a directory to write into"
    assert (elsewhere / "keep.txt").read_text(encoding="utf-8") == "x"


def test_every_import_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Import and export", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| ([a-z0-9-]+) \|", section, flags=re.MULTILINE)) - {"case"}
    multi = {"import-target-language"}  # test_multilingual_interop.py
    assert documented == set(IMPORT_CASES) | set(CONFIG_CASES) | {"export-hf-architecture"} | OUTPUT_CASES | multi


def test_imported_run_works_with_translate_and_info(imported, tmp_path):
    _, run, _ = imported
    (tmp_path / "in.txt").write_text("hola\n\nen el principio\n", encoding="utf-8")
    result = runner.invoke(app, ["translate", "-m", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt"),
                                 "--beam-size", "2", "--no-progress", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 3
    result = runner.invoke(app, ["info", "-m", str(run)])
    assert result.exit_code == 0 and "total" in result.stdout


def test_imported_run_exports_to_ctranslate2_with_the_same_outputs(imported, tmp_path):
    """An imported Marian run (its own vocabulary file, decoding started from <pad>, swish or
    ReLU, a logits bias) exports to CTranslate2 and decodes there as in ours."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from seq2seq_cli.decode.translate import Translator

    _, run, _ = imported
    out = tmp_path / "ct2"
    result = runner.invoke(app, ["export", str(out), "--model", str(run), "--format", "ctranslate2"])
    assert result.exit_code == 0, result.output
    tr = Translator.load(run, "cpu", {"beam_size": 1, "max_len_a": 0.0, "max_len_b": 12})
    lines = ["hola", "en el principio", "y dijo dios", "la tierra"]
    ours = [[tr.tgt_sp.id_to_piece(t) for t in h[0].tokens] for h in tr.translate_hypotheses(lines)]
    ct = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    pieces = [[tr.src_sp.id_to_piece(i) for i in tr.src_sp.encode(line)] for line in lines]
    theirs = [t.hypotheses[0] for t in ct.translate_batch(pieces, beam_size=1, max_decoding_length=13)]  # EOS counted
    assert ours == theirs
