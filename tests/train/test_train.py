"""The training loop (`train`): gradient accumulation, validation BLEU and early stopping,
the checkpointed `TrainState`, random generators restored on resume, torch.compile."""

import ast
import json
import math
import os
import random
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import SHIPPED, make_config, quiet, train_records
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.batching import collate, epoch_batches
from seq2seq_cli.data.encoding import encode_corpus
from seq2seq_cli.data.formats import read_parallel
from seq2seq_cli.data.tokenizer import load_tokenizers
from seq2seq_cli.model.transformer import build_model
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train.loop import train
from seq2seq_cli.train.loss import label_smoothed_nll
from seq2seq_cli.train.schedule import learning_rate
from seq2seq_cli.train.setup import make_optimizer
from seq2seq_cli.train.state import TrainState, rng_state, set_rng_state


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    """update_freq=2 over batches b1, b2 gives the update of one batch holding both."""
    # Adam's first update is lr * g / (|g| + eps): with the usual tiny eps it is +-lr for any
    # gradient, so rounding noise in a near-zero gradient flips its sign. A large eps makes the
    # update proportional to the gradient, and the comparison meaningful for every weight.
    cfg_path = make_config(tmp_path, "acc", max_steps=1, update_freq=2, clip_norm=0.0, eps=1.0, lr=1e-2, warmup_steps=0)
    config = load_config(cfg_path, ["model.dropout=0.0"])
    run = quiet(cfg_path, False, "model.dropout=0.0")
    src_sp, tgt_sp = load_tokenizers(run, True)
    data = encode_corpus(read_parallel(config.data.train, "es", "en"), src_sp, tgt_sp, 64, 64)
    b1, b2 = epoch_batches(data, config.train.max_tokens, config.train.seed, 0)[:2]
    torch.manual_seed(config.train.seed)
    model = build_model(config.model, src_sp.get_piece_size(), tgt_sp.get_piece_size(), True)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = make_optimizer(model, config.train, torch.device("cpu"))  # the optimizer training uses
    for group in opt.param_groups:
        group["lr"] = learning_rate(1, config.train)
    batch = collate(data, np.concatenate([b1, b2]))
    loss, _, n = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out, config.train.label_smoothing)
    (loss / n).backward()
    opt.step()
    trained = load_file(str(run / "checkpoints" / "last.safetensors"))
    for name, p in model.state_dict().items():
        if name in trained and not torch.equal(p, initial[name]):
            # float32 rounding differs between one padded batch and two (up to ~1e-3 of a
            # gradient entry); a wrong accumulation (per-batch normalisation, a lost batch)
            # changes the update by tens of percent
            expected, got = p - initial[name], trained[name] - initial[name]
            assert (got - expected).norm() <= 1e-2 * expected.norm() + 1e-9, name  # key biases: no gradient
    assert sum(not torch.equal(trained[k], initial[k]) for k in trained) > len(trained) // 2


def test_validation_bleu_best_by_bleu_early_stopping_and_plots(tmp_path):
    cfg = make_config(tmp_path, "v", max_steps=200, valid_every=4, valid_bleu=True, best_metric="bleu",
                      patience=2, tensorboard=True, plot=True, lr=1e-7, warmup_steps=0)
    messages = []
    run = train(load_config(cfg), progress=False, log=messages.append)
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "valid_nll" in line]
    assert all(r["valid_bleu_signature"].startswith("nrefs:1|") for r in valid)
    # lr 1e-7: nothing improves, so training stops after patience validations without a new best
    assert any("early stopping" in m for m in messages)
    assert valid[-1]["step"] < 200 and len(valid) <= 4
    best = json.loads((run / "checkpoints" / "best.json").read_text())["step"]
    assert best == max(valid, key=lambda r: (r["valid_bleu"], -r["step"]))["step"]
    assert (run / "plots" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("clang++") is None,
                    reason="torch.compile on CPU needs a C++ compiler (g++ or clang++) and none is on PATH")
def test_compiled_training_matches_eager_saves_plain_names_and_resumes(tmp_path):
    """train.compile: the same losses as eager (within float tolerance), checkpoint names
    without the compiler's `_orig_mod.` prefix, and a compiled run resumes from its save."""
    eager = quiet(make_config(tmp_path, "eager", max_steps=4, valid_every=2, log_every=1), False, "model.dropout=0.0")
    cfg = make_config(tmp_path, "compiled", max_steps=4, valid_every=2, log_every=1)
    quiet(cfg, False, "model.dropout=0.0", "train.compile=true", "train.max_steps=2")
    compiled = quiet(cfg, True, "model.dropout=0.0", "train.compile=true")
    assert load_file(str(compiled / "checkpoints" / "last.safetensors")).keys() == \
        load_file(str(eager / "checkpoints" / "last.safetensors")).keys()
    a, b = train_records(eager), train_records(compiled)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert y["train_loss"] == pytest.approx(x["train_loss"], rel=1e-3), x["step"]


def test_checkpoint_state_holds_exactly_the_train_state_and_the_optimizer(tmp_path):
    run = quiet(make_config(tmp_path, "s", max_steps=7))
    saved = ckpt.load_train_state(run / "checkpoints" / "last.state.pt")
    assert set(saved) == set(TrainState(rngs=[rng_state()]).state_dict()) | {"optimizer", "scaler"}
    state = TrainState()
    state.load_state_dict(saved)
    assert (state.step, state.epoch, state.validated_at) == (7, saved["epoch"], 7)
    again = state.state_dict()
    assert {k: v for k, v in again.items() if k not in ("elapsed", "rng")} == \
        {k: v for k, v in saved.items() if k not in ("elapsed", "rng", "optimizer", "scaler")}
    assert again["elapsed"] >= saved["elapsed"]


def test_rng_state_round_trip_covers_python_random():
    saved = rng_state()
    expected = (random.random(), torch.rand(3).tolist())
    random.seed(99)
    torch.manual_seed(99)
    set_rng_state(saved)
    assert (random.random(), torch.rand(3).tolist()) == expected


def test_resume_restores_pythons_random_state(tmp_path):
    """A run that draws from Python's `random` (here: its log callback) saves that state; a
    resume puts it back instead of leaving the generator at the seed."""
    cfg = make_config(tmp_path, "r", max_steps=7)
    train(load_config(cfg), progress=False, log=lambda _: random.random())
    saved = ckpt.load_train_state(tmp_path / "r" / "checkpoints" / "last.state.pt")["rng"]["python"]
    random.seed(12345)
    train(load_config(cfg), resume=True, progress=False, log=lambda _: None)  # already at max_steps: only resumes
    assert random.getstate() == ast.literal_eval(saved)


def test_bf16_training_on_cpu_lowers_the_loss(tmp_path):
    run = quiet(make_config(tmp_path, "bf16", precision="bf16", max_steps=60, log_every=10, valid_every=60))
    losses = [r["train_loss"] for r in train_records(run)]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5, losses
    assert all(math.isfinite(x) for x in losses)


def test_a_float32_run_resumes_in_fp16_with_a_fresh_loss_scaler(tmp_path):
    """A save without loss scaling holds an empty scaler state; resuming it with
    train.precision=fp16 starts the scaler afresh instead of failing to load it."""
    cfg = make_config(tmp_path, "fp16-resume", precision="fp32", max_steps=4, valid_every=2, log_every=1)
    run = quiet(cfg)
    assert ckpt.load_train_state(run / "checkpoints" / "last.state.pt")["scaler"] == {}
    quiet(cfg, True, "train.precision=fp16", "train.max_steps=6")
    state = ckpt.load_train_state(run / "checkpoints" / "last.state.pt")
    assert state["step"] == 6 and math.isfinite(state["scaler"]["scale"])


def test_bf16_attention_on_cpu_matches_float32():
    from seq2seq_cli.model.attention import scaled_dot_product_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    want = scaled_dot_product_attention(q, k, v, mask, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.0)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_validation_pairs_longer_than_the_positions_are_skipped_and_still_translated(tmp_path):
    """Validation loss leaves out the pairs the positions table cannot hold (one warning naming
    the file); validation BLEU translates every source line, cut to fit as `translate` does."""
    from typer.testing import CliRunner

    from seq2seq_cli.cli import app

    shipped = SHIPPED / "valid"
    src, tgt = ([ln for ln in shipped.with_suffix(f".{lang}").read_text(encoding="utf-8").splitlines()]
                for lang in ("es", "en"))
    valid = tmp_path / "valid"
    short = [i for i in range(len(src)) if len(src[i].split()) <= 8 and len(tgt[i].split()) <= 8][:12]
    src, tgt = [src[i] for i in short], [tgt[i] for i in short]
    assert len(short) == 12
    # short pairs, then one pair far longer than 40 subwords on both sides
    valid.with_suffix(".es").write_text("\n".join([*src, " ".join(src)]) + "\n", encoding="utf-8")
    valid.with_suffix(".en").write_text("\n".join([*tgt, " ".join(tgt)]) + "\n", encoding="utf-8")
    cfg = make_config(tmp_path, "short", max_steps=8, valid_every=4, valid_bleu=True, best_metric="bleu")
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--no-progress", "--set", f"data.valid={valid}",
                                 "--set", "data.max_src_len=40", "--set", "data.max_tgt_len=40",
                                 "--set", "model.max_positions=42"])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:") and str(valid) in line]
    assert len(warnings) == 1, r.stderr
    records = [json.loads(line) for line in (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()]
    skipped = records[0]["valid_dropped_too_long"]
    assert skipped >= 1 and f" {skipped} pair" in warnings[0]
    assert records[0]["valid_pairs"] >= 1 and records[0]["valid_pairs"] + skipped == 13
    assert [r["step"] for r in records if "valid_bleu" in r] == [4, 8]


def test_a_validation_split_with_no_pair_that_fits_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from seq2seq_cli.cli import app

    shipped = SHIPPED / "valid"
    valid = tmp_path / "valid"
    for lang in ("es", "en"):
        lines = shipped.with_suffix(f".{lang}").read_text(encoding="utf-8").splitlines()
        valid.with_suffix(f".{lang}").write_text(" ".join(lines[:12]) + "\n", encoding="utf-8")  # one very long pair
    cfg = make_config(tmp_path, "short", max_steps=8, valid_every=4)
    r = CliRunner().invoke(app, ["train", "--config", str(cfg), "--no-progress", "--set", f"data.valid={valid}",
                                 "--set", "data.max_src_len=40", "--set", "data.max_tgt_len=40",
                                 "--set", "model.max_positions=42"])
    assert r.exit_code == 1, r.output
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {valid}: no validation pair fits the model's 42 positions (EOS or start counted); "
        "give a validation split of shorter sentences")
    assert "Traceback" not in r.output
    assert not (tmp_path / "short" / "checkpoints").exists() or not any((tmp_path / "short" / "checkpoints").iterdir())
