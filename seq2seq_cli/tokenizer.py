"""SentencePiece subword models: train them into the run directory and load them back.

Ids are fixed for every model: pad 0, unk 1, bos 2, eos 3.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import sentencepiece as spm

from seq2seq_cli.config import Config
from seq2seq_cli.errors import UserError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def model_paths(run_dir: Path, joint: bool) -> tuple[Path, Path]:
    """(source model, target model) paths inside a run directory; the same file when joint."""
    if joint:
        return run_dir / "spm.model", run_dir / "spm.model"
    return run_dir / "spm.src.model", run_dir / "spm.tgt.model"


def corpus_files(config: Config) -> tuple[Path, Path]:
    """The training source and target files named by the config, checked to exist."""
    d = config.data
    files = Path(f"{d.train}.{d.src_lang}"), Path(f"{d.train}.{d.tgt_lang}")
    for f in files:
        if not f.is_file():
            raise UserError(f"{f}: training file not found (data.train={d.train!r}, languages {d.src_lang}/{d.tgt_lang})")
    return files


def _train_one(inputs: list[Path], prefix: Path, config: Config) -> None:
    t = config.tokenizer
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # Train into a temporary prefix and rename, so an interrupted run never leaves half a model.
    with tempfile.TemporaryDirectory(dir=prefix.parent) as tmp:
        tmp_prefix = Path(tmp) / prefix.name
        try:
            spm.SentencePieceTrainer.train(
                input=[str(p) for p in inputs],
                model_prefix=str(tmp_prefix),
                vocab_size=t.vocab_size,
                model_type=t.model_type,
                character_coverage=t.character_coverage,
                input_sentence_size=t.input_sentence_size,
                shuffle_input_sentence=True,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,
            )
        except RuntimeError as exc:
            msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise UserError(
                f"{', '.join(map(str, inputs))}: SentencePiece could not train "
                f"(tokenizer.vocab_size={t.vocab_size}): {msg}"
            ) from None
        for suffix in (".model", ".vocab"):
            os.replace(f"{tmp_prefix}{suffix}", f"{prefix}{suffix}")


def train_tokenizer(config: Config) -> list[Path]:
    """Train the SentencePiece model(s) on the training split; return the written model paths."""
    src_file, tgt_file = corpus_files(config)
    run_dir = config.run_path
    src_model, tgt_model = model_paths(run_dir, config.tokenizer.joint)
    if config.tokenizer.joint:
        _train_one([src_file, tgt_file], src_model.with_suffix(""), config)
        return [src_model]
    _train_one([src_file], src_model.with_suffix(""), config)
    _train_one([tgt_file], tgt_model.with_suffix(""), config)
    return [src_model, tgt_model]


def load_tokenizers(run_dir: Path, joint: bool) -> tuple[spm.SentencePieceProcessor, spm.SentencePieceProcessor]:
    """Load (source, target) processors from a run directory; the same object when joint."""
    src_path, tgt_path = model_paths(run_dir, joint)
    for p in {src_path, tgt_path}:
        if not p.is_file():
            raise UserError(f"{p}: tokenizer model not found; run `seq2seq tokenize --config ...` first")
    src = spm.SentencePieceProcessor(model_file=str(src_path))
    tgt = src if joint else spm.SentencePieceProcessor(model_file=str(tgt_path))
    return src, tgt
