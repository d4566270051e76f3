"""The one typed configuration tree: every option of the tool, with its default and its check.

Reading it from YAML with `--set` overrides, and describing what is wrong with it, is
`config_load.py`. Nothing else in the package validates configuration: functions receive a
`Config` that is already valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

# the data section, part of this tree (re-exported)
from seq2seq_cli.config_data import CORPUS_LIST as CORPUS_LIST
from seq2seq_cli.config_data import SPLIT_TAGS as SPLIT_TAGS
from seq2seq_cli.config_data import CorpusConfig as CorpusConfig
from seq2seq_cli.config_data import DataConfig as DataConfig
from seq2seq_cli.config_data import FiltersConfig as FiltersConfig
from seq2seq_cli.config_data import SplitConfig as SplitConfig
from seq2seq_cli.config_section import Section
from seq2seq_cli.ids import BOS


def dotted_key(loc: tuple[str, ...]) -> str:
    """A key path as the user reads it: data.train[1].weight."""
    return "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc).lstrip(".")


DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"  # the devices a setting or --device names: train.device, decode's --device


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
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="auto (CUDA when present), cpu, cuda or cuda:N")
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
    shortlist: bool | None = Field(
        None, description="score only the target subwords the run's shortlist gives each sentence's own source subwords "
        "(RUN/shortlist.tsv): true (an error where the run has none); null and false = the whole vocabulary"
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> DecodeConfig:
        if self.min_len and self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise ValueError(f"min_len ({self.min_len}) exceeds the output limit max_len_b ({self.max_len_b})")
        return self


class DistillConfig(Section):
    """Where a student's training targets come from (`seq2seq distill`)."""

    teacher: str | None = Field(None, description="the run whose translations of the training sources the student learns")
    original_weight: float = Field(
        1.0, ge=0.0, allow_inf_nan=False,
        description="also train on the original targets, each corpus at this share of its weight; 0 = distilled only")
    beam_size: int | None = Field(None, ge=1, description="the teacher's beam; null = its own decode.beam_size, "
                                  "raised to nbest")
    nbest: int = Field(
        8, ge=1, description="the teacher's n best translations of each line; above 1 the one closest to the line's "
        "original target (chrF) is kept; 1 = the teacher's best")
    init_from_teacher: bool = Field(
        True, description="the student starts from the teacher's tensors of the same name and shape (embeddings, the "
        "first layers of each stack); false = from random weights")

    @model_validator(mode="after")
    def _beam_holds_nbest(self) -> DistillConfig:
        if self.beam_size is not None and self.beam_size < self.nbest:
            raise ValueError(f"beam_size ({self.beam_size}) is below nbest ({self.nbest}): the beam holds the n best")
        return self


class Config(Section):
    name: str
    run_dir: str | None = Field(None, description="where the run is written; default runs/NAME")
    data: DataConfig
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig(max_epochs=10)
    decode: DecodeConfig = DecodeConfig()
    distill: DistillConfig | None = Field(None, description="a student's teacher (seq2seq distill); null = not a student")

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
        return f"{origin}:{line}: {dotted_key(loc)}" if line else f"{origin}: {dotted_key(loc)}"


# --------------------------------------------------------------------------- fine-tuning

ARCHITECTURE_KEYS = (
    "d_model", "heads", "q_k_size", "v_size", "ffn_size", "encoder_layers", "decoder_layers",
    "norm", "positions", "max_positions", "token_types", "tie_embeddings", "bias", "activation",
    "scale_embedding", "position_layout", "logits_bias", "decoder_start_id",
)
"""The `model` keys that shape the weights or what they compute; dropout rates are free."""

VOCABULARY_KEYS = ("model_type", "vocab_size", "joint", "vocabulary", "src_model", "tgt_model")
"""The `tokenizer` keys that decide the ids; sampling settings are free."""
