"""A tokenizer trained into a run directory under the run's lock, refused where the run's
checkpoints need the tokenizer it has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from seq2seq_cli.config import Config
from seq2seq_cli.data.langprofile import write_profiles
from seq2seq_cli.data.report import check_valid_splits, write_data_report
from seq2seq_cli.data.tokenizer import load_tokenizers, make_tokenizer
from seq2seq_cli.errors import UserError
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run import runlock


def train_tokenizer(config: Config, log: Callable[[str], None] = lambda _: None) -> list[Path]:
    """Train the SentencePiece model(s) on the training split (or copy the ones
    tokenizer.src_model/tgt_model name) into the run directory, then encode and filter the
    training corpora with them (the caches training reuses) and write the run's data report
    (`seq2seq_cli/data/report.py`) and the profiles of its languages
    (`seq2seq_cli/data/langprofile.py`); return the model paths. The run directory is locked
    meanwhile; a run with checkpoints is refused (see `check_tokenizer_replaceable`)."""

    with runlock.hold(config.run_path, runlock.command_line()):
        check_tokenizer_replaceable(config)
        paths = make_tokenizer(config)
        check_valid_splits(config)  # after the training text's own checks, before anything is encoded
        t = config.tokenizer
        src_sp, tgt_sp = load_tokenizers(config.run_path, t.joint, t.vocabulary)
        write_data_report(config, src_sp, tgt_sp, log)
        write_profiles(config, RunLayout(config.run_path).language_profiles)  # serve's language detection
        return paths


def check_tokenizer_replaceable(config: Config) -> None:
    """A run with checkpoints keeps the tokenizer its model was trained with: a new one would
    map the text to other ids and the model would answer gibberish."""
    if runlock.has_checkpoints(config.run_path):
        raise UserError(
            f"{config.run_path}: holds checkpoints trained with its tokenizer; a new tokenizer would not "
            "match them. Use another run_dir for a new tokenizer (or remove its checkpoints/ to start the run over)"
        )
