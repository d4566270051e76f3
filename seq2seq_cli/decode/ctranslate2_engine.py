"""The CTranslate2 engine (`--engine ctranslate2`, and `auto`'s choice where it can run): the
translator's beam and greedy searches run by CTranslate2.

The run's checkpoint is converted as `export --format ctranslate2` converts it, once, and kept
in the run (`seq2seq_cli/convert/ctranslate2_cache.py`: RUN/ctranslate2/NAME-SHA/); later starts
load that folder as it is, without torch. CTranslate2 then decodes the same model with the same
settings as our search: beam size, length penalty (the `average` form), each sentence's
output limit (a * source + b tokens before EOS; an output still going after one more token
ends there, in both) and no minimum length (CTranslate2's default of one token would never
give the empty output our search gives where it is the best). The sentences of a batch are
decoded in groups of one output limit, since CTranslate2 takes one limit per call; an output
that holds a token our search bans (padding, the decoder start token) is decoded again by
our search. So are sentences with a
forced prefix or constraints, and sampling, the gnmt length penalty, n-gram bans, ban_unk, a
minimum length and n-best lists, which CTranslate2 does otherwise (`why_not`). With the
shortlist (`--shortlist`) the run's shortlist is CTranslate2's vocabulary map (`use_vmap`), and
each sentence is decoded in a batch of its own: CTranslate2 scores a batch over the union of its
sentences' candidates, and a sentence's output would then depend on the others.
Compute type: float32, or int8 with `--quantize int8`; bfloat16 with `--precision bf16`; on
CUDA, float16 or bfloat16 as `--precision` says.

Threads: CTranslate2 takes the CPU threads, torch keeps one (`claim_threads`). On a CPU with
N > 1 threads the engine holds the model twice: one translator decodes a lone sentence on N
threads, the other several sentences as N batches side by side, one thread each. On the
quick-start model (2 cores), 8 test sentences at a time decoded at 61-79 sentences/s on 2
threads and 96-97 as 2 batches of one thread each, while a lone sentence took 12 ms on 2
threads and 16-17 ms on one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.convert.ctranslate2_cache import converted_model
from seq2seq_cli.convert.export import convert_ctranslate2, run_vocabularies
from seq2seq_cli.decode.hypotheses import Hypothesis, length_penalty, max_source, output_limit
from seq2seq_cli.decode.shortlisting import read_shortlist
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.device import decoding_precision
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import PAD
from seq2seq_cli.run.loaded import RunFiles, load_run, open_run, warn_unverified

if TYPE_CHECKING:
    from seq2seq_cli.model.transformer import Seq2SeqTransformer

COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # decoding_precision -> CTranslate2's name


def why_not(opts: DecodeConfig, nbest: int, any_nbest: bool = False) -> str | None:
    """None when CTranslate2 decodes with these options as our search does, else why not;
    `any_nbest`: its own n-best lists will do (`CTranslate2Engine.any_nbest`)."""
    if opts.sampling:
        return "sampling draws from each line's own seeded generator"
    if opts.length_penalty_type != "average":
        return f"CTranslate2 has no {opts.length_penalty_type} length penalty"
    if opts.no_repeat_ngram_size:
        return "CTranslate2 bans repeated n-grams otherwise (other outputs for 2 sentences in 5)"
    if opts.ban_unk:
        return "CTranslate2 bans UNK before the softmax, our search after it"
    if opts.min_len:
        return "CTranslate2 holds back the end of sentence otherwise (other outputs for 7 sentences in 12 at min_len 12)"
    if nbest > 1 and not any_nbest:
        return "CTranslate2 gathers the finished hypotheses of an n-best list otherwise (the best one is the same)"
    return None


@dataclass
class CTranslate2Engine:
    """A CTranslate2 `Translator` holding a run's weights, searching as our search does."""

    translator: Any  # ctranslate2.Translator
    src_pieces: list[str]  # source id -> piece
    tgt_ids: dict[str, int]  # target piece -> id
    banned: set[str]  # pieces our search never produces: padding, the decoder start token
    cap: int  # the longest output any sentence may get (the model's positions)
    name: str = field(default="CTranslate2")
    use_vmap: bool = False  # decode.shortlist: the run's shortlist, loaded as the model's vocabulary map
    batches: Any = None  # ctranslate2.Translator for several sentences: `workers` of one thread each; None: `translator`
    workers: int = 1
    any_nbest: bool = False  # its own n-best lists will do (a teacher's for `distill`): n-best lines decode here too
    serial: bool = False  # one call at a time on one worker: the engine `one_thread` gives
    _empty: list[float] = field(default_factory=list)  # see `empty_log_prob`

    def why_not(self, opts: DecodeConfig, nbest: int) -> str | None:
        return why_not(opts, nbest, self.any_nbest)

    def one_thread(self) -> CTranslate2Engine | None:
        """This engine decoding on one thread only, every call after the other on one worker of
        `batches` (a server decoding another run's sentences beside it on the other threads),
        sharing its translators; None where the engine has one thread anyway."""
        if self.batches is None:
            return None
        return dataclasses.replace(self, translator=self.batches, batches=None, workers=1, serial=True,
                                   _empty=self._empty)

    def search(self, ids: list[list[int]], opts: DecodeConfig, nbest: int) -> list[list[Hypothesis] | None]:
        limits = [output_limit(len(s), self.cap, opts.max_len_a, opts.max_len_b) for s in ids]
        pieces = [[self.src_pieces[i] for i in s[:-1]] for s in ids]  # CTranslate2 adds the EOS itself
        # Sentences of one output limit L are decoded together, with max_decoding_length = L + 1
        # (EOS counted): an output still going there ends with that token, as our search ends it.
        # A lone sentence decodes on all threads; several are split among the workers, one
        # thread each (sorted by length, then cut by CTranslate2's max_batch_size); the calls
        # of the different limits queue on the workers together.
        several = self.batches is not None and len(ids) > 1
        translator = self.batches if several else self.translator
        groups: dict[int, list[int]] = {}
        for i, limit in enumerate(limits):
            groups.setdefault(limit, []).append(i)
        calls = list(groups.items())
        if self.serial and self.use_vmap:  # a sentence a call: a call of several would spread over the workers
            calls = [(limit, [i]) for i, limit in enumerate(limits)]
        pending = []
        out: list[list[Hypothesis] | None] = [None] * len(ids)
        for limit, rows in calls:
            split = -(-len(rows) // self.workers) if several else 0
            if self.use_vmap:  # each sentence alone, with its own candidates (see the module's docstring)
                split = 1
            results = translator.translate_batch(
                [pieces[i] for i in rows], max_batch_size=split, beam_size=opts.beam_size, num_hypotheses=nbest,
                length_penalty=opts.length_penalty, max_decoding_length=limit + 1, min_decoding_length=0,
                return_scores=True, max_input_length=0, use_vmap=self.use_vmap, asynchronous=not self.serial,
            )
            pending.append((limit, rows, results))
        for limit, rows, results in pending:
            for i, result in zip(rows, results):
                out[i] = self._hypotheses(result.result() if not self.serial else result, limit, opts, nbest)
        return out

    def empty_log_prob(self) -> float:
        """The log-probability of the empty output (EOS at once) for an empty source, computed once."""
        if not self._empty:
            self._empty.append(float(sum(self.translator.score_batch([[]], [[]])[0].log_probs)))
        return self._empty[0]

    def _hypotheses(self, result: Any, limit: int, opts: DecodeConfig, nbest: int) -> list[Hypothesis] | None:
        """One sentence's CTranslate2 result as our hypotheses, or None where our search would
        differ: an output that holds a token our search bans. An output of more than `limit`
        tokens ended at the limit, without EOS."""
        hyps = []
        for toks, score in zip(result.hypotheses, result.scores):
            if self.banned.intersection(toks):
                return None
            eos = len(toks) <= limit
            lp = length_penalty(len(toks) + int(eos), opts.length_penalty, opts.length_penalty_type)
            hyps.append(Hypothesis([self.tgt_ids[p] for p in toks], score, score * lp, eos))
        return hyps if len(hyps) == nbest else None


def claim_threads() -> int:
    """Call before torch computes anything: the threads for CTranslate2 (torch's count), torch
    left with one. Each brings its own OpenMP runtime, and once torch's has run on several
    threads, CTranslate2's run several times slower on the same cores (a lone sentence at
    beam 4 on 2 cores: 13 ms, 83 to 119 ms after torch had computed on 2 threads); torch then
    only loads the run and decodes what the engine leaves to it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


def compute_type(decode: DecodeConfig, device: str) -> str:
    """CTranslate2's compute type for the decoding settings on `device` (cpu, cuda); UserError
    where this CTranslate2 has none for them."""
    import ctranslate2

    compute = "int8" if decode.quantize == "int8" else COMPUTE_TYPES[decoding_precision(decode, device)]
    supported = sorted(ctranslate2.get_supported_compute_types(device))
    if compute not in supported:
        raise UserError(f"--engine ctranslate2: CTranslate2 on {device} computes in {', '.join(supported)}, "
                        f"not {compute}; choose --precision or --quantize accordingly")
    return compute


def ctranslate2_engine(files: RunFiles, decode: DecodeConfig, device: str, index: int, threads: int, use_vmap: bool,
                       model: Callable[[], Seq2SeqTransformer]) -> CTranslate2Engine:
    """The CTranslate2 engine of the run `files` describe, on `device` (cpu or cuda, GPU `index`),
    with `threads` threads on a CPU, the shortlist as its vocabulary map where `use_vmap`.
    `model()` gives the run's model (float32, as loaded) where the run has no conversion of the
    checkpoint yet. UserError when CTranslate2 cannot hold the model."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError("--engine ctranslate2 needs the ctranslate2 package: pip install ctranslate2") from None
    compute = compute_type(decode, device)
    src_vocab, tgt_vocab = run_vocabularies(files)

    def convert(folder: Path) -> None:
        if files.layout.shortlist.is_file():  # checked once, when it becomes the model's vocabulary map
            read_shortlist(files.layout.shortlist, files.src_sp, files.tgt_sp)
        convert_ctranslate2(model(), src_vocab, tgt_vocab, folder)

    # int8 on a CPU: a lone sentence on one thread. CTranslate2's int8 products split over
    # threads cost more than they share out (a lone sentence of an int8 student on 2 cores of an
    # AMD EPYC Zen 4: 49 ms on 2 threads, 5.4 ms on one; float32 gains from the second thread)
    lone = 1 if device == "cpu" and compute.startswith("int8") else threads
    with converted_model(files, convert) as folder:
        try:
            ct = ctranslate2.Translator(str(folder), device=device, device_index=index, compute_type=compute,
                                        intra_threads=lone, inter_threads=1)
            batches = None
            if device == "cpu" and threads > 1:  # see `CTranslate2Engine.batches`
                batches = ctranslate2.Translator(str(folder), device=device, compute_type=compute, intra_threads=1,
                                                 inter_threads=threads)
        except (RuntimeError, ValueError, OSError) as exc:  # `auto` then decodes with our searches, saying why
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"{folder}: CTranslate2 cannot load the converted model ({reason})") from None
    banned = {tgt_vocab[PAD], tgt_vocab[files.config.model.decoder_start_id]}
    warn_unverified(files.checkpoint)  # once the engine holds the weights (not for weights refused on the way)
    return CTranslate2Engine(ct, src_vocab, {p: i for i, p in enumerate(tgt_vocab)}, banned,
                             max_source(files.config.model.max_positions), use_vmap=use_vmap, batches=batches,
                             workers=threads)


def with_ctranslate2(translator: Translator, model_path: str | Path, threads: int = 1) -> Translator:
    """`translator` (loaded with `Translator.load`) with the CTranslate2 engine of the run at
    `model_path` attached, on the translator's device, with `threads` threads on a CPU
    (`claim_threads`); UserError when CTranslate2 is missing or cannot hold the model."""
    import torch

    if translator.ensemble_runs:
        raise UserError("--engine ctranslate2 decodes one model; an ensemble (--model given twice or more) "
                        "decodes with --engine torch")
    files = open_run(model_path)
    device = translator.device
    engine = ctranslate2_engine(files, translator.decode, device.type, device.index or 0, threads,
                                translator.shortlist_file is not None, lambda: load_run(files.checkpoint, "cpu").model)
    torch.set_num_threads(1)  # CTranslate2 set the process's OpenMP thread count to its own (`claim_threads`)
    return translator.with_engine(engine)
