"""A tokenizer trained into a run directory under the run's lock, refused where the run's
checkpoints need the tokenizer it has."""

from __future__ import annotations

from pathlib import Path

from seq2seq_cli.config import Config
from seq2seq_cli.data.tokenizer import make_tokenizer
from seq2seq_cli.errors import UserError
from seq2seq_cli.run import runlock


def train_tokenizer(config: Config) -> list[Path]:
    """Train the SentencePiece model(s) on the training split (or copy the ones
    tokenizer.src_model/tgt_model name) into the run directory; return the model paths.
    The run directory is locked meanwhile; a run with checkpoints is refused (see
    `check_tokenizer_replaceable`)."""

    with runlock.hold(config.run_path, runlock.command_line()):
        check_tokenizer_replaceable(config)
        return make_tokenizer(config)


def check_tokenizer_replaceable(config: Config) -> None:
    """A run with checkpoints keeps the tokenizer its model was trained with: a new one would
    map the text to other ids and the model would answer gibberish."""
    if runlock.has_checkpoints(config.run_path):
        raise UserError(
            f"{config.run_path}: holds checkpoints trained with its tokenizer; a new tokenizer would not "
            "match them. Use another run_dir for a new tokenizer (or remove its checkpoints/ to start the run over)"
        )
