"""Property-based tests (hypothesis) of translate's order restoration, over many generated inputs
instead of a few hand-picked ones."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode import search as search_module  # the translator imports its searches when it decodes
from seq2seq_cli.decode.hypotheses import Hypothesis
from seq2seq_cli.decode.translate import Translator

PAD = 0


class EchoTokenizer:
    """Characters as ids (a stand-in for SentencePiece), so a translation can name its input."""

    def encode(self, lines: list[str] | str) -> list[list[int]] | list[int]:
        if isinstance(lines, str):  # one line, as SentencePiece takes it
            return [4 + ord(c) % 1000 for c in lines]
        return [[4 + ord(c) % 1000 for c in line] for line in lines]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 4) for i in ids)


def echo_search(model, src: torch.Tensor, opts, nbest: int = 1, lines=None, **_) -> list[list[Hypothesis]]:
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
    original = search_module.search
    search_module.search = echo_search
    try:
        decode = DecodeConfig(beam_size=1, batch_tokens=batch_tokens)
        translator = Translator(TinyModel(), EchoTokenizer(), EchoTokenizer(), decode, torch.device("cpu"))
        out = translator.translate(lines)
    finally:
        search_module.search = original
    # one output per input, in input order; blank lines stay blank
    assert out == [line if line.strip() else "" for line in lines]
