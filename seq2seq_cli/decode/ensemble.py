"""Ensembles: several models that the searches see as one (`translate -m RUN1 -m RUN2 ...`).

Each member encodes the source with its own encoder and decodes each step with its own
decoder and key/value cache (`EnsembleState` holds one `DecoderState` per member and applies
every reordering and selection of the search to all of them). At each step the members'
distributions are averaged in probability space, as fairseq's ensembles do:

    log p(y | ...) = log( (1/M) * sum_m p_m(y | ...) )       (logsumexp of the log-probabilities - log M)

and the search's bans, forced tokens and scores apply to that average. The members share
one target vocabulary and one source vocabulary (the source is encoded once into ids), and
the same decoder start token; `Translator.load` refuses any other combination
(`check_member`, below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from seq2seq_cli.config import ModelConfig
from seq2seq_cli.errors import UserError
from seq2seq_cli.model.kv_cache import DecoderState
from seq2seq_cli.model.transformer import Seq2SeqTransformer

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

    from seq2seq_cli.run.loaded import LoadedRun


@dataclass
class EnsembleState:
    """One decoder state per member, kept in step: the search reorders and selects rows of
    all of them at once."""

    states: list[DecoderState]

    @property
    def group(self) -> int:
        return self.states[0].group

    @group.setter
    def group(self, value: int) -> None:
        for s in self.states:
            s.group = value

    def reorder(self, index: Tensor) -> None:
        for s in self.states:
            s.reorder(index)

    def select(self, index: Tensor) -> None:
        for s in self.states:
            s.select(index)


class Ensemble:
    """Members decoded together. `cfg` is the first member's, its `max_positions` the
    smallest of the members' (outputs and sources must fit every member)."""

    def __init__(self, models: list[Seq2SeqTransformer]) -> None:
        if len(models) < 2:
            raise ValueError("an ensemble needs two models or more")
        self.models = models
        self.cfg: ModelConfig = models[0].cfg.model_copy(update={"max_positions": min(m.cfg.max_positions for m in models)})

    def average(self, lprobs: list[Tensor]) -> Tensor:
        """The members' log-probabilities (each (N, V)) -> log of their mean probability (N, V)."""
        return torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(lprobs))


def vocabulary_difference(mine: SentencePieceProcessor, first: SentencePieceProcessor) -> str | None:
    """How a tokenizer's vocabulary differs from another's (None: the same pieces, id for id)."""
    if mine.get_piece_size() != first.get_piece_size():
        return f"{mine.get_piece_size()} pieces, {first.get_piece_size()} in"
    for i in range(mine.get_piece_size()):
        if mine.id_to_piece(i) != first.id_to_piece(i):
            return f"piece {i} is {mine.id_to_piece(i)!r} there, {first.id_to_piece(i)!r} in"
    return None


def check_member(run: LoadedRun, path: str | Path, first: LoadedRun, first_path: str | Path) -> None:
    """Refuse an ensemble member whose ids mean other pieces than the first run's (target or
    source vocabulary) or whose outputs start with another token."""
    for side, mine, theirs in (("target", run.tgt_sp, first.tgt_sp), ("source", run.src_sp, first.src_sp)):
        diff = vocabulary_difference(mine, theirs)
        if diff is not None:
            raise UserError(f"{path}: its {side} vocabulary differs from that of {first_path} ({diff} {first_path}); "
                            f"an ensemble's models need the same {side} vocabulary")
    a, b = run.model.cfg.decoder_start_id, first.model.cfg.decoder_start_id
    if a != b:
        raise UserError(f"{path}: starts its outputs with token {a}, {first_path} with {b}; an ensemble's models "
                        "need the same decoder start token")
