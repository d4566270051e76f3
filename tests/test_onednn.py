"""Linear layers through oneDNN for CPU decoding: same results, original model untouched,
packed only where asked, and a fallback that says so."""

import logging

import pytest
import torch
from torch import nn

from conftest import random_sources as _sources
from conftest import tiny_model
from seq2seq_cli import onednn
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.onednn import PackedLinear, available, for_decoding
from seq2seq_cli.search import beam_search, greedy_search

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
    caplog.set_level(logging.WARNING, logger="seq2seq_cli.onednn")
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
