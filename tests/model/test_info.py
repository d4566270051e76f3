"""Parameter accounting, FLOP and memory estimates, and the `seq2seq info` command."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import Result
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from seq2seq_cli.cli import app
from seq2seq_cli.config import ModelConfig
from seq2seq_cli.config_load import load_config
from seq2seq_cli.model.info import MemoryEstimate, flop_estimate, parameter_table
from seq2seq_cli.model.transformer import Seq2SeqTransformer, build_model
from seq2seq_cli.run.checkpoint import save_weights

REPO = Path(__file__).resolve().parents[2]
TINY = dict(d_model=16, heads=2, ffn_size=24, encoder_layers=2, decoder_layers=3, dropout=0.0, max_positions=40)

CONFIGS = [
    pytest.param({}, 23, 23, True, id="post-bias-tied-joint"),
    pytest.param({"norm": "pre"}, 23, 23, True, id="pre-norm"),
    pytest.param({"bias": False}, 23, 23, True, id="no-bias"),
    pytest.param({"tie_embeddings": False}, 23, 23, True, id="untied"),
    pytest.param({}, 29, 31, False, id="separate-vocabularies-tied-output"),
    pytest.param({"tie_embeddings": False, "norm": "pre"}, 29, 31, False, id="separate-untied-pre"),
    pytest.param({"positions": "learned"}, 23, 23, True, id="learned-positions"),
    pytest.param({"token_types": 3}, 23, 23, True, id="token-types"),
    pytest.param({"q_k_size": 5, "v_size": 11, "heads": 3, "bias": False}, 23, 23, True, id="qk-neq-v"),
]


def _model(overrides: dict, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**TINY, **overrides}), src_vocab, tgt_vocab, joint).eval()


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("overrides,src_vocab,tgt_vocab,joint", CONFIGS)
def test_table_total_equals_the_model_parameter_count(overrides, src_vocab, tgt_vocab, joint):
    model = _model(overrides, src_vocab, tgt_vocab, joint)
    table = parameter_table(model)
    assert table.total == sum(p.numel() for p in model.parameters())
    parts = [r.part for r in table.rows]
    assert len(parts) == len(set(parts))
    d = model.cfg.d_model
    shared = model.src_embed.tokens is model.tgt_embed.tokens
    assert ("source token embeddings = target token embeddings" in table.tied) == shared
    assert ("output projection = target token embeddings" in table.tied) == model.cfg.tie_embeddings
    assert table.subtotal("output") == (0 if model.cfg.tie_embeddings else tgt_vocab * d)
    assert table.subtotal("embeddings") == (
        tgt_vocab * d
        + (0 if shared else src_vocab * d)
        + (2 * model.cfg.max_positions * d if model.cfg.positions == "learned" else 0)
        + model.cfg.token_types * d
    )
    final_norms = table.subtotal("encoder.final_norm") + table.subtotal("decoder.final_norm")
    assert final_norms == (4 * d if model.cfg.norm == "pre" else 0)


def test_rows_follow_query_key_and_value_sizes():
    model = _model({"q_k_size": 5, "v_size": 11, "heads": 3}, 23, 23, True)
    table = parameter_table(model)
    d, h, dk, dv, f = 16, 3, 5, 11, 24
    for prefix in ("encoder.1.self_attn", "decoder.2.self_attn", "decoder.0.cross_attn"):
        counts = {r.part.rsplit(".", 1)[1]: r.count for r in table.rows if r.part.startswith(prefix + ".")}
        assert counts == {
            "W_Q": d * h * dk, "b_Q": h * dk, "W_K": d * h * dk, "b_K": h * dk,
            "W_V": d * h * dv, "b_V": h * dv, "W_O": h * dv * d, "b_O": d,
        }
    assert table.subtotal("encoder.0.ffn") == d * f + f + f * d + d
    assert table.subtotal("decoder.1.norm") == 3 * 2 * d


def test_bert_base_encoder_breakdown():
    """BERT-base with our real model: d_model 768, 12 heads of 64, FFN 3072, no linear biases
    (the textbook count is the matrices W_Q, W_K, W_V, W_O, W_1, W_2 plus two LayerNorms),
    30522 tokens, 512 learned positions and 2 token types (segments):
    embeddings (30522 + 512 + 2) * 768 = 23,835,648.
    """
    cfg = ModelConfig(
        d_model=768, heads=12, ffn_size=3072, encoder_layers=12, decoder_layers=1, bias=False,
        positions="learned", max_positions=512, tie_embeddings=True, token_types=2,
    )
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        model = build_model(cfg, 30522, 30522, joint_vocab=True)
    table = parameter_table(model)
    assert table.subtotal("encoder.0") == 7_080_960
    assert table.subtotal("encoder.0.self_attn") == 2_359_296
    assert table.subtotal("encoder.0.ffn") == 4_718_592
    assert table.subtotal("encoder.0.norm") == 3_072
    assert sum(table.subtotal(f"encoder.{i}.self_attn") for i in range(12)) == 28_311_552
    assert sum(table.subtotal(f"encoder.{i}.ffn") for i in range(12)) == 56_623_104
    embeddings = sum(table.subtotal(f"embeddings.{part}") for part in ("tokens", "source_positions", "source_token_types"))
    assert embeddings == (30522 + 512 + 2) * 768 == 23_835_648
    assert table.total == sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- FLOPs and memory


def _counted(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _explicit_logits(model: Seq2SeqTransformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Forward through the explicit attention path, whose matrix products the counter sees
    (it does not count the CPU scaled_dot_product_attention kernel)."""
    memory, src_mask, _ = model.encode(src, need_weights=True)
    h, _, _ = model.decode_with_weights(tgt, model.init_state(memory, src_mask))
    return model.logits(h)


@pytest.mark.parametrize("overrides,src_vocab,tgt_vocab,joint", [CONFIGS[0], CONFIGS[5], CONFIGS[7]])
def test_flop_formulas_equal_counted_matrix_products(overrides, src_vocab, tgt_vocab, joint):
    model = _model(overrides, src_vocab, tgt_vocab, joint)
    S, T = 7, 5
    src = torch.randint(4, src_vocab, (1, S))
    tgt = torch.randint(4, tgt_vocab, (1, T))
    est = flop_estimate(model.cfg, tgt_vocab, S, T)

    assert _counted(lambda: _explicit_logits(model, src, tgt)) == est.forward
    assert _counted(lambda: _explicit_logits(model, src, tgt).sum().backward()) == est.training

    memory, src_mask, _ = model.encode(src)
    assert _counted(lambda: model.init_state(memory, src_mask)) == est.cross_kv
    state = model.init_state(memory, src_mask)
    with torch.no_grad():
        model.decode(tgt[:, : T - 1], state, incremental=True)  # T - 1 positions cached
        step = _counted(lambda: model.logits(model.decode_with_weights(tgt[:, T - 1 :], state, incremental=True)[0]))
    assert state.length == T
    assert step == est.decode_step


def test_memory_estimates_match_real_tensors_and_adam_state():
    model = _model({"tie_embeddings": False}, 29, 31, False)
    mem = MemoryEstimate(parameter_table(model).total)
    assert mem.weights_fp32 == sum(p.numel() * p.element_size() for p in model.parameters())
    assert mem.weights_bf16 == sum(p.numel() * p.to(torch.bfloat16).element_size() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    src, tgt = torch.randint(4, 29, (2, 6)), torch.randint(4, 31, (2, 5))
    model(src, tgt).sum().backward()
    assert mem.gradients_fp32 == sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    optimizer.step()
    moments = [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]  # "step" is a scalar
    assert mem.adam_state == sum(t.numel() * t.element_size() for t in moments)
    assert mem.training == mem.weights_fp32 + mem.gradients_fp32 + mem.adam_state


# --------------------------------------------------------------------------- the command

runner = CliRunner()


def _invoke(*args: object) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def _total(output: str) -> int:
    return int(re.search(r"^total\s+([\d,]+)$", output, re.M).group(1).replace(",", ""))


def test_info_from_config_prints_the_table_and_follows_set(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    v, d = cfg.tokenizer.vocab_size, cfg.model.d_model
    torch.manual_seed(0)
    expected = sum(p.numel() for p in build_model(cfg.model, v, v, cfg.tokenizer.joint).parameters())

    r = _invoke("info", "--config", "configs/tiny.yaml")
    assert r.exit_code == 0, r.output
    assert _total(r.stdout) == expected
    assert f"vocabulary {v:,}" in r.stdout
    assert "tied: output projection = target token embeddings" in r.stdout
    for part in ("embeddings.tokens", "encoder.0.self_attn", "encoder.0.ffn", "decoder.0.cross_attn", "output"):
        assert re.search(rf"^{re.escape(part)}\s+[\d,]+", r.stdout, re.M), part
    assert "FLOPs" in r.stdout and "Adam state" in r.stdout

    r = _invoke("info", "-c", "configs/tiny.yaml", "--set", "model.tie_embeddings=false")
    assert r.exit_code == 0, r.output
    # untied: separate source embeddings and an output projection
    assert _total(r.stdout) == expected + 2 * v * d


def test_info_from_a_trained_checkpoint(tmp_path):
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["model.norm=pre", "model.positions=learned"])
    torch.manual_seed(0)
    model = build_model(cfg.model, 57, 57, True)
    save_weights(tmp_path / "run" / "checkpoints" / "last.safetensors", model, cfg, {"step": 3})
    r = _invoke("info", "--model", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert _total(r.stdout) == sum(p.numel() for p in model.parameters())
    assert "vocabulary 57" in r.stdout and "pre-norm" in r.stdout
    assert re.search(r"^encoder\.final_norm\s+64\s", r.stdout, re.M)


@pytest.mark.parametrize(
    "args,fragment",
    [
        ([], "give either --config FILE"),
        (["--config", "configs/tiny.yaml", "--model", "runs/x"], "give either --config FILE"),
        (["--model", "runs/x", "--set", "model.d_model=8"], "--set changes a config"),
        (["--config", "configs/tiny.yaml", "--set", "model.heads=5"], "must be divisible by heads"),
    ],
)
def test_info_errors_are_one_line(args, fragment, monkeypatch):
    monkeypatch.chdir(REPO)
    r = _invoke("info", *args)
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
    assert fragment in r.stderr
