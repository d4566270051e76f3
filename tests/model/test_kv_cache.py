"""The decoder's key/value cache (`seq2seq_cli/model/kv_cache.py`): growth, deferred reordering,
dropping finished rows, shared cross-attention keys, and the preallocated buffers."""

import pytest
import torch

from conftest import random_sources, tiny_model
from seq2seq_cli.model.kv_cache import DecoderState, LayerCache

H, S, DK, DV = 2, 5, 3, 4


def _kv(rows: int, positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, H, positions, DK, generator=g), torch.randn(rows, H, positions, DV, generator=g)


def _state(sentences: int, group: int = 1, layers: int = 2) -> DecoderState:
    caches = [LayerCache(*_kv(sentences, S, 100 + i)) for i in range(layers)]
    return DecoderState(caches, torch.ones(sentences, 1, 1, S, dtype=torch.bool), group=group)


def test_append_grows_the_cache_by_the_new_positions():
    cache = LayerCache(*_kv(3, S, 0))
    k1, v1 = _kv(3, 1, 1)
    k2, v2 = _kv(3, 2, 2)
    assert all(torch.equal(a, b) for a, b in zip(cache.append(k1, v1), (k1, v1)))
    k, v = cache.append(k2, v2)
    assert k.shape == (3, H, 3, DK) and v.shape == (3, H, 3, DV)
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    assert cache.self_k is k and cache.self_v is v


def test_reorders_are_deferred_composed_and_applied_before_the_next_append():
    cache = LayerCache(*_kv(4, S, 0))
    k1, v1 = _kv(4, 1, 1)
    cache.append(k1, v1)
    first, second = torch.tensor([3, 3, 0, 1]), torch.tensor([2, 0, 0, 1])
    cache.follow(first)
    cache.follow(second)
    assert torch.equal(cache.self_k, k1)  # nothing moved yet
    k2, v2 = _kv(4, 1, 2)
    k, v = cache.append(k2, v2)
    rows = first[second]  # the rows after both reorders
    assert torch.equal(k[:, :, :1], k1[rows]) and torch.equal(v[:, :, :1], v1[rows])
    assert torch.equal(k[:, :, 1:], k2) and torch.equal(v[:, :, 1:], v2)
    assert cache.order is None


def test_reorder_before_anything_is_cached_is_a_no_op():
    cache = LayerCache(*_kv(2, S, 0))
    cache.follow(torch.tensor([1, 0]))
    k1, v1 = _kv(2, 1, 1)
    assert torch.equal(cache.append(k1, v1)[0], k1)


def test_select_keeps_whole_groups_and_their_one_copy_of_the_source_keys():
    state = _state(sentences=3, group=2)  # 6 decoder rows, 2 per sentence
    cross = [(c.cross_k.clone(), c.cross_v.clone()) for c in state.layers]
    for c in state.layers:
        c.append(*_kv(6, 1, 7))
    before = [c.self_k.clone() for c in state.layers]
    state.select(torch.tensor([0, 1, 4, 5]))  # sentence 1 finished
    for c, (k, v), old in zip(state.layers, cross, before):
        assert torch.equal(c.cross_k, k[[0, 2]]) and torch.equal(c.cross_v, v[[0, 2]])
        c.append(*_kv(4, 1, 8))
        assert torch.equal(c.self_k[:, :, :1], old[[0, 1, 4, 5]])
    assert state.src_mask.shape == (2, 1, 1, S)


def test_cross_attention_keys_are_computed_once_and_self_cache_grows():
    model = tiny_model()
    src = random_sources(n=3)
    tgt = torch.randint(4, 23, (3, 3), generator=torch.Generator().manual_seed(1))
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    cross = [(c.cross_k, c.cross_v) for c in state.layers]
    for t in range(3):
        model.decode(tgt[:, t : t + 1], state, incremental=True)
        for c, (k, v) in zip(state.layers, cross):
            assert c.cross_k is k and c.cross_v is v
            assert c.self_k.shape[2] == t + 1
    assert state.length == 3


def _random_walk(model, state, src, steps, seed):
    """Decode `steps` positions, reordering the rows at random and dropping rows now and then,
    as beam search does -> the hidden states of every step."""
    g = torch.Generator().manual_seed(seed)
    rows, out = src.size(0), []
    for step in range(steps):
        last = torch.randint(4, 23, (rows, 1), generator=g)
        h, _ = model.decode(last, state, incremental=True)
        out.append(h)
        state.reorder(torch.randint(0, rows, (rows,), generator=g))
        if step % 3 == 2 and rows > 1:
            keep = torch.randperm(rows, generator=g)[: rows - 1].sort().values
            state.select(keep)
            rows -= 1
    return out


@pytest.mark.parametrize("positions", [12, 3])  # enough room, and buffers that must grow
def test_preallocated_cache_equals_grown_cache(positions):
    model = tiny_model(seed=4)
    src = random_sources(n=5, seed=4)
    memory, src_mask, _ = model.encode(src)
    grown = model.init_state(memory, src_mask)
    prealloc = model.init_state(memory, src_mask)
    cfg = model.cfg
    prealloc.preallocate(src.size(0), positions, cfg.heads, cfg.head_q_k_size, cfg.head_v_size)
    with torch.no_grad():
        a = _random_walk(model, grown, src, 10, seed=1)
        b = _random_walk(model, prealloc, src, 10, seed=1)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    for c, d in zip(grown.layers, prealloc.layers):
        assert c.self_k.is_contiguous() and d.self_k.is_contiguous()
        assert torch.equal(c.self_k, d.self_k) and torch.equal(c.self_v, d.self_v)


def test_preallocated_cache_lives_in_the_preallocated_buffers():
    model = tiny_model(seed=5)
    src = random_sources(n=4, seed=5)
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    cfg = model.cfg
    state.preallocate(src.size(0), 8, cfg.heads, cfg.head_q_k_size, cfg.head_v_size)
    buffers = {t.data_ptr() for c in state.layers for t in [*c.stores, *c.spare]}
    assert len(buffers) == 2 * (len(state.layers) + 1)  # one spare pair shared by every layer
    with torch.no_grad():
        _random_walk(model, state, src, 8, seed=2)
    for c in state.layers:
        assert c.self_k.shape[2] == 8
        assert c.self_k.untyped_storage().data_ptr() in buffers
        assert c.self_v.untyped_storage().data_ptr() in buffers
