"""The moving average of the weights (train.ema_decay) and the initial weights (model.init)."""

import math

import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_same, make_config, quiet
from seq2seq_cli.config import ModelConfig
from seq2seq_cli.model.transformer import Seq2SeqTransformer
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.train.ema import averaged_copy, effective_decay

DECAY = 0.9


def test_effective_decay_warms_up_then_holds():
    assert effective_decay(0.998, 1) == pytest.approx(2 / 11)
    assert effective_decay(0.998, 10) == pytest.approx(11 / 20)
    assert effective_decay(0.998, 10**6) == 0.998
    assert all(effective_decay(0.9, t) <= effective_decay(0.9, t + 1) for t in range(1, 200))


def test_average_follows_the_closed_form():
    """After updates w1, w2, w3: a1 = w1, a_t = d_t a_{t-1} + (1 - d_t) w_t, shared parameters once."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(ModelConfig(d_model=8, heads=2, ffn_size=16, encoder_layers=1, decoder_layers=1), 20, 20, True)
    average = averaged_copy(model, DECAY)
    expected = None
    for t in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update_parameters(model)
        now = [p.detach().clone() for p in model.parameters()]
        d = effective_decay(DECAY, t)
        expected = now if expected is None else [d * a + (1 - d) * w for a, w in zip(expected, now, strict=True)]
    got = list(average.module.parameters())
    assert len(got) == len(expected)  # the tied embedding is one parameter in both
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e)
    assert not any(p.requires_grad for p in average.module.parameters())


def test_checkpoints_hold_the_average_and_the_state_the_trained_weights(tmp_path):
    plain = quiet(make_config(tmp_path, "plain", max_steps=6, valid_every=3))
    run = quiet(make_config(tmp_path, "ema", max_steps=6, valid_every=3, ema_decay=DECAY))
    d = run / "checkpoints"
    saved = ckpt.load_train_state(d / "last.state.pt")
    trained, averaged = saved["trained_weights"], load_file(str(d / "last.safetensors"))
    reference = load_file(str(plain / "checkpoints" / "last.safetensors"))
    # the average does not change training: the trained weights are those of the run without it
    for name, tensor in reference.items():
        torch.testing.assert_close(trained[name], tensor, rtol=0, atol=0)
    assert any(not torch.equal(averaged[k], trained[k]) for k in averaged)
    # best and validation were scored on the average: the record's nll is that of the saved weights
    assert ckpt.verify_checkpoint(d, "best", need_state=False) is None


@pytest.mark.parametrize("stop_at", [2, 4])
def test_a_run_with_an_average_resumes_bit_identical(tmp_path, stop_at):
    whole = quiet(make_config(tmp_path, "whole", max_steps=9, valid_every=3, ema_decay=DECAY))
    cfg = make_config(tmp_path, "parts", max_steps=9, valid_every=3, ema_decay=DECAY)
    quiet(cfg, False, f"train.max_steps={stop_at}")
    parts = quiet(cfg, True)
    assert_same(whole, parts)
    a = ckpt.load_train_state(whole / "checkpoints" / "last.state.pt")["trained_weights"]
    b = ckpt.load_train_state(parts / "checkpoints" / "last.state.pt")["trained_weights"]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_init_normal_and_xavier_draw_what_they_say():
    def model(init: str) -> Seq2SeqTransformer:
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=256, heads=4, ffn_size=1024, encoder_layers=1, decoder_layers=1, init=init)
        return Seq2SeqTransformer(cfg, 4000, 4000, True)

    normal, xavier = model("normal"), model("xavier")
    emb_n, emb_x = normal.src_embed.tokens.weight, xavier.src_embed.tokens.weight
    assert emb_n[1:].std().item() == pytest.approx(0.02, rel=0.02)
    assert emb_x[1:].std().item() == pytest.approx(256**-0.5, rel=0.02)
    assert not emb_n[0].any() and not emb_x[0].any()  # the padding row
    w_n, w_x = normal.encoder[0].ffn.w_1.weight, xavier.encoder[0].ffn.w_1.weight
    assert w_n.std().item() == pytest.approx(0.02, rel=0.02)
    assert w_x.std().item() == pytest.approx(math.sqrt(2 / (256 + 1024)), rel=0.02)
    assert not normal.encoder[0].ffn.w_1.bias.any()
