"""Property-based tests (hypothesis) of token-budget batching, over many generated inputs instead
of a few hand-picked ones."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq_cli.data.batching import token_batches


@given(
    st.lists(st.tuples(st.integers(1, 120), st.integers(1, 120)), min_size=0, max_size=300),
    st.integers(1, 600),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
@settings(max_examples=200)
def test_batches_hold_every_pair_once_within_the_token_budget(lens, max_tokens, seed):
    src = np.array([s for s, _ in lens], dtype=np.int64)
    tgt = np.array([t for _, t in lens], dtype=np.int64)
    rng = np.random.default_rng(seed) if seed is not None else None
    batches = token_batches(src, tgt, max_tokens, rng)
    seen = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(seen.tolist()) == list(range(len(lens)))  # every pair exactly once
    for batch in batches:
        assert len(batch) >= 1
        longest = int(max(src[batch].max(), tgt[batch].max()))
        # padding included; a single pair over the budget forms a batch of its own
        assert len(batch) * longest <= max_tokens or len(batch) == 1
