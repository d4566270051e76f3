"""Property-based tests (hypothesis) of the masks, over many generated inputs instead of a few
hand-picked ones."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from seq2seq_cli.model.masks import causal_mask, decoder_self_mask, padding_mask

PAD = 0


@st.composite
def padded_ids(draw) -> torch.Tensor:
    """(B, T) ids, each row some real tokens (ids >= 1) then padding."""
    batch = draw(st.integers(1, 5))
    width = draw(st.integers(1, 9))
    rows = []
    for _ in range(batch):
        length = draw(st.integers(0, width))
        rows.append(draw(st.lists(st.integers(1, 50), min_size=length, max_size=length)) + [PAD] * (width - length))
    return torch.tensor(rows, dtype=torch.long)


@given(padded_ids())
def test_padding_mask_marks_exactly_the_real_tokens(ids):
    m = padding_mask(ids, PAD)
    assert m.shape == (ids.size(0), 1, 1, ids.size(1)) and m.dtype == torch.bool
    for b in range(ids.size(0)):
        for k in range(ids.size(1)):
            assert bool(m[b, 0, 0, k]) == (int(ids[b, k]) != PAD)


@given(padded_ids())
def test_decoder_mask_is_exactly_causal_and_not_pad(ids):
    m = decoder_self_mask(ids, PAD)
    B, T = ids.shape
    assert m.shape == (B, 1, T, T)
    for b in range(B):
        for q in range(T):
            for k in range(T):
                assert bool(m[b, 0, q, k]) == (k <= q and int(ids[b, k]) != PAD)


@given(st.integers(1, 40))
def test_causal_mask_sees_itself_and_the_past_only(length):
    m = causal_mask(length)[0, 0]
    q, k = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    assert torch.equal(m, k <= q)
