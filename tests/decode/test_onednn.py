"""Linear layers through oneDNN for CPU decoding: same results, original model untouched,
packed only where asked, and a fallback that says so."""

import logging

import pytest
import torch
from torch import nn

from conftest import random_sources as _sources
from conftest import tiny_model
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode import onednn
from seq2seq_cli.decode.onednn import Int8Linear, PackedLinear, available, for_decoding
from seq2seq_cli.decode.search import beam_search, greedy_search

pytestmark = pytest.mark.skipif(not available(tiny_model()), reason="this PyTorch has no oneDNN linear")


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "bias": False}, {"q_k_size": 5, "v_size": 11}])
def test_packed_copy_computes_what_the_model_computes(overrides):
    model = tiny_model(seed=1, **overrides)
    fast = for_decoding(model)
    assert fast is not model
    assert not any(type(m) is nn.Linear for m in fast.modules())
    packed = sum(isinstance(m, PackedLinear) for m in fast.modules())
    assert packed == 2 * (4 + 2) + 2 * (2 * 4 + 2) + 1  # encoder, decoder, output
    src = _sources()
    tgt = torch.randint(4, 23, (src.size(0), 5))
    with torch.no_grad():
        assert torch.allclose(fast(src, tgt), model(src, tgt), atol=1e-5)


def test_the_model_itself_is_untouched_and_parameters_are_shared():
    model = tiny_model(seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = for_decoding(model)
    assert all(type(m.w_q) is nn.Linear for m in model.decoder[0].children() if hasattr(m, "w_q"))
    assert model.output is None  # still tied
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert fast.tgt_embed.tokens.weight is model.tgt_embed.tokens.weight
    assert for_decoding(fast) is fast  # packing twice is a no-op


def test_other_dtypes_and_models_are_left_alone():
    model = tiny_model().double()
    assert for_decoding(model) is model
    duck = object()
    assert for_decoding(duck) is duck


@pytest.mark.parametrize("beam", [1, 3])
def test_search_through_onednn_equals_search_without_it(beam):
    model = tiny_model(seed=4)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)  # peaked, so sentences end by themselves
    src = _sources(seed=4)
    opts = DecodeConfig(beam_size=beam, max_len_a=1.5, max_len_b=4)
    run = greedy_search if beam == 1 else beam_search
    fast = run(for_decoding(model), src, opts)
    plain = run(model, src, opts)
    fast = [h if isinstance(h, list) else [h] for h in fast]
    plain = [h if isinstance(h, list) else [h] for h in plain]
    for f, p in zip(fast, plain):
        assert [h.tokens for h in f] == [h.tokens for h in p]
        assert [h.score for h in f] == pytest.approx([h.score for h in p], abs=1e-5)


def test_search_does_not_pack_by_itself(monkeypatch):
    packs = []
    real = onednn.PackedLinear.__init__

    def counting(self, weight, bias):
        packs.append(weight.shape)
        real(self, weight, bias)

    monkeypatch.setattr(onednn.PackedLinear, "__init__", counting)
    model = tiny_model(seed=5)
    greedy_search(model, _sources(), DecodeConfig(beam_size=1, max_len_b=3))
    beam_search(model, _sources(), DecodeConfig(beam_size=2, max_len_b=3))
    assert packs == []
    fast = for_decoding(model)
    assert len(packs) == sum(isinstance(m, PackedLinear) for m in fast.modules())
    greedy_search(fast, _sources(), DecodeConfig(beam_size=1, max_len_b=3))
    assert len(packs) == sum(isinstance(m, PackedLinear) for m in fast.modules())


@pytest.fixture
def fresh_log(caplog):
    onednn._say_unavailable.cache_clear()
    caplog.set_level(logging.WARNING, logger="seq2seq_cli.decode.onednn")
    yield caplog
    onednn._say_unavailable.cache_clear()


def test_a_failing_operator_falls_back_and_says_so_once(monkeypatch, fresh_log):
    def broken(x, packed, bias):
        raise RuntimeError("mkldnn::_linear_pointwise: no kernel for this CPU\nmore detail")

    monkeypatch.setattr(onednn, "_linear", broken)
    model = tiny_model(seed=6)
    assert for_decoding(model) is model
    assert for_decoding(tiny_model(seed=7)) is not None
    messages = [r.getMessage() for r in fresh_log.records]
    assert len(messages) == 1, messages
    assert "oneDNN unavailable" in messages[0] and "no kernel for this CPU" in messages[0]


def test_a_wrong_tied_output_projection_is_caught_by_the_probe(monkeypatch, fresh_log):
    real = onednn._linear

    def wrong_without_bias(x, packed, bias):
        out = real(x, packed, bias)
        return out if bias is not None else out + 1.0  # only the bias-less layers are off

    monkeypatch.setattr(onednn, "_linear", wrong_without_bias)
    model = tiny_model(seed=8)  # tied embeddings; every other linear layer has a bias
    assert model.output is None and all(m.bias is not None for m in model.modules() if type(m) is nn.Linear)
    assert for_decoding(model) is model
    messages = [r.getMessage() for r in fresh_log.records]
    assert len(messages) == 1 and "output (tied)" in messages[0], messages


def test_missing_operators_are_reported(monkeypatch, fresh_log):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = tiny_model(seed=9)
    assert not available(model)
    assert for_decoding(model) is model
    assert for_decoding(model) is model
    messages = [r.getMessage() for r in fresh_log.records]
    assert messages == [
        "warning: linear layers through oneDNN unavailable (this PyTorch is built without oneDNN); decoding on CPU without them"
    ]


def test_models_packing_does_not_apply_to_are_not_reported(fresh_log):
    assert for_decoding(tiny_model().double()) is not None
    assert fresh_log.records == []


@pytest.mark.parametrize("rows, T", [(1, 3), (5, 3), (16, 3), (23, 3), (4, 1), (1, 1), (32, 1)])
def test_padding_the_rows_changes_no_result(rows, T):
    """Row counts padded (3, 15, 69 rows) and taken as they are (4, 1, 32, 48: no padding due)."""
    layer = nn.Linear(12, 7)
    packed = PackedLinear(layer.weight, layer.bias)
    x = torch.randn(rows, T, 12)  # (B, T, in)
    with torch.no_grad():
        assert torch.allclose(packed(x), layer(x), atol=1e-5)
        assert packed(x).shape == (rows, T, 7)


@pytest.mark.parametrize("n, pad", [(1, 0), (3, 1), (4, 0), (5, 3), (8, 0), (9, 7), (16, 0), (17, 15), (0, 0)])
def test_row_padding_is_a_power_of_two_below_half_a_block_then_whole_blocks(n, pad):
    assert onednn.row_padding(n) == pad


def test_int8_linear_is_the_quantized_product():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(9, 24)
    q = Int8Linear(weight, bias)
    assert q.weight_t.dtype == torch.int8 and q.weight_t.shape == (24, 40)
    # the same arithmetic spelled out: per-channel weight scales, per-row input scales, exact int32 sums
    w_scale = weight.abs().amax(dim=1) / 127
    x_scale = x.abs().amax(dim=1, keepdim=True) / 127
    wq, xq = torch.round(weight / w_scale[:, None]), torch.round(x / x_scale)
    expected = (xq.double() @ wq.double().T) * x_scale.double() * w_scale.double() + bias.double()
    assert torch.allclose(q(x).double(), expected, atol=1e-4)
    exact = torch.nn.functional.linear(x, weight, bias)
    error = ((q(x) - exact).norm() / exact.norm()).item()
    assert 0 < error < 0.02  # really quantized, and close


def test_int8_decoding_copy_quantizes_every_linear_layer_and_follows_the_float_model():
    model = tiny_model(seed=11)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)
    q = for_decoding(model, "int8")
    assert not any(type(m) is nn.Linear or isinstance(m, PackedLinear) for m in q.modules())
    assert sum(isinstance(m, Int8Linear) for m in q.modules()) == 2 * (4 + 2) + 2 * (2 * 4 + 2) + 1
    src = _sources(seed=11)
    tgt = torch.randint(4, 23, (src.size(0), 5))
    with torch.no_grad():
        full, quant = model(src, tgt), q(src, tgt)
    assert not torch.equal(full, quant)
    assert ((quant - full).norm() / full.norm()).item() < 0.05
    opts = DecodeConfig(beam_size=3, max_len_a=1.5, max_len_b=4)
    agree = [a[0].tokens == b[0].tokens for a, b in zip(beam_search(q, src, opts), beam_search(model, src, opts))]
    assert sum(agree) >= len(agree) - 1


def test_int8_unavailable_falls_back_to_float_and_says_so(monkeypatch, fresh_log):
    def broken(a, b):
        raise RuntimeError("_int_mm: not supported on this CPU")

    monkeypatch.setattr(torch, "_int_mm", broken)
    fast = for_decoding(tiny_model(seed=12), "int8")
    assert any(isinstance(m, PackedLinear) for m in fast.modules())
    assert not any(isinstance(m, Int8Linear) for m in fast.modules())
    messages = [r.getMessage() for r in fresh_log.records]
    assert messages == ["warning: int8 linear layers unavailable (_int_mm: not supported on this CPU); decoding in float32"]
