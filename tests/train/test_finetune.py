"""Fine-tuning with `train --init-from`: the weights, architecture and tokenizer of the init run,
a fresh optimizer and step count, contradictions refused by name, exact resume, and an
imported Marian model fine-tuned and then used for translation."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, assert_same, make_config, train_records, weights
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.batching import collate
from seq2seq_cli.data.encoding import EncodedCorpus
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import BOS, EOS, PAD
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train import loop as train_module
from seq2seq_cli.train.loop import train
from seq2seq_cli.train.schedule import learning_rate

runner = CliRunner()


def finetune(cfg: Path, init_from: Path | None, resume: bool = False, *overrides: str) -> Path:
    return train(load_config(cfg, list(overrides)), resume=resume, progress=False, log=lambda _: None,
                 init_from=init_from)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny trained run to start from."""
    tmp = tmp_path_factory.mktemp("base")
    return finetune(make_config(tmp, "base", max_steps=10, valid_every=5), None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, base) -> Path:
    """An uninterrupted fine-tuning run of 12 steps."""
    tmp = tmp_path_factory.mktemp("reference")
    return finetune(make_config(tmp, "ft", max_steps=12, valid_every=5, lr=0.001, seed=7), base)


def test_first_forward_sees_the_init_weights_and_the_step_count_restarts(base, tmp_path, monkeypatch):
    seen: list[dict[str, torch.Tensor]] = []
    accumulate = train_module.accumulate_gradients

    def spy(model, *args, **kwargs):
        if not seen:
            seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return accumulate(model, *args, **kwargs)

    monkeypatch.setattr(train_module, "accumulate_gradients", spy)
    run = finetune(make_config(tmp_path, "ft", max_steps=4, valid_every=2, log_every=1), base)
    init = load_file(str(base / "checkpoints" / "best.safetensors"))
    assert set(init) <= set(seen[0])  # (tied embeddings are saved once)
    assert all(torch.equal(seen[0][k], init[k]) for k in init)
    assert [r["step"] for r in train_records(run)] == [1, 2, 3, 4]  # from step 0, not from the init's 10
    first_lr = train_records(run)[0]["lr"]
    assert first_lr == pytest.approx(learning_rate(1, load_config(run / "config.yaml").train))
    assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == 4
    assert not torch.equal(weights(run)["src_embed.tokens.weight"], init["src_embed.tokens.weight"])

    # the run stands alone: its own tokenizer copy, translate works with the init run gone
    assert (run / "spm.model").read_bytes() == (base / "spm.model").read_bytes()
    alone = tmp_path / "alone"
    shutil.copytree(run, alone)
    r = runner.invoke(app, ["translate", "-m", str(alone)], input="en el principio\n")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 1


def test_a_checkpoint_file_can_be_the_init(base, tmp_path):
    step = min((base / "checkpoints").glob("step-*.safetensors"))
    run = finetune(make_config(tmp_path, "ft", max_steps=1, valid_every=1), step)
    assert (run / "spm.model").is_file()


ERROR_CASES = {  # case -> (extra arguments, init run or not, fragments of the one error line)
    "finetune-architecture": (["--set", "model.d_model=64"], True,
                              ["the config contradicts the run it starts from: model.d_model is 64 in the config, 32 in"]),
    "finetune-activation": (["--set", "model.activation=swish"], True, ["model.activation is 'swish' in the config, 'relu' in"]),
    "finetune-vocabulary": (["--set", "tokenizer.vocab_size=500"], True, ["tokenizer.vocab_size is 500 in the config, 300 in"]),
    "finetune-not-a-run": ([], False, ["no checkpoints/best.safetensors or checkpoints/last.safetensors"]),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_init_is_one_line_naming_the_problem(base, tmp_path, case):
    extra, from_run, fragments = ERROR_CASES[case]
    cfg = make_config(tmp_path, "ft", max_steps=2)
    init = base if from_run else tmp_path
    r = runner.invoke(app, ["train", "--config", str(cfg), *extra, "--init-from", str(init), "--no-progress"])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert all(f in lines[0] for f in fragments), lines[0]
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_every_error_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Fine-tuning", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| ([a-z0-9-]+) \|", section, flags=re.MULTILINE)) - {"case"}
    assert documented == set(ERROR_CASES) | {"finetune-own-run", "finetune-damaged-sha256", "finetune-damaged-nan"}


def test_free_keys_and_defaults_follow_the_user_and_the_init_run(base, tmp_path):
    """Keys left out take the init run's values; dropout and training keys are the user's."""
    raw = yaml.safe_load(make_config(tmp_path, "ft", max_steps=1, valid_every=1).read_text())
    raw["model"] = {"dropout": 0.3}
    del raw["tokenizer"]
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    run = finetune(cfg, base)
    saved = load_config(run / "config.yaml")
    assert saved.model.dropout == 0.3 and saved.model.d_model == 32 and saved.tokenizer.vocab_size == 300


def test_init_from_its_own_run_directory_is_refused(base):
    with pytest.raises(UserError, match="this run's own directory"):
        finetune(base / "config.yaml", base)


@pytest.mark.parametrize("stop_at", [3, 7])
def test_interrupted_fine_tuning_resumes_exactly(reference, base, tmp_path, stop_at):
    """Stopped early, then resumed: the same weights and records as the uninterrupted run, so the
    resume continued from the run's own checkpoint, not from the init run's weights."""
    cfg = make_config(tmp_path, "ft", max_steps=12, valid_every=5, lr=0.001, seed=7)
    finetune(cfg, base, False, f"train.max_steps={stop_at}")
    if stop_at == 3:
        run = finetune(cfg, base, True)  # the same command again, with --resume
    else:  # what the interrupt message says: the run's own config, no --init-from
        run = finetune(tmp_path / "ft" / "config.yaml", None, True, "train.max_steps=12")
    assert_same(reference, run)


def test_training_batches_start_with_the_models_decoder_start_id():
    corpus = EncodedCorpus.from_lists([[5, 6], [7]], [[8, 9, 10], [11]])
    assert collate(corpus, np.array([0, 1])).tgt_in[:, 0].tolist() == [BOS, BOS]
    corpus.decoder_start = PAD
    batch = collate(corpus, np.array([0, 1]))
    assert batch.tgt_in.tolist() == [[PAD, 8, 9, 10], [PAD, 11, PAD, PAD]]
    assert batch.tgt_out.tolist() == [[8, 9, 10, EOS], [11, EOS, PAD, PAD]]


# --------------------------------------------------------------------------- an imported Marian model


def _marian(root: Path) -> Path:
    """save_pretrained of a small random MarianMTModel (swish, shared embeddings) and its tokenizer."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    lines = [" ".join(line.split()[:8]) for lang in ("es", "en")
             for line in (SHIPPED / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:300]]
    (root / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "text.txt"), model_prefix=str(root / "sp"), vocab_size=120,
                                   minloglevel=2, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1)
    out = root / "marian"
    out.mkdir()
    sp = spm.SentencePieceProcessor(model_file=str(root / "sp.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab["<pad>"] = len(vocab)
    V = len(vocab)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(root / "sp.model", out / name)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    config = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, activation_function="swish", scale_embedding=True,
        pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    model.save_pretrained(out)
    transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")).save_pretrained(out)
    return out


def test_an_imported_marian_model_fine_tunes_and_translates(tmp_path, corpus_dir):
    marian = _marian(tmp_path)
    for split in ("train", "valid"):  # sentences well within the model's 64 positions
        for lang in ("es", "en"):
            lines = (corpus_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            short = "\n".join(" ".join(x.split()[:10]) for x in lines) + "\n"
            (corpus_dir / f"{split}.{lang}").write_text(short, encoding="utf-8")
    imported = tmp_path / "imported"
    r = runner.invoke(app, ["import", str(marian), str(imported)])
    assert r.exit_code == 0, r.output
    raw = {
        "name": "ft", "run_dir": str(tmp_path / "ft"),
        "data": {"src_lang": "es", "tgt_lang": "en", "train": str(corpus_dir / "train"),
                 "valid": str(corpus_dir / "valid"), "max_src_len": 60, "max_tgt_len": 60},
        "train": {"device": "cpu", "precision": "fp32", "max_steps": 40, "lr": 0.003, "warmup_steps": 4,
                  "valid_every": 40, "log_every": 5, "max_tokens": 1024, "tensorboard": False, "plot": False},
        "decode": {"beam_size": 2, "max_len_b": 5, "max_len_a": 1.0},
    }
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r = runner.invoke(app, ["train", "--config", str(cfg), "--init-from", str(imported), "--no-progress"])
    assert r.exit_code == 0, r.output
    run = tmp_path / "ft"
    config = load_config(run / "config.yaml")
    assert config.model.activation == "swish" and config.model.position_layout == "halves"
    assert config.model.logits_bias and config.model.decoder_start_id == PAD
    assert config.tokenizer.vocabulary == "file"
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (run / name).read_bytes() == (imported / name).read_bytes()
    losses = [rec["train_loss"] for rec in train_records(run)]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5
    shutil.rmtree(imported)  # the fine-tuned run needs nothing of the run it started from
    r = runner.invoke(app, ["translate", "-m", str(run)], input="en el principio\ny dijo dios\n")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 2


def damaged_copy(base: Path, tmp_path: Path, nan: bool) -> Path:
    """A copy of the base run whose best weights are corrupted (sha256 no longer matches), or
    hold a NaN under a manifest that matches them."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    copy = tmp_path / "damaged"
    shutil.copytree(base, copy)
    best = copy / "checkpoints" / "best.safetensors"
    if nan:
        with safe_open(str(best), framework="pt") as f:
            meta = f.metadata()
        tensors = load_file(str(best))
        tensors["src_embed.tokens.weight"][3, 5] = float("nan")
        save_file(tensors, str(best), metadata=meta)
        manifest = json.loads((copy / "checkpoints" / "best.json").read_text())
        manifest["sha256"]["weights"] = ckpt.sha256(best)
        (copy / "checkpoints" / "best.json").write_text(json.dumps(manifest))
    else:
        data = bytearray(best.read_bytes())
        data[-7] ^= 0x40
        best.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("nan", [False, True], ids=["sha256", "nan"])
def test_init_from_damaged_weights_is_refused_before_anything_is_written(base, tmp_path, nan):
    init = damaged_copy(base, tmp_path, nan)
    best = init / "checkpoints" / "best.safetensors"
    cfg = make_config(tmp_path, "ft", max_steps=2)
    r = runner.invoke(app, ["train", "--config", str(cfg), "--init-from", str(init), "--no-progress"])
    assert r.exit_code == 1
    expected = (f"error: {best}: weights are damaged: 1 tensors hold NaN or infinite values (src_embed.tokens.weight, ...)"
                if nan else f"error: {best}: best.safetensors is corrupted or truncated (sha256 does not match best.json)")
    assert r.stderr.strip().splitlines() == [expected]
    assert not (tmp_path / "ft").exists()
