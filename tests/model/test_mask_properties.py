"""Property-based tests (hypothesis): masks, token-budget batching, and translate's order
restoration, over many generated inputs instead of a few hand-picked ones."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data.batching import token_batches
from seq2seq_cli.decode import translate as translate_module
from seq2seq_cli.decode.search import Hypothesis
from seq2seq_cli.decode.translate import Translator
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


class EchoTokenizer:
    """Characters as ids (a stand-in for SentencePiece), so a translation can name its input."""

    def encode(self, lines: list[str] | str) -> list[list[int]] | list[int]:
        if isinstance(lines, str):  # one line, as SentencePiece takes it
            return [4 + ord(c) % 1000 for c in lines]
        return [[4 + ord(c) % 1000 for c in line] for line in lines]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 4) for i in ids)


def echo_search(model, src: torch.Tensor, opts, nbest: int = 1, lines=None) -> list[list[Hypothesis]]:
    """Each sentence's 'translation' is its own source (EOS dropped): order errors become visible."""
    out = []
    for row in src.tolist():
        tokens = [i for i in row if i not in (PAD, 3)]
        out.append([Hypothesis(tokens, 0.0, 0.0)] * nbest)
    return out


class TinyModel:
    class cfg:
        max_positions = 10_000


@given(
    st.lists(st.text(alphabet="abcdefgh xyz", min_size=0, max_size=40), min_size=0, max_size=60),
    st.integers(1, 200),
)
@settings(max_examples=100, deadline=None)
def test_translations_come_back_in_input_order(lines, batch_tokens):
    original = translate_module.search
    translate_module.search = echo_search
    try:
        decode = DecodeConfig(beam_size=1, batch_tokens=batch_tokens)
        translator = Translator(TinyModel(), EchoTokenizer(), EchoTokenizer(), decode, torch.device("cpu"))
        out = translator.translate(lines)
    finally:
        translate_module.search = original
    # one output per input, in input order; blank lines stay blank
    assert out == [line if line.strip() else "" for line in lines]
