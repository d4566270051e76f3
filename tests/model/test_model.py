import pytest
import torch

from conftest import tiny_model
from seq2seq_cli.ids import BOS, PAD
from seq2seq_cli.model.attention import attention_with_weights
from seq2seq_cli.model.masks import decoder_self_mask, padding_mask
from seq2seq_cli.model.transformer import sinusoidal_table


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 23, (3, 7), generator=g)
    tgt = torch.randint(4, 23, (3, 6), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_causality_changing_a_later_token_leaves_earlier_logits_unchanged(norm):
    model = tiny_model(norm=norm)
    src, tgt = _batch()
    base = model(src, tgt)
    for t in range(1, tgt.size(1)):
        changed = tgt.clone()
        changed[:, t] = (changed[:, t] + 1 - 4) % 19 + 4
        out = model(src, changed)
        assert torch.allclose(out[:, :t], base[:, :t], atol=1e-6)
        assert not torch.allclose(out[:, t:], base[:, t:], atol=1e-6)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_source_padding_invariance(norm):
    model = tiny_model(norm=norm)
    src, tgt = _batch()
    padded = torch.cat([src, torch.full((3, 5), PAD)], dim=1)
    assert torch.allclose(model(src, tgt), model(padded, tgt), atol=1e-5)


def test_target_padding_invariance_on_real_positions():
    model = tiny_model()
    src, tgt = _batch()
    padded = torch.cat([tgt, torch.full((3, 4), PAD)], dim=1)
    assert torch.allclose(model(src, tgt), model(src, padded)[:, : tgt.size(1)], atol=1e-5)


def test_padding_one_sentence_does_not_change_the_others():
    model = tiny_model()
    src, tgt = _batch()
    src[1, 4:] = PAD  # sentence 1 is shorter
    alone = model(src[1:2, :4], tgt[1:2])
    assert torch.allclose(model(src, tgt)[1:2], alone, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre"}, {"q_k_size": 5, "v_size": 11}, {"positions": "learned"}])
def test_incremental_decoding_equals_full_forward(overrides):
    model = tiny_model(**overrides)
    src, tgt = _batch()
    src[0, 5:] = PAD
    full = model(src, tgt)
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    steps = []
    for t in range(tgt.size(1)):
        h, _ = model.decode(tgt[:, t : t + 1], state, incremental=True)
        steps.append(model.logits(h))
    incremental = torch.cat(steps, dim=1)
    assert (incremental - full).abs().max().item() <= 1e-5
    assert state.length == tgt.size(1)


def test_separate_query_key_and_value_sizes_shape():
    model = tiny_model(q_k_size=3, v_size=7)
    attn = model.encoder[0].self_attn
    assert attn.w_q.weight.shape == (2 * 3, 16)
    assert attn.w_k.weight.shape == (2 * 3, 16)
    assert attn.w_v.weight.shape == (2 * 7, 16)
    assert attn.w_o.weight.shape == (16, 2 * 7)
    src, tgt = _batch()
    assert model(src, tgt).shape == (3, 6, 23)


def test_explicit_attention_matches_sdpa_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    out, w = attention_with_weights(q, k, v, mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5))
    assert torch.all(w[1, ..., 3:] == 0)


def test_tied_embeddings_share_one_matrix():
    model = tiny_model()
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight
    assert model.output is None
    untied = tiny_model(tie_embeddings=False)
    assert untied.output is not None
    assert untied.src_embed.tokens.weight is not untied.tgt_embed.tokens.weight


def test_sinusoidal_table_values():
    table = sinusoidal_table(50, 8)
    pos, i = 7, 1
    assert table[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 8))).item(), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(pos / 10000 ** (2 * i / 8))).item(), abs=1e-6)
    assert torch.all(table[0, 0::2] == 0) and torch.all(table[0, 1::2] == 1)


def _padded_batch():
    """src/tgt with padding in some rows: src lengths 7, 4, 2; tgt lengths 6, 3, 5."""
    src, tgt = _batch()
    src[1, 4:], src[2, 2:] = PAD, PAD
    tgt[1, 3:], tgt[2, 5:] = PAD, PAD
    return src, tgt


@pytest.mark.parametrize("overrides", [{}, {"norm": "pre", "q_k_size": 5, "v_size": 11}])
def test_attention_maps_rows_sum_to_one_and_masked_positions_are_exactly_zero(overrides):
    model = tiny_model(**overrides)
    src, tgt = _padded_batch()
    (B, S), T, H = src.shape, tgt.size(1), 2
    maps = model.attention_maps(src, tgt)
    allowed = {
        "encoder": padding_mask(src, PAD).expand(B, H, S, S),
        "decoder": decoder_self_mask(tgt, PAD).expand(B, H, T, T),
        "cross": padding_mask(src, PAD).expand(B, H, T, S),
    }
    assert {k: len(v) for k, v in maps.items()} == {"encoder": 2, "decoder": 2, "cross": 2}
    for kind, layers in maps.items():
        for w in layers:
            assert w.shape == allowed[kind].shape
            assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6)
            assert torch.all(w[~allowed[kind]] == 0)  # padding and future positions
            assert torch.all(w[allowed[kind]] > 0)  # nothing else is masked
    assert not torch.allclose(maps["decoder"][0], maps["decoder"][1])  # one map per layer, not a copy


def test_outputs_with_weights_equal_outputs_without():
    model = tiny_model()
    src, tgt = _padded_batch()
    memory, src_mask, none = model.encode(src)
    memory_w, _, enc_w = model.encode(src, need_weights=True)
    assert none == [] and len(enc_w) == 2
    assert (memory_w - memory).abs().max().item() <= 1e-6
    h, cross_only = model.decode(tgt, model.init_state(memory, src_mask))
    h_w, self_w, cross_w = model.decode_with_weights(tgt, model.init_state(memory, src_mask))
    assert cross_only == []
    # without weights the decoder attends causally alone: equal at every real position (a padding
    # position's output, which nothing reads, may differ)
    real = tgt != PAD  # (B, T)
    assert (h_w - h)[real].abs().max().item() <= 1e-6
    # decode(need_weights=True) keeps returning the cross-attention weights alone
    h_c, cross_again = model.decode(tgt, model.init_state(memory, src_mask), need_weights=True)
    assert (h_c - h).abs().max().item() <= 1e-6
    assert all(torch.allclose(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=1e-6) for a, b in zip(cross_again, cross_w))
    maps = model.attention_maps(src, tgt)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(maps["decoder"], self_w))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(maps["encoder"], enc_w))


def test_incremental_weights_equal_rows_of_the_full_maps():
    model = tiny_model(norm="pre")
    src, tgt = _batch()
    src[0, 5:] = PAD
    maps = model.attention_maps(src, tgt)
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    for t in range(tgt.size(1)):
        _, self_w, cross_w = model.decode_with_weights(tgt[:, t : t + 1], state, incremental=True)
        for layer in range(2):
            assert self_w[layer].shape == (3, 2, 1, t + 1)  # the cache holds t + 1 keys
            assert torch.allclose(self_w[layer][:, :, 0], maps["decoder"][layer][:, :, t, : t + 1], atol=1e-6)
            assert torch.allclose(cross_w[layer][:, :, 0], maps["cross"][layer][:, :, t], atol=1e-6)


def test_normal_path_never_computes_explicit_weights(monkeypatch):
    import seq2seq_cli.model.attention as model_module

    def refuse(*args, **kwargs):
        raise AssertionError("the explicit attention path ran without being asked for")

    model = tiny_model()
    src, tgt = _batch()
    monkeypatch.setattr(model_module, "attention_with_weights", refuse)
    model(src, tgt)
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    model.decode(tgt[:, :1], state, incremental=True)
    model.decode(tgt[:, 1:2], state, incremental=True)
    with pytest.raises(AssertionError, match="explicit attention path"):
        model.attention_maps(src, tgt)


def test_token_types_default_to_type_zero_and_change_the_encoding():
    model = tiny_model(token_types=2)
    with torch.no_grad():
        model.src_embed.types.weight.normal_()  # trained types differ; zeros at initialisation
    src = torch.tensor([[5, 6, 7, 3]])
    zeros, ones = torch.zeros_like(src), torch.ones_like(src)
    default = model.src_embed(src)
    assert torch.equal(default, model.src_embed(src, types=zeros))
    assert not torch.allclose(default, model.src_embed(src, types=ones))
    types = model.src_embed.types.weight
    assert torch.allclose(model.src_embed(src, types=ones) - default, types[1] - types[0])


def test_logits_of_target_rows_only_equal_the_full_logits_there_and_give_the_same_loss_and_gradient():
    from seq2seq_cli.train.loss import label_smoothed_nll

    model = tiny_model()
    model.eval()
    src, tgt_in = _batch()
    tgt_out = torch.roll(tgt_in, -1, dims=1)
    tgt_out[0, -3:] = PAD  # the first sentence is shorter
    mask = tgt_out != PAD
    rows = mask.view(-1).nonzero().squeeze(1)
    full = model(src, tgt_in)
    part = model(src, tgt_in, rows)
    assert part.shape == (int(mask.sum()), full.size(-1))
    torch.testing.assert_close(part, full[mask])
    grads = []
    for logits, target in ((model(src, tgt_in), tgt_out), (model(src, tgt_in, rows), tgt_out[mask])):
        model.zero_grad()
        loss, nll, tokens = label_smoothed_nll(logits, target, 0.1)
        loss.backward()
        grads.append((loss.item(), nll.item(), tokens.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert grads[0][:3] == pytest.approx(grads[1][:3])
    for a, b in zip(grads[0][3], grads[1][3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_causal_attention_alone_trains_as_the_padding_and_causal_mask():
    """A right-padded target decoded with causal attention alone (the training path) gives the
    loss and the gradient of the full padding AND causal mask (the explicit path) on real targets."""
    from seq2seq_cli.train.loss import label_smoothed_nll

    model = tiny_model()
    src, tgt_in = _padded_batch()
    tgt_out = torch.roll(tgt_in, -1, dims=1).masked_fill(tgt_in == PAD, PAD)
    results = []
    for with_weights in (False, True):
        model.zero_grad()
        memory, src_mask, _ = model.encode(src)
        state = model.init_state(memory, src_mask)
        h = model.decode_with_weights(tgt_in, state)[0] if with_weights else model.decode(tgt_in, state)[0]
        loss, _, tokens = label_smoothed_nll(model.logits(h), tgt_out, 0.1)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (causal, g_causal), (masked, g_masked) = results
    assert int(tokens) < tgt_out.numel()  # the batch has padding
    torch.testing.assert_close(causal, masked)
    assert g_causal.keys() == g_masked.keys()
    for name in g_causal:
        torch.testing.assert_close(g_causal[name], g_masked[name], atol=1e-6, rtol=1e-5)
