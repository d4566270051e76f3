"""The `data` section of the configuration: the splits (files, or datasets of the Hugging
Face Hub), the corpora of training and their weights, tags and score files, and the cleaning
filters. Part of the one configuration tree of `config.py`, which re-exports these names."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from seq2seq_cli.config_section import Section
from seq2seq_cli.ids import RESERVED_PIECES


def language_code(value: Any) -> Any:
    """A language code as YAML gave it: an unquoted `no` (Norwegian), `on`, `yes` or `off`
    arrives as a boolean, refused with the fix (quote it) rather than as 'not a string'."""
    if isinstance(value, bool):
        raise ValueError(f"YAML reads an unquoted no, off, yes or on as {str(value).lower()}: quote the language code "
                         "(e.g. 'no' for Norwegian)")
    return value


class SplitConfig(Section):
    """Where one split's pairs come from: a file (or prefix) on disk, or a dataset of the
    Hugging Face Hub (read through `datasets`, offline once cached)."""

    path: str | None = Field(None, description="a prefix (text files), a .tsv/.jsonl/.tmx file or an OPUS Moses .zip")
    hub: str | None = Field(None, description="a Hub dataset (e.g. Helsinki-NLP/opus_books), or a local folder laid out as one")
    config: str | None = Field(None, description="the Hub dataset's configuration (subset), e.g. en-es")
    split: str | None = Field(None, description="the Hub dataset's split: train, validation, test ...")
    revision: str | None = Field(None, description="the Hub dataset's revision (branch, tag or commit); null = the newest cached")
    src_column: str | None = Field(None, description="the Hub dataset's source column; null = translation[src_lang]")
    tgt_column: str | None = Field(None, description="the Hub dataset's target column; null = translation[tgt_lang]")
    src_lang: str | None = Field(None, description="this split's source language; null = data.src_lang")
    tgt_lang: str | None = Field(None, description="this split's target language; null = data.tgt_lang")

    _languages = field_validator("src_lang", "tgt_lang", mode="before")(language_code)

    @model_validator(mode="after")
    def _one_place(self) -> SplitConfig:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give either path (a file or prefix) or hub (a Hub dataset), not both")
        hub_only = [k for k in ("config", "split", "revision", "src_column", "tgt_column") if getattr(self, k) is not None]
        if self.path is not None and hub_only:
            raise ValueError(f"{', '.join(hub_only)} go(es) with hub, not with path")
        if self.hub is not None and self.split is None:
            raise ValueError("a Hub dataset needs its split (e.g. split: train, or validation)")
        if (self.src_column is None) != (self.tgt_column is None):
            raise ValueError("give both src_column and tgt_column, or neither (the translation column)")
        return self

    def describe(self) -> str:
        """The split in words: its path, or the Hub dataset with its config, split and revision."""
        if self.path is not None:
            return self.path
        extra = [x for x in (self.config, self.split) if x]
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.hub}{at} ({', '.join(extra)})"

    def key(self) -> str:
        """What tells two splits apart (a path or a local folder made absolute, its links resolved
        and without a trailing slash, or the Hub dataset's name; its config and split)."""
        langs = f":{self.src_lang}:{self.tgt_lang}" if self.src_lang or self.tgt_lang else ""
        if self.path is not None:
            return os.path.realpath(os.path.expanduser(self.path)) + langs
        hub = self.hub or ""
        if os.path.isdir(hub) or hub.startswith((".", "/", "~")) or hub.endswith("/"):  # a local folder
            hub = os.path.realpath(os.path.expanduser(hub))
        return f"hub:{hub}:{self.config}:{self.split}:{self.revision}:{self.src_column}:{self.tgt_column}{langs}"

    def __str__(self) -> str:
        return self.describe()


class CorpusConfig(SplitConfig):
    """One training corpus of several (`data.train` as a list)."""

    weight: float = Field(
        1.0, gt=0, allow_inf_nan=False,
        description="pairs per epoch = round(weight x pairs kept): 2 = every pair twice (in different batches), "
                    "0.5 = a different half each epoch",
    )
    tag: str | None = Field(None, description="a token put in front of each source sentence, e.g. '<bt>' or '>>fr<<'")
    scores: str | None = Field(
        None, description="a file of one score per pair of this corpus, higher = better (`seq2seq score`)")
    drop_lowest: float = Field(
        0.0, ge=0.0, lt=1.0, description="share of the corpus's pairs with the lowest scores to drop (needs scores)")

    @field_validator("tag")
    @classmethod
    def _one_token(cls, tag: str | None) -> str | None:
        if tag is not None and (not tag or tag != tag.strip() or len(tag.split()) != 1):
            raise ValueError("a tag is one token without spaces, e.g. '<bt>'")
        if tag in RESERVED_PIECES:
            piece_id, role = RESERVED_PIECES[tag]
            reserved = ", ".join(RESERVED_PIECES)
            raise ValueError(f"{tag!r} is the tokenizer's {role} piece (id {piece_id}); a tag is a piece of its own, "
                             f"not one of the reserved {reserved}")
        return tag

    @model_validator(mode="after")
    def _scores_for_drop(self) -> CorpusConfig:
        if self.drop_lowest and self.scores is None:
            raise ValueError("drop_lowest needs scores: a file of one score per pair (seq2seq score)")
        return self


CORPUS_LIST = "corpora"  # the tag pydantic puts in an error's location for the list form of data.train
SPLIT_MAPPING = "mapping"  # ... and for the mapping form of data.valid and data.test ({hub: ..., split: ...})

TrainSplit = Annotated[
    Annotated[str, Tag("path")] | Annotated[list[CorpusConfig], Tag(CORPUS_LIST)],
    Discriminator(lambda v: CORPUS_LIST if isinstance(v, list) else "path"),
]


SPLIT_LIST = "splits"  # ... and for the list form of data.valid and data.test (one split per language pair)
SPLIT_TAGS = ("path", CORPUS_LIST, SPLIT_MAPPING, SPLIT_LIST)  # every such tag, which error messages leave out


def _split_tag(value: Any) -> str:
    if isinstance(value, list):
        return SPLIT_LIST
    return SPLIT_MAPPING if isinstance(value, (dict, SplitConfig)) else "path"


OneSplit = Annotated[
    Annotated[str, Tag("path")] | Annotated[SplitConfig, Tag(SPLIT_MAPPING)]
    | Annotated[list[SplitConfig], Tag(SPLIT_LIST)],
    Discriminator(_split_tag),
]


class FiltersConfig(Section):
    """The cleaning filters of the training corpora: each pair is dropped by the first filter
    that rejects it (in this order) and counted under its name."""

    enabled: bool = Field(True, description="false: every filter of this section off")
    control: bool = Field(True, description="drop pairs with control characters, HTML/XML tags or entities")
    same: bool = Field(True, description="drop pairs whose source equals their target (case and spaces aside)")
    max_words: int | None = Field(150, ge=1, description="drop pairs with a side of more words (OpusCleaner max_length)")
    length_ratio: float | None = Field(
        0.6, gt=0.0, lt=1.0,
        description="drop pairs with log(shorter words + 1) / log(longer words + 1) below this (OpusCleaner src_trg_ratio)",
    )
    numbers: bool = Field(True, description="drop pairs whose numbers differ more than they agree (OpusCleaner num_mismatch)")
    urls: bool = Field(True, description="drop pairs whose URLs and e-mail addresses differ")
    min_alpha: float | None = Field(
        None, gt=0.0, le=1.0, description="drop pairs with a side whose share of letters (spaces aside) is below this")
    max_repeats: int | None = Field(
        None, ge=1, description="drop pairs with a word (or group of up to 3) repeated more than this many times in a row")
    langid: bool = Field(True, description="drop pairs with a side not in its language (py3langid, data.src_lang/tgt_lang)")
    langid_min_prob: float = Field(
        0.05, gt=0.0, lt=1.0, description="a side is in its language unless the identifier gives it less than this probability")
    cooccurrence: float | None = Field(
        0.33, gt=0.0, lt=1.0,
        description="drop pairs whose words go together less than this share of the corpus's median pair "
        "(word co-occurrence across the corpus: finds misaligned pairs; null: off)")
    duplicates: Literal["off", "exact", "normalized"] = Field(
        "exact", description="drop repeated pairs: exact, or after lower-casing and removing punctuation and spaces")

    @model_validator(mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        """`filters: off` (or false) is `filters: {enabled: false}`."""
        if value is False or value == "off":
            return {"enabled": False}
        return value

    @field_validator("duplicates", mode="before")
    @classmethod
    def _duplicates_off(cls, value: Any) -> Any:
        """`duplicates: off` unquoted, which YAML reads as false, is "off"."""
        return "off" if value is False else value


class DataConfig(Section):
    src_lang: str = Field("src", description="suffix of source files: PREFIX.SRC_LANG")
    tgt_lang: str = Field("tgt", description="suffix of target files: PREFIX.TGT_LANG")
    train: TrainSplit = Field(
        description="training split: a prefix (text files), a .tsv/.jsonl/.tmx file or a Moses .zip; a Hub dataset "
        "{hub, config, split}; or a list of corpora, each {path or hub, weight, tag}"
    )
    valid: OneSplit | None = Field(
        None, description="validation split, as train (one path, or a Hub dataset); several language pairs: a list, "
        "each {path, src_lang, tgt_lang}")
    test: OneSplit | None = Field(None, description="test split, as valid (used by the quick start)")
    format: Literal["auto", "text", "tsv", "jsonl", "tmx", "moses"] = Field(
        "auto", description="auto: .tsv/.jsonl/.tmx (optionally .gz or .xz) and .zip by file name, else two aligned text files"
    )
    src_field: str | None = Field(None, description="JSONL field of the source; default src_lang")
    tgt_field: str | None = Field(None, description="JSONL field of the target; default tgt_lang")
    on_empty: Literal["skip", "error"] = Field("skip", description="pairs with an empty side: skip and count, or stop")
    max_src_len: int = Field(256, ge=1, description="training pairs with more source subwords are dropped")
    max_tgt_len: int = Field(256, ge=1, description="training pairs with more target subwords are dropped")
    max_len_ratio: float | None = Field(
        None, ge=1.0, description="drop training pairs whose subword lengths differ by more than this factor"
    )
    dedup: bool = Field(False, description="drop repeated (source, target) training pairs (as filters.duplicates: exact)")
    filters: FiltersConfig = Field(FiltersConfig(), description="the cleaning filters of the training corpora")
    num_proc: int = Field(1, ge=1, description="processes for reading and encoding")
    temperature: float = Field(
        5.0, ge=1.0, allow_inf_nan=False,
        description="language pairs of several are drawn with probability proportional to (pairs)^(1/temperature): "
        "1 = as many as each has, higher = closer to even (a small pair is not drowned)")
    pair_batches: Literal["mixed", "one"] = Field(
        "mixed", description="batches of a run of several language pairs: mixed (an epoch's pairs shuffled together) "
        "or one (each batch holds one pair's sentences; the batches of all pairs shuffled together)")
    target_tokens: dict[str, str] = Field(
        default_factory=dict,
        description="target language -> the source token that names it (an imported OPUS-MT model's >>xx<<); "
        "empty: >>xx<< for each target of a run with several")

    _languages = field_validator("src_lang", "tgt_lang", mode="before")(language_code)

    @field_validator("target_tokens")
    @classmethod
    def _token_pieces(cls, tokens: dict[str, str]) -> dict[str, str]:
        for lang, token in tokens.items():
            if not token or token != token.strip() or len(token.split()) != 1:
                raise ValueError(f"{lang}: {token!r}: a language token is one piece without spaces, e.g. '>>{lang}<<'")
        return tokens

    @field_validator("train", mode="before")
    @classmethod
    def _one_mapping(cls, train: Any) -> Any:
        """A mapping ({hub: ..., split: ...}, or {path: ..., scores: ...}) is a list of one corpus."""
        return [train] if isinstance(train, dict) else train

    @field_validator("train")
    @classmethod
    def _distinct_corpora(cls, train: str | list[CorpusConfig]) -> str | list[CorpusConfig]:
        if isinstance(train, list):
            if not train:
                raise ValueError("an empty list: give at least one corpus ({path, weight, tag})")
            seen: dict[str, int] = {}
            for i, corpus in enumerate(train):
                key = corpus.key()
                if key in seen:
                    raise ValueError(f"entry {i} ({corpus}) repeats entry {seen[key]}: give each corpus once "
                                     "(raise its weight to use it more)")
                seen[key] = i
        return train

    @property
    def corpora(self) -> list[CorpusConfig]:
        """The training corpora: the list given, or the one path as a corpus of weight 1."""
        return list(self.train) if isinstance(self.train, list) else [CorpusConfig(path=self.train)]

    @property
    def tags(self) -> list[str]:
        """The corpus tags, each once, in the order given."""
        return list(dict.fromkeys(c.tag for c in self.corpora if c.tag))

    def pair_of(self, split: str | SplitConfig) -> tuple[str, str]:
        """The (source, target) languages of a split or corpus: its own where it names them,
        else the run's data.src_lang and data.tgt_lang."""
        if isinstance(split, SplitConfig):
            return split.src_lang or self.src_lang, split.tgt_lang or self.tgt_lang
        return self.src_lang, self.tgt_lang

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, target) pair the run learns, in the order its corpora name them; an
        imported model with language tokens: each of its sources to each target it names."""
        pairs = list(dict.fromkeys(self.pair_of(c) for c in self.corpora))
        if self.target_tokens:
            sources = list(dict.fromkeys(s for s, _ in pairs))
            pairs = list(dict.fromkeys(pairs + [(s, t) for s in sources for t in self.target_tokens]))
            pairs = [(s, t) for s, t in pairs if t in self.target_tokens]
        return pairs

    @property
    def targets(self) -> list[str]:
        """The target languages, each once."""
        return list(dict.fromkeys(t for _, t in self.pairs))

    def target_token(self, tgt: str) -> str | None:
        """The source token that names target `tgt` (OPUS-MT's form, `>>xx<<`, in front of each
        source): data.target_tokens's where given, `>>tgt<<` in a run with several targets, None
        in a run with one (nothing to name)."""
        if self.target_tokens:
            return self.target_tokens.get(tgt)
        return f">>{tgt}<<" if len(self.targets) > 1 else None

    @property
    def language_tokens(self) -> list[str]:
        """The language tokens of the run's targets (none in a run with one target)."""
        return [tok for t in self.targets if (tok := self.target_token(t)) is not None]

    def source_prefix(self, split: str | SplitConfig) -> list[str]:
        """The tokens in front of each source of a corpus: its target's language token, then
        its tag (where it has them)."""
        token = self.target_token(self.pair_of(split)[1])
        tag = split.tag if isinstance(split, CorpusConfig) else None
        return [t for t in (token, tag) if t]

    def eval_splits(self, which: str) -> list[str | SplitConfig]:
        """The splits of data.valid or data.test (`which`): none, one, or one per pair."""
        value = getattr(self, which)
        if value is None:
            return []
        return list(value) if isinstance(value, list) else [value]
