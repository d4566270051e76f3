"""The run directory's layout: the one place that names what a run holds.

    RUN/config.yaml                  the resolved config (run_dir: null: a run is where this file is)
    RUN/spm.model                    joint SentencePiece model (spm.src.model, spm.tgt.model when not joint)
    RUN/source.spm, target.spm       with tokenizer.vocabulary "file" (Marian's names): the subword models,
    RUN/vocab.json, target_vocab.json   and the vocabularies (piece -> id)
    RUN/checkpoints/NAME.safetensors  weights; NAME.state.pt training state; NAME.json manifest;
                                     NAME is last, best or step-00001000 (managed by training)
    RUN/shortlist.tsv                the lexical shortlist of the training data (`decode.shortlist`)
    RUN/data_report.json             what the training data looks like: pairs read, kept, dropped by each filter,
    RUN/data_report.png              lengths (and their plot), written with the tokenizer
    RUN/dropped.tsv.gz               every training pair a filter dropped, with the filter's name
    RUN/languages.json               a character n-gram profile of each language of the run (serve's /detect),
                                     written with the tokenizer
    RUN/ctranslate2/NAME-SHA/        checkpoint NAME converted for CTranslate2 (SHA: the first 16 hex digits of its
                                     weights' sha256), written on first use by the CTranslate2 engine
    RUN/metrics.jsonl                one JSON record per line
    RUN/tensorboard/                 TensorBoard events
    RUN/plots/curves.png             the learning curves
    RUN/distill_report.json          a student's figures beside its teacher's (`seq2seq distill`)
    RUN/distilled/                   a student's corpora: its teacher's translations (`seq2seq distill`)
    RUN/cache/                       datasets' Arrow copy of the text, and cache/encoded/ the encoded pairs
    RUN/.lock                        the lock of the process that writes the run

A leaf: it imports nothing from the package, so every wing may ask it for a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
LOCK = ".lock"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
SHORTLIST = "shortlist.tsv"
DATA_REPORT, DATA_PLOT, DROPPED = "data_report.json", "data_report.png", "dropped.tsv.gz"
LANGUAGE_PROFILES = "languages.json"
TENSORBOARD = "tensorboard"
PLOTS = "plots"
CURVES = "curves.png"
CACHE = "cache"
ENCODED = "encoded"
CTRANSLATE2 = "ctranslate2"
DISTILLED, DISTILL_REPORT = "distilled", "distill_report.json"

JOINT_SPM = "spm.model"
SRC_SPM, TGT_SPM = "spm.src.model", "spm.tgt.model"
# tokenizer.vocabulary "file": a SentencePiece model for the subwords, a vocabulary file for the ids;
# the names are those of a Marian directory, which an imported run keeps
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
SOURCE_VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"

WEIGHTS, STATE, MANIFEST = ".safetensors", ".state.pt", ".json"
LAST, BEST = "last", "best"
STEP = re.compile(r"step-\d+")

OUTPUTS = (CHECKPOINTS, METRICS, TENSORBOARD, PLOTS, SHORTLIST, CTRANSLATE2)
"""What one training run writes (removed by --overwrite); the tokenizer, the cache and the config stay."""
SUBDIRS = (CACHE, CHECKPOINTS, PLOTS, TENSORBOARD, DISTILLED)
"""The directories a run writes into besides its top level."""


def step_name(step: int) -> str:
    """The name of the checkpoint saved at update `step`: step-00001000."""
    return f"step-{step:08d}"


def checkpoint_name(file_name: str) -> str:
    """The checkpoint a file of checkpoints/ belongs to: best.safetensors -> best."""
    for suffix in (WEIGHTS, STATE, MANIFEST):
        if file_name.endswith(suffix):
            return file_name[: -len(suffix)]
    return file_name


def managed(name: str) -> bool:
    """Whether a checkpoint name (or a file name in checkpoints/) is one that training writes and
    rotates (last, best, step-N): nothing else may write it."""
    name = checkpoint_name(name)
    return name in (LAST, BEST) or STEP.fullmatch(name) is not None


@dataclass(frozen=True)
class RunLayout:
    """Every path of the run directory `root`."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def shortlist(self) -> Path:
        return self.root / SHORTLIST

    @property
    def language_profiles(self) -> Path:
        return self.root / LANGUAGE_PROFILES

    @property
    def data_report(self) -> Path:
        return self.root / DATA_REPORT

    @property
    def data_plot(self) -> Path:
        return self.root / DATA_PLOT

    @property
    def dropped(self) -> Path:
        return self.root / DROPPED

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def plots(self) -> Path:
        return self.root / PLOTS

    @property
    def curves(self) -> Path:
        return self.plots / CURVES

    @property
    def cache(self) -> Path:
        return self.root / CACHE

    @property
    def encoded(self) -> Path:
        return self.cache / ENCODED

    @property
    def ctranslate2(self) -> Path:
        return self.root / CTRANSLATE2

    @property
    def distilled(self) -> Path:
        return self.root / DISTILLED

    @property
    def distill_report(self) -> Path:
        return self.root / DISTILL_REPORT

    def converted(self, checkpoint: str, sha256: str) -> Path:
        """ctranslate2/NAME-SHA: checkpoint NAME (its weights' sha256) converted for CTranslate2."""
        return self.ctranslate2 / f"{checkpoint}-{sha256[:16]}"

    def weights(self, name: str) -> Path:
        """checkpoints/NAME.safetensors"""
        return self.checkpoints / f"{name}{WEIGHTS}"

    def train_state(self, name: str) -> Path:
        """checkpoints/NAME.state.pt"""
        return self.checkpoints / f"{name}{STATE}"

    def manifest(self, name: str) -> Path:
        """checkpoints/NAME.json"""
        return self.checkpoints / f"{name}{MANIFEST}"

    @property
    def last(self) -> Path:
        return self.weights(LAST)

    @property
    def best(self) -> Path:
        return self.weights(BEST)

    def spm_models(self, joint: bool) -> tuple[Path, Path]:
        """(source, target) SentencePiece models; the same file when joint."""
        if joint:
            return self.root / JOINT_SPM, self.root / JOINT_SPM
        return self.root / SRC_SPM, self.root / TGT_SPM

    def vocab_spm(self) -> tuple[Path, Path]:
        """(source, target) subword models of a run with tokenizer.vocabulary "file"."""
        return self.root / SOURCE_SPM, self.root / TARGET_SPM

    def vocab_files(self, joint: bool) -> tuple[Path, Path]:
        """(source, target) vocabulary files of a run with tokenizer.vocabulary "file"; the same when joint."""
        return self.root / SOURCE_VOCAB, self.root / (SOURCE_VOCAB if joint else TARGET_VOCAB)

    @property
    def outputs(self) -> list[Path]:
        """What --overwrite clears: what one training run wrote (see OUTPUTS)."""
        return [self.root / name for name in OUTPUTS]

    @property
    def subdirs(self) -> list[Path]:
        return [self.root / name for name in SUBDIRS]

    def owned_files(self) -> list[Path]:
        """The files at the top of the run that the run owns: its config, lock, metrics, shortlist and
        every tokenizer or vocabulary file a run may hold."""
        return [self.config, self.lock, self.metrics, self.shortlist, self.root / JOINT_SPM, *self.spm_models(False),
                *self.vocab_spm(), *self.vocab_files(False), self.data_report, self.data_plot, self.dropped,
                self.distill_report]

    def owner_of(self, path: Path) -> Path | None:
        """The file or directory of this run that owns `path` (after links): one of `owned_files`, a
        managed subdirectory or ctranslate2/ (or a path under them), or the run directory itself; None for any other path,
        such as a new file a user keeps beside the checkpoints (RUN/test.hyp.en)."""
        target, root = Path(path).resolve(), self.root.resolve()
        if target == root:
            return self.root
        for held in [*self.owned_files(), *self.subdirs, self.ctranslate2]:
            held_at = root / held.relative_to(self.root)
            if target == held_at or held_at in target.parents:
                return held
        return None

    def is_run(self) -> bool:
        """Whether the directory holds a run's own files besides a config: checkpoints, metrics,
        a tokenizer or the lock."""
        marks = [self.checkpoints, self.metrics, self.lock, *self.spm_models(False), self.root / JOINT_SPM,
                 *self.vocab_spm(), self.root / SOURCE_VOCAB]
        return any(p.exists() for p in marks)


def run_of_config(path: Path) -> Path | None:
    """The run directory a config file belongs to: the directory of a `config.yaml` that sits among a
    run's files (see `RunLayout.is_run`), else None (a config kept elsewhere names its run_dir)."""
    path = Path(path)
    if path.name != CONFIG:
        return None
    return path.parent if RunLayout(path.parent).is_run() else None
