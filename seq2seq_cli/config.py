"""The one typed configuration tree: YAML loading, `--set` overrides and validation.

Every option of the tool lives here, with its default and its check. Nothing else in the
package validates configuration: functions receive a `Config` that is already valid.
"""

from __future__ import annotations

import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text
from seq2seq_cli.ids import BOS, RESERVED_PIECES
from seq2seq_cli.layout import run_of_config


def _number_kind(annotation: Any) -> str | None:
    """'an integer' or 'a number' when a field of this type holds numbers (optionally None, or
    a tuple of them), None otherwise (a bool, a string, a section ...)."""
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        kinds = {_number_kind(arg) for arg in typing.get_args(annotation) if arg is not type(None) and arg is not ...}
        if len(kinds) == 1:
            return kinds.pop()
    return None


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A number is never read from true/false (YAML's `yes`, `on` ...), which pydantic
        would take as 1 or 0."""
        kind = _number_kind(cls.model_fields[info.field_name].annotation) if info.field_name else None
        items = value if isinstance(value, (list, tuple)) else [value]
        if kind is not None and any(isinstance(v, bool) for v in items):
            raise ValueError(f"expected {kind}, not true or false")
        return value


class CorpusConfig(Section):
    """One training corpus of several (`data.train` as a list)."""

    path: str = Field(description="a prefix (text files) or a .tsv/.jsonl/.tmx file, as data.train")
    weight: float = Field(
        1.0, gt=0, allow_inf_nan=False,
        description="pairs per epoch = round(weight x pairs kept): 2 = every pair twice, 0.5 = a different half each epoch",
    )
    tag: str | None = Field(None, description="a token put in front of each source sentence, e.g. '<bt>' or '>>fr<<'")

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


CORPUS_LIST = "corpora"  # the tag pydantic puts in an error's location for the list form of data.train

TrainSplit = Annotated[
    Annotated[str, Tag("path")] | Annotated[list[CorpusConfig], Tag(CORPUS_LIST)],
    Discriminator(lambda v: CORPUS_LIST if isinstance(v, list) else "path"),
]


class DataConfig(Section):
    src_lang: str = Field("src", description="suffix of source files: PREFIX.SRC_LANG")
    tgt_lang: str = Field("tgt", description="suffix of target files: PREFIX.TGT_LANG")
    train: TrainSplit = Field(
        description="training split: a prefix (text files) or a .tsv/.jsonl/.tmx file; or a list of corpora, "
        "each {path, weight, tag}"
    )
    valid: str | None = Field(None, description="validation split, as train")
    test: str | None = Field(None, description="test split, as train (used by the quick start)")
    format: Literal["auto", "text", "tsv", "jsonl", "tmx"] = Field(
        "auto", description="auto: .tsv/.jsonl/.tmx (optionally .gz) by file name, else two aligned text files"
    )
    src_field: str | None = Field(None, description="JSONL field of the source; default src_lang")
    tgt_field: str | None = Field(None, description="JSONL field of the target; default tgt_lang")
    on_empty: Literal["skip", "error"] = Field("skip", description="pairs with an empty side: skip and count, or stop")
    max_src_len: int = Field(256, ge=1, description="training pairs with more source subwords are dropped")
    max_tgt_len: int = Field(256, ge=1, description="training pairs with more target subwords are dropped")
    max_len_ratio: float | None = Field(
        None, ge=1.0, description="drop training pairs whose subword lengths differ by more than this factor"
    )
    dedup: bool = Field(False, description="drop repeated (source, target) training pairs")
    num_proc: int = Field(1, ge=1, description="processes for reading and encoding")

    @field_validator("train")
    @classmethod
    def _distinct_corpora(cls, train: str | list[CorpusConfig]) -> str | list[CorpusConfig]:
        if isinstance(train, list):
            if not train:
                raise ValueError("an empty list: give at least one corpus ({path, weight, tag})")
            seen: dict[str, int] = {}
            for i, corpus in enumerate(train):
                key = os.path.normpath(corpus.path)
                if key in seen:
                    raise ValueError(f"entry {i} ({corpus.path}) repeats entry {seen[key]}: give each corpus once "
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


class TokenizerConfig(Section):
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = Field(8000, ge=16)
    joint: bool = Field(True, description="one vocabulary for source and target")
    character_coverage: float = Field(1.0, gt=0.0, le=1.0)
    input_sentence_size: int = Field(0, ge=0, description="sample this many sentences to train on; 0 = all")
    src_model: str | None = Field(None, description="existing SentencePiece model to use instead of training (the joint one)")
    tgt_model: str | None = Field(None, description="existing target model when joint is false")
    sampling: bool = Field(False, description="subword regularisation of training batches")
    alpha: float = Field(0.1, gt=0.0, le=1.0, description="unigram smoothing, or the BPE dropout probability")
    nbest: int = Field(-1, ge=-1, description="unigram: sample among the n best segmentations; -1 = all")
    vocabulary: Literal["sentencepiece", "file"] = Field(
        "sentencepiece",
        description="ids are the SentencePiece model's own, or pieces map to ids through the run's vocab.json "
        "(source.spm/target.spm, as in imported Marian models)",
    )

    @model_validator(mode="after")
    def _given_models(self) -> TokenizerConfig:
        if self.joint and self.tgt_model is not None:
            raise ValueError("tgt_model is for separate vocabularies (joint: false); with joint: true set src_model only")
        if not self.joint and (self.src_model is None) != (self.tgt_model is None):
            raise ValueError("with joint: false set both src_model and tgt_model, or neither")
        if self.vocabulary == "file" and self.sampling:
            raise ValueError("sampling (subword regularisation) needs vocabulary: sentencepiece")
        return self


class ModelConfig(Section):
    d_model: int = Field(512, ge=1)
    heads: int = Field(8, ge=1)
    q_k_size: int | None = Field(None, ge=1, description="per-head query/key size; default d_model / heads")
    v_size: int | None = Field(None, ge=1, description="per-head value size; default d_model / heads")
    ffn_size: int = Field(2048, ge=1)
    encoder_layers: int = Field(6, ge=1)
    decoder_layers: int = Field(6, ge=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    activation_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    norm: Literal["post", "pre"] = "post"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = Field(1024, ge=2)
    token_types: int = Field(
        0, ge=0, description="learned token-type (segment) embeddings added to the source, as BERT's; 0 = none"
    )
    tie_embeddings: bool = True
    bias: bool = True
    activation: Literal["relu", "swish", "gelu"] = Field("relu", description="feed-forward activation")
    scale_embedding: bool = Field(True, description="multiply token embeddings by sqrt(d_model)")
    position_layout: Literal["interleaved", "halves"] = Field(
        "interleaved",
        description="sinusoidal table: sin/cos interleaved (even/odd dims), or sines then cosines (Marian)",
    )
    logits_bias: bool = Field(False, description="a fixed bias added to the output logits (Marian's final_logits_bias)")
    decoder_start_id: int = Field(
        BOS, ge=0, description="target id the decoder starts from: bos (2), or pad (0) as in Marian"
    )
    init: Literal["normal", "xavier"] = Field(
        "normal",
        description="initial weights: normal = N(0, init_std) for every matrix and embedding (BERT, BART, Marian in HF); "
        "xavier = Xavier-uniform matrices and N(0, d_model^-0.5) embeddings (fairseq)",
    )
    init_std: float = Field(0.02, gt=0, description="standard deviation of init: normal")

    @model_validator(mode="after")
    def _head_sizes(self) -> ModelConfig:
        if (self.q_k_size is None or self.v_size is None) and self.d_model % self.heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by heads ({self.heads}) "
                "unless q_k_size and v_size are both set"
            )
        if self.position_layout == "halves" and self.positions != "sinusoidal":
            raise ValueError("position_layout halves is a layout of the sinusoidal table; it needs positions: sinusoidal")
        return self

    @property
    def head_q_k_size(self) -> int:
        return self.q_k_size or self.d_model // self.heads

    @property
    def head_v_size(self) -> int:
        return self.v_size or self.d_model // self.heads


class TrainConfig(Section):
    seed: int = Field(1, ge=0, le=2**32 - 1, description="seeds initialisation, dropout and batch order")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto = bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16, AMX), else fp32; "
        "fp16 uses a dynamic loss scaler",
    )
    threads: int | None = Field(None, ge=1, description="CPU threads; default all cores")
    max_tokens: int = Field(4096, ge=1, description="source or target tokens per batch, padding included")
    max_steps: int | None = Field(None, ge=1)
    max_epochs: int | None = Field(None, ge=1)
    max_minutes: float | None = Field(None, gt=0)
    update_freq: int = Field(1, ge=1, description="accumulate gradients over this many batches per update")
    lr: float = Field(5e-4, gt=0)
    schedule: Literal["inverse_sqrt", "cosine", "linear", "constant"] = Field(
        "inverse_sqrt",
        description="after linear warmup: lr*sqrt(warmup/step); cosine or linear decay to min_lr where the run ends "
        "(max_steps, max_epochs or max_minutes, whichever runs out first); or constant",
    )
    min_lr: float = Field(0.0, ge=0, description="where the cosine and linear schedules end")
    warmup_steps: int = Field(4000, ge=0)
    warmup_init_lr: float = Field(1e-7, ge=0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip_norm: float = Field(1.0, ge=0, description="0 = no gradient clipping")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)
    valid_every: int = Field(1000, ge=1, description="validate and save checkpoints every N steps")
    keep_last: int = Field(2, ge=1, description="step checkpoints kept on disk besides last and best")
    max_nonfinite: int = Field(5, ge=1, description="stop after this many non-finite losses in a row")
    valid_bleu: bool = Field(False, description="also translate the validation set (greedy) and report BLEU")
    best_metric: Literal["loss", "bleu"] = Field("loss", description="what picks checkpoints/best: valid nll or BLEU")
    patience: int | None = Field(None, ge=1, description="stop after this many validations without a new best")
    tensorboard: bool = Field(True, description="write TensorBoard events to RUN/tensorboard")
    plot: bool = Field(True, description="redraw RUN/plots/curves.png at every validation")
    log_every: int = Field(100, ge=1)
    compile: bool = Field(False, description="train through torch.compile (compiles for a while first; faster steps after)")
    ema_decay: float | None = Field(
        None, gt=0, lt=1,
        description="keep an exponential moving average of the weights (decay per update, e.g. 0.998); checkpoints hold "
        "and validation scores the averaged weights; null = off",
    )

    @field_validator("betas")
    @classmethod
    def _betas_below_one(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError("each Adam beta must be at least 0 and below 1")
        return betas

    @model_validator(mode="after")
    def _some_stop(self) -> TrainConfig:
        if self.max_steps is None and self.max_epochs is None and self.max_minutes is None:
            raise ValueError("set at least one of max_steps, max_epochs, max_minutes")
        if self.best_metric == "bleu" and not self.valid_bleu:
            raise ValueError("best_metric bleu needs valid_bleu: true")
        return self


class DecodeConfig(Section):
    beam_size: int = Field(5, ge=1, description="1 = greedy search (at most the target vocabulary size)")
    constraint_beam_size: int | None = Field(
        None, ge=1, description="beam of lines with constraints (shared among their banks); null = 1.5 x beam_size, rounded up"
    )
    length_penalty: float = Field(1.0, ge=-10.0, le=10.0, allow_inf_nan=False, description="alpha of the length penalty")
    length_penalty_type: Literal["average", "gnmt"] = Field(
        "average", description="average: score / len**alpha; gnmt: score / ((5 + len) / 6)**alpha"
    )
    max_len_a: float = Field(1.2, ge=0, le=1000.0, allow_inf_nan=False, description="output length limit a*source_len + b")
    max_len_b: int = Field(10, ge=0, le=1_000_000)
    min_len: int = Field(0, ge=0, le=1_000_000, description="no EOS before this many output tokens")
    no_repeat_ngram_size: int = Field(0, ge=0, description="never repeat an n-gram of this size; 0 = off")
    ban_unk: bool = Field(False, description="never produce the unknown token")
    replace_unk: bool = Field(False, description="replace unknown tokens by the most attended source piece")
    sampling: bool = Field(False, description="sample instead of searching")
    temperature: float = Field(1.0, ge=0.001, le=1000.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0, description="sample from the k most likely tokens; 0 = all")
    top_p: float = Field(1.0, gt=0, le=1.0, description="sample from the smallest set with this much probability")
    seed: int = Field(0, description="seed for sampling")
    batch_tokens: int = Field(4096, ge=1, description="source tokens per translation batch (beams not counted)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="weights and activations when decoding: auto = bf16 on CUDA, fp32 on CPU; fp16 on CUDA only"
    )
    quantize: Literal["none", "int8"] = Field("none", description="int8: linear layers in int8 when decoding on CPU")
    shortlist: bool = Field(
        False, description="score only the target subwords the run's shortlist gives the source's subwords (RUN/shortlist.tsv)"
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> DecodeConfig:
        if self.min_len and self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise ValueError(f"min_len ({self.min_len}) exceeds the output limit max_len_b ({self.max_len_b})")
        return self


class Config(Section):
    name: str
    run_dir: str | None = Field(None, description="where the run is written; default runs/NAME")
    data: DataConfig
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig(max_epochs=10)
    decode: DecodeConfig = DecodeConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        longest = max(self.data.max_src_len, self.data.max_tgt_len) + 2
        if longest > self.model.max_positions:
            raise ValueError(
                f"data.max_src_len/max_tgt_len + 2 ({longest}) exceeds model.max_positions "
                f"({self.model.max_positions})"
            )
        return self

    _origin: str = PrivateAttr("")  # where it was read from (`where`): not part of its value
    _lines: dict[tuple[str, ...], int] = PrivateAttr(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        """Configs are equal when their settings are, wherever each was read from."""
        return isinstance(other, Config) and self.model_dump() == other.model_dump()

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}")

    def where(self, *key: str | int) -> str:
        """Where a key of this config was set: 'FILE:LINE: data.train[1]' (the line where known),
        for messages about a value that is valid in form but wrong on disk."""
        loc = tuple(map(str, key))
        origin = self._origin or "config"
        line = self._lines.get(loc)
        return f"{origin}:{line}: {_dotted(loc)}" if line else f"{origin}: {_dotted(loc)}"


# --------------------------------------------------------------------------- fine-tuning

ARCHITECTURE_KEYS = (
    "d_model", "heads", "q_k_size", "v_size", "ffn_size", "encoder_layers", "decoder_layers",
    "norm", "positions", "max_positions", "token_types", "tie_embeddings", "bias", "activation",
    "scale_embedding", "position_layout", "logits_bias", "decoder_start_id",
)
"""The `model` keys that shape the weights or what they compute; dropout rates are free."""

VOCABULARY_KEYS = ("model_type", "vocab_size", "joint", "vocabulary", "src_model", "tgt_model")
"""The `tokenizer` keys that decide the ids; sampling settings are free."""


def inherit_architecture(config: Config, init: Config, source: str) -> Config:
    """The config of a run that starts from the weights of a run configured as `init`: its
    model and tokenizer sections are `init`'s, with the free keys the user set (dropout,
    subword sampling, ...) applied over them. A key the user set that contradicts the
    architecture or vocabulary of `init` is refused, named; data, train and decode are the
    user's."""
    diffs = []
    sections = {"model": (config.model, init.model, ARCHITECTURE_KEYS),
                "tokenizer": (config.tokenizer, init.tokenizer, VOCABULARY_KEYS)}
    merged: dict[str, dict[str, Any]] = {}
    for name, (mine, theirs, fixed) in sections.items():
        given = mine.model_fields_set if name in config.model_fields_set else set()
        for key in sorted(given & set(fixed)):
            if getattr(mine, key) != getattr(theirs, key):
                diffs.append(f"{name}.{key} is {getattr(mine, key)!r} in the config, {getattr(theirs, key)!r} in {source}")
        merged[name] = {**theirs.model_dump(mode="json"), **{k: v for k, v in mine.model_dump(mode="json").items()
                                                           if k in given and k not in fixed}}
    if diffs:
        raise UserError(f"--init-from {source}: the config contradicts the run it starts from: {'; '.join(diffs)} "
                        "(remove these keys: the architecture and vocabulary come from that run)")
    return validate_config({**config.model_dump(mode="json"), **merged}, f"config with --init-from {source}")


# --------------------------------------------------------------------------- loading


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a YAML mapping to its 1-based line number."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                sub = (*path, str(index))
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def _dotted(loc: tuple[str, ...]) -> str:
    """A key path as the user reads it: data.train[1].weight."""
    return "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc).lstrip(".")


def _section_of(model: type[BaseModel], loc: tuple[str, ...]) -> type[BaseModel]:
    """The section (model class) that holds the last key of `loc`."""
    section: Any = model
    for part in loc[:-1]:
        if part.isdigit():
            continue
        annotation = section.model_fields[part].annotation
        found = [a for a in _flatten(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        section = found[0] if found else annotation
    return section


def _flatten(annotation: Any) -> list[Any]:
    """The types inside an annotation (unions, lists and Annotated unwrapped)."""
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    if typing.get_origin(annotation) is Annotated:
        return _flatten(args[0])
    return [t for a in args for t in _flatten(a)]


def _describe(
    err: ErrorDetails, source: str, lines: dict[tuple[str, ...], int], model: type[BaseModel],
    overridden: set[tuple[str, ...]] = frozenset(),  # type: ignore[assignment]
) -> str:
    # the union of data.train puts its member's tag in the location: data.train.corpora.1.weight
    loc = tuple(str(p) for i, p in enumerate(err["loc"])
                if not (i and err["loc"][i - 1] == "train" and p in ("path", CORPUS_LIST)))
    key = _dotted(loc)
    known = next((loc[:n] for n in range(len(loc), 1, -1) if loc[:n] in lines), loc)  # nearest key with a line
    where = f"{source}:{lines[known]}" if known in lines else source
    given = next((o for o in overridden if loc[: len(o)] == o and o != loc), None)
    if loc in overridden:
        where = f"--set {key}"
    elif given is not None:  # a key inside a value given by --set, e.g. --set data.train=[...]
        where = f"--set {_dotted(given)}"
    if err["type"] == "extra_forbidden":
        valid = ", ".join(_section_of(model, loc).model_fields)
        return f"{where}: unknown key '{key}'; valid keys here: {valid}"
    if err["type"] == "missing":
        return f"{where}: missing required key '{key}'"
    msg = err["msg"].removeprefix("Value error, ")
    named = where if loc in overridden else f"{where}: {key}"  # `--set KEY` names the key already
    if key and (isinstance(err.get("input"), dict) or loc == ("data", "train")):  # a check across keys, or corpora
        return f"{named}: {msg}"
    if key:
        return f"{named}: {msg} (got {err.get('input')!r})"
    return f"{where}: {msg}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (['a','b','c'], parsed value); the value is read as YAML."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. train.max_steps=2000")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set {text!r}: expected KEY.PATH=VALUE with a dotted key, e.g. model.d_model=256")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key repeated in one mapping (YAML would keep the last
    silently: a repeated `model:` section would drop everything the first one set)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first on line {seen[key].start_mark.line + 1}; "
                    "a repeated key would replace the first silently)",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config, apply `--set` overrides and validate; raise UserError with file:line on problems.
    The config.yaml of a run directory trains that directory, whatever run_dir it records
    (unless `--set run_dir=...` says otherwise): a copied run is a run of its own."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: config file not found")
    text = path.read_text(encoding="utf-8")
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of sections (name, data, model, ...) at the top level")
    lines = _key_lines(text)
    overridden: set[tuple[str, ...]] = set()
    for item in overrides:
        parts, value = parse_override(item)
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"--set {item!r}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
        overridden.add(tuple(parts))
    run = run_of_config(path)
    if run is not None and ("run_dir",) not in overridden:
        raw["run_dir"] = str(run)  # a run is where its config.yaml is: a copied run trains the copy
    kept = {k: v for k, v in lines.items() if not any(k[: len(o)] == o for o in overridden)}
    return validate_config(raw, str(path), kept, overridden)


def validate_config(
    raw: dict[str, Any], source: str, lines: dict[tuple[str, ...], int] | None = None,
    overridden: set[tuple[str, ...]] | None = None,
) -> Config:
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        msgs = [_describe(e, source, lines or {}, Config, overridden or set()) for e in exc.errors()]
        raise UserError("; ".join(msgs)) from None
    config._origin, config._lines = source, dict(lines or {})
    return config


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path else path


def with_absolute_paths(config: Config) -> Config:
    """`config` with its data files (data.train, each corpus, valid, test) and given tokenizer
    models made absolute, against the current directory, where they are read."""
    d, t = config.data, config.tokenizer
    train = ([c.model_copy(update={"path": _absolute(c.path)}) for c in d.train] if isinstance(d.train, list)
             else _absolute(d.train))
    data = d.model_copy(update={"train": train, **{k: _absolute(v) for k in ("valid", "test") if (v := getattr(d, k))}})
    tokenizer = t.model_copy(update={k: _absolute(v) for k in ("src_model", "tgt_model") if (v := getattr(t, k))})
    return config.model_copy(update={"data": data, "tokenizer": tokenizer})


def save_config(config: Config, path: Path) -> None:
    """Write the config into its run directory (as config.yaml), recording `run_dir: null`: read
    back, the run is the directory the file is in (`load_config`), wherever the run was copied.
    Its data paths are saved absolute (`with_absolute_paths`), so the file trains the run from
    any directory (`train --config RUN/config.yaml --resume`)."""
    atomic_write_text(path, dump_config(with_absolute_paths(config).model_copy(update={"run_dir": None})))
