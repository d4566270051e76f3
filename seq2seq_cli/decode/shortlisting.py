"""Which shortlist a translator decodes with (`decode.shortlist`), and the model that scores only it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data.tokenizer import all_pieces
from seq2seq_cli.errors import UserError
from seq2seq_cli.layout import RunLayout

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

    from seq2seq_cli.data.shortlist import Shortlist
    from seq2seq_cli.model.transformer import Seq2SeqTransformer


def shortlist_of(layout: RunLayout, decode: DecodeConfig, models: int, auto: bool = False) -> Path | None:
    """The shortlist file `decode.shortlist` asks for, of one model's run: null, the run's where it
    has one when `auto` (the commands' default), else none; true, the run's, or a UserError where
    it has none (or where `models` > 1)."""
    if decode.shortlist is False or (decode.shortlist is None and not auto):
        return None
    if models > 1:
        if decode.shortlist:
            raise UserError("--shortlist decodes one model; an ensemble decodes with the whole vocabulary "
                            "(--full-vocabulary)")
        return None
    if not layout.shortlist.is_file():
        if decode.shortlist:
            raise UserError(f"{layout.shortlist}: the run has no shortlist (seq2seq train writes it from the training "
                            "data when it starts); decode without --shortlist")
        return None
    return layout.shortlist


def shortlisted(model: Seq2SeqTransformer, shortlist: Shortlist) -> Seq2SeqTransformer:
    """A copy of `model` (sharing everything) whose searches score for each sentence only the
    target ids `shortlist` gives its source ids (`Seq2SeqTransformer.candidates`)."""
    listed = copy.copy(model)
    listed.candidates = shortlist.per_sentence
    return listed


def read_shortlist(path: Path, src_sp: SentencePieceProcessor, tgt_sp: SentencePieceProcessor) -> Shortlist:
    """The run's shortlist file; a UserError where there is none."""
    if not path.is_file():
        raise UserError(f"{path}: the run has no shortlist (seq2seq train writes it from the training data when it "
                        "starts); decode without --shortlist")
    from seq2seq_cli.data.shortlist import read

    return read(path, {p: i for i, p in enumerate(all_pieces(src_sp))}, {p: i for i, p in enumerate(all_pieces(tgt_sp))})
