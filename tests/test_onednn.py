"""Linear layers through oneDNN for CPU decoding: same results, original model untouched."""

import pytest
import torch
from torch import nn

import seq2seq_cli.search as search_module
from conftest import random_sources as _sources, tiny_model
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
    assert sum(isinstance(m, PackedLinear) for m in fast.modules()) == 2 * (4 + 2) + 2 * (2 * 4 + 2) + 1  # encoder, decoder, output
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
def test_search_through_onednn_equals_search_without_it(beam, monkeypatch):
    model = tiny_model(seed=4)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)  # peaked, so sentences end by themselves
    src = _sources(seed=4)
    opts = DecodeConfig(beam_size=beam, max_len_a=1.5, max_len_b=4)
    run = greedy_search if beam == 1 else beam_search
    fast = run(model, src, opts)
    monkeypatch.setattr(search_module, "for_decoding", lambda m: m)
    plain = run(model, src, opts)
    fast = [h if isinstance(h, list) else [h] for h in fast]
    plain = [h if isinstance(h, list) else [h] for h in plain]
    for f, p in zip(fast, plain):
        assert [h.tokens for h in f] == [h.tokens for h in p]
        assert [h.score for h in f] == pytest.approx([h.score for h in p], abs=1e-5)
