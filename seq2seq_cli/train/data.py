"""The data a run trains and validates on: the corpora checked, the tokenizer trained where the
run has none, the training corpora encoded (and cached) with their language tokens and tags,
one validation split per language pair (or one), and the lexical shortlist of the training
pairs. Rank 0 does the work under torchrun; the other processes read what it wrote."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq_cli.config import Config
from seq2seq_cli.data import shortlist
from seq2seq_cli.data.corpora import encode_corpora
from seq2seq_cli.data.encoding import Drop, EncodedCorpus, check_no_empty_lines, describe_drops, encoded_split
from seq2seq_cli.data.formats import corpus_sources, read_split, split_source
from seq2seq_cli.data.report import no_valid_pairs, refresh_data_report
from seq2seq_cli.data.tokenizer import all_pieces, language_token_ids, load_tokenizers, model_paths
from seq2seq_cli.errors import UserError
from seq2seq_cli.run.tokenizing import train_tokenizer
from seq2seq_cli.train import distributed
from seq2seq_cli.train.distributed import Processes
from seq2seq_cli.train.memory import check_epoch_fits


@dataclass
class ValidSplit:
    """One validation split: its language pair, its encoded pairs (the target's language token
    in front of each source, where the run has one), and its text, for BLEU."""

    pair: tuple[str, str]
    corpus: EncodedCorpus
    raw: Any  # the validation text (a `datasets.Dataset`)
    prefix: list[int]  # the ids in front of each source (the target's language token), or none

    @property
    def name(self) -> str:
        """'es-en', as the per-pair keys of metrics.jsonl name it."""
        return "-".join(self.pair)


@dataclass
class TrainData:
    """The corpora a run trains and validates on (one validation split, or one per language
    pair), and the tokenizers that encoded them."""

    train: EncodedCorpus
    valids: list[ValidSplit]
    src_sp: Any
    tgt_sp: Any

    def record(self) -> dict[str, Any]:
        """The first metrics record: pairs kept and dropped."""
        dropped = {f"train_dropped_{k}": v for k, v in self.train.dropped.items()}
        rec: dict[str, Any] = {"step": 0, "train_pairs": len(self.train), **dropped}
        if self.train.parts is not None:  # several corpora: each one's counts
            rec["train_corpora"] = [part.record() for part in self.train.parts]
        if self.valids:
            corpora = [v.corpus for v in self.valids]
            rec.update({"valid_pairs": sum(map(len, corpora)),
                        "valid_dropped_empty": sum(c.dropped["empty"] for c in corpora),
                        "valid_dropped_too_long": sum(c.dropped.get(Drop.TOO_LONG.key, 0) for c in corpora)})
            if len(self.valids) > 1:
                rec.update({f"valid_pairs/{v.name}": len(v.corpus) for v in self.valids})
        return rec


def prepare_data(config: Config, procs: Processes, log: Callable[[str], None]) -> TrainData:
    """Data (checked line by line before anything is trained), tokenizer, encoding (cached as
    Arrow in RUN/cache, memory-mapped). Rank 0 checks the data, trains the tokenizer and fills
    the cache; the other processes wait, then read what it wrote: the caches it names, also
    where their own copy of the corpus has another path or time (one copy per machine)."""
    d, run_dir = config.data, config.run_path
    corpus_sources(config)  # a missing file is reported before anything else happens
    valid_splits = d.eval_splits("valid")
    for i, split in enumerate(valid_splits):
        pair = d.pair_of(split)
        if len(d.pairs) > 1 and pair not in d.pairs:
            where = config.where("data", "valid", *([i] if len(valid_splits) > 1 else []))
            raise UserError(f"{where}: {split} is {pair[0]} -> {pair[1]}, a pair the run does not learn "
                            f"(data.train: {', '.join(f'{s} -> {t}' for s, t in d.pairs)})")
        split_source(split, *pair, d.format)
    caches = None if procs.main else distributed.from_main(procs, None)  # (rank 0 sends them below)
    valid_raw = [read_split(config, split) for split in valid_splits]
    if d.on_empty == "error":
        for corpus in d.corpora:
            check_no_empty_lines(read_split(config, corpus), corpus, d)
    # a vocabulary file comes with its run (imported, or copied by --init-from): never trained here
    have_tokenizer = all(p.is_file() for p in model_paths(run_dir, config.tokenizer.joint))
    if config.tokenizer.vocabulary == "sentencepiece" and not have_tokenizer:
        log(f"no tokenizer in {run_dir}; training SentencePiece first")
        train_tokenizer(config)
    src_sp, tgt_sp = load_tokenizers(run_dir, config.tokenizer.joint, config.tokenizer.vocabulary)
    if isinstance(d.train, list):
        train_data, train_caches = encode_corpora(config, src_sp, tgt_sp, log, cached=caches and caches[0])
        check_epoch_fits(config, train_data.parts or [])
    else:
        train_data = encoded_split(config, d.train, src_sp, tgt_sp, training=True, log=log,
                                   cached=caches and caches[0][0])
        train_caches = [train_data.cache_path]
        log(f"train: {len(train_data)} pairs from {d.train}; {describe_drops(train_data, config)}")
        if not len(train_data):
            raise UserError(f"{d.train}: no training pairs left after filtering ({describe_drops(train_data, config)})")
    if procs.main:  # a filter changed since `tokenize` re-encoded the corpora: the report counts what trains
        refresh_data_report(config, train_caches, log)
    valids = []
    for i, (split, raw) in enumerate(zip(valid_splits, valid_raw)):
        pair = d.pair_of(split)
        where = config.where("data", "valid", *([i] if len(valid_splits) > 1 else []))
        prefix = language_token_ids(src_sp, d.target_token(pair[1]), pair[1], where)
        label = "valid" if len(valid_splits) == 1 else f"valid.{i}"
        encoded = encoded_split(config, split, src_sp, tgt_sp, training=False, log=log, label=label, prefix=prefix,
                                cached=caches[1][i] if caches else None)
        if not len(encoded) and not encoded.dropped.get(Drop.TOO_LONG.key):
            raise no_valid_pairs(where, split, sum(encoded.dropped.values()))
        if encoded.dropped.get(Drop.TOO_LONG.key):
            if not len(encoded):
                raise UserError(f"{split}: no validation pair fits the model's {config.model.max_positions} positions "
                                "(EOS or start counted); give a validation split of shorter sentences")
            log(describe_skipped(str(split), encoded.dropped[Drop.TOO_LONG.key], config.model.max_positions))
        valids.append(ValidSplit(pair, encoded, raw, prefix))
    if procs.main:
        distributed.from_main(procs, (train_caches, [v.corpus.cache_path for v in valids]))
    return TrainData(train_data, valids, src_sp, tgt_sp)


def write_shortlist(data: TrainData, path: Path, log: Callable[[str], None]) -> None:
    """The lexical shortlist of the training pairs (`seq2seq_cli/data/shortlist.py`), written to `path`."""
    start = time.perf_counter()
    table = data.train.table
    columns = [table.column(name).combine_chunks() for name in ("src_ids", "tgt_ids")]
    flat = [(c.offsets.to_numpy(), c.values.to_numpy()) for c in columns]
    pairs = ((flat[0][1][flat[0][0][i]:flat[0][0][i + 1]], flat[1][1][flat[1][0][i]:flat[1][0][i + 1]])
             for i in range(len(table)))
    src_pieces, tgt_pieces = all_pieces(data.src_sp), all_pieces(data.tgt_sp)
    listed = shortlist.build(pairs, len(src_pieces), len(tgt_pieces))
    shortlist.write(listed, path, src_pieces, tgt_pieces)
    log(f"shortlist: {path} ({listed.targets.numel() / max(1, int((listed.offsets.diff() > 0).sum())):.0f} "
        f"target subwords per source subword, {listed.always.numel()} always; {time.perf_counter() - start:.1f} s)")


def describe_skipped(valid: str, skipped: int, max_positions: int) -> str:
    """The one warning of a validation split with pairs longer than the model's positions."""
    return (f"warning: {valid}: {skipped} pair(s) longer than the model's {max_positions} positions (EOS or start "
            "counted) are left out of the validation loss; validation BLEU translates every line, cut to fit")


