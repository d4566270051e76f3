"""The `Translator`: a loaded run translating lines (files and stdin: `textfile.py`).

Lines come in chunks; each chunk is sorted by length, cut into batches by a source-token
budget, decoded, detokenised and written back in input order, so memory stays bounded on
large files and the output lines match the input lines one for one (an empty input line
gives an empty output line). With --nbest N each input gives N consecutive lines. With
--prefix FILE each output starts with its line of FILE, tokenized with the run's target
tokenizer (see `search`): one line of target text per input line, an empty line for none.

Attention-based extras (hard alignments, attention heatmaps, unknown-token replacement)
re-run the finished hypotheses through the decoder with the explicit attention path, so
search itself stays on the fast path.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor
from tqdm import tqdm

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data.batching import pad_batch, token_batches
from seq2seq_cli.data.shortlist import Shortlist, read
from seq2seq_cli.data.tokenizer import all_pieces, tag_id
from seq2seq_cli.decode.constraints import Phrases, constrained_beam_search
from seq2seq_cli.decode.engines import SearchEngine
from seq2seq_cli.decode.ensemble import Ensemble, check_member
from seq2seq_cli.decode.files import CHUNK_LINES, chunked
from seq2seq_cli.decode.onednn import for_decoding
from seq2seq_cli.decode.plots import plot_attention
from seq2seq_cli.decode.prefixes import PrefixFile
from seq2seq_cli.decode.search import NO_HYPOTHESIS, Decoder, Hypothesis, max_source_subwords, search
from seq2seq_cli.decode.sentences import SplitPlan, Splitter, plan
from seq2seq_cli.decode.terms import Terminology
from seq2seq_cli.decode.threads import one_thread, spread
from seq2seq_cli.device import decoding_dtype, pick_device
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, UNK
from seq2seq_cli.layout import CONFIG, RunLayout
from seq2seq_cli.model.transformer import Seq2SeqTransformer
from seq2seq_cli.run.loaded import load_run

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

FEW_LINES = 64  # fewer lines are tokenized one by one (`Translator.encode`)


@dataclass
class OutputOptions:
    """What each output line carries besides the translation."""

    nbest: int = 1
    scores: bool = False  # append "\tSCORE"
    alignment: bool = False  # append "\tSRC-TGT ..." (subword positions, argmax cross-attention)
    attention_plots: Path | None = None  # one PNG heatmap per sentence
    attention_layer: int = -1  # decoder layer whose cross-attention is used
    attention_head: int | None = None  # None = mean over heads
    terminology: Terminology | None = None  # --constraints and --glossary: target phrases each output holds
    splitter: Splitter | None = None  # cut each line into sentences and join their translations (see `splits`)

    def splits(self) -> bool:
        """Whether lines are cut into sentences: with a splitter, and one output per line that
        is a translation alone (no --nbest, --scores, --alignment or --attention-plots, whose
        scores, positions and plots are those of one decoded sentence)."""
        return (self.splitter is not None and self.nbest == 1 and not self.scores and not self.alignment
                and self.attention_plots is None)


@dataclass
class Translator:
    """A loaded run: model, tokenizers and the decoding options to use. With several runs
    (`load` of a list), `model` is their `Ensemble` and the tokenizers, decoding settings and
    languages are the first run's."""

    model: Decoder
    src_sp: SentencePieceProcessor
    tgt_sp: SentencePieceProcessor
    decode: DecodeConfig
    device: torch.device
    run_dir: Path | None = None  # the run directory the model was loaded from
    languages: tuple[str, str] = ("src", "tgt")  # the run's data.src_lang and data.tgt_lang
    _word_start: Tensor | None = field(default=None, repr=False)  # see `word_start`
    ensemble_runs: tuple[Path, ...] = ()  # the run directories of an ensemble's other members
    tag_ids: list[int] = field(default_factory=list)  # a tag's id, put in front of every source (`with_tag`)
    tags: tuple[str, ...] | None = None  # the corpus tags the run was trained with; None: any (an imported vocabulary)
    engine: SearchEngine | None = None  # another engine searching where it can (`seq2seq_cli/decode/engines.py`)
    listed: Decoder | None = None  # with decode.shortlist: the model scoring only its shortlist (lines with no prefix)

    @classmethod
    def load(
        cls, model_path: str | Path | Sequence[str | Path], device: str = "auto", overrides: dict[str, object] | None = None,
    ) -> Translator:
        """Load a run directory or checkpoint, or several as an ensemble (a list of two or
        more); `overrides` (DecodeConfig keys) replace the (first) run's decode settings and
        are validated like the config."""
        paths = [model_path] if isinstance(model_path, (str, Path)) else list(model_path)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise UserError(f"--device {device!r}: expected auto, cpu or cuda")
        dev = pick_device(device, setting="--device")
        run = load_run(paths[0], dev)
        settings = run.config.decode.model_dump()
        settings.update(overrides or {})
        try:
            decode = DecodeConfig(**settings)
        except ValidationError as exc:
            raise UserError(describe_decode_error(exc, overrides or {})) from None
        vocab = int(run.meta["tgt_vocab"])
        if not decode.sampling and decode.beam_size > vocab:
            where = "--beam-size" if "beam_size" in (overrides or {}) else "decode.beam_size (the run's config)"
            raise UserError(f"{where} {decode.beam_size}: larger than the target vocabulary ({vocab} tokens)")
        if (decode.constraint_beam_size or 0) > vocab:
            where = "--constraint-beam-size" if "constraint_beam_size" in (overrides or {}) else "decode.constraint_beam_size"
            raise UserError(f"{where} {decode.constraint_beam_size}: larger than the target vocabulary ({vocab} tokens)")
        runs = [run]
        for path in paths[1:]:
            runs.append(load_run(path, dev))
            check_member(runs[-1], path, run, paths[0])
        # weights are fixed: pack them once
        models = [for_decoding(r.model.to(decoding_dtype(decode, dev)), decode.quantize) for r in runs]
        languages = (run.config.data.src_lang, run.config.data.tgt_lang)
        model: Decoder = models[0] if len(models) == 1 else Ensemble(models)
        others = tuple(r.run_dir for r in runs[1:])
        tags = None if run.config.tokenizer.vocabulary == "file" else tuple(run.config.data.tags)
        listed = None
        if decode.shortlist:
            if len(models) > 1:
                raise UserError("--shortlist decodes one model; an ensemble decodes with the whole vocabulary "
                                "(--full-vocabulary)")
            listed = shortlisted(models[0], read_shortlist(RunLayout(run.run_dir).shortlist, run.src_sp, run.tgt_sp))
        return cls(model, run.src_sp, run.tgt_sp, decode, dev, run.run_dir, languages, ensemble_runs=others, tags=tags,
                   listed=listed)

    @property
    def shortlist_file(self) -> Path | None:
        """The file `listed`'s shortlist was read from (None: no shortlist)."""
        return None if self.listed is None or self.run_dir is None else RunLayout(self.run_dir).shortlist

    @property
    def attention_model(self) -> Seq2SeqTransformer:
        """The model whose cross-attention gives alignments, plots and unknown-word
        replacement: the model, or an ensemble's first member."""
        return self.model.models[0] if isinstance(self.model, Ensemble) else self.model

    def run_dirs(self) -> list[Path]:
        """The run directories of the model (every member's, for an ensemble)."""
        return ([] if self.run_dir is None else [self.run_dir]) + list(self.ensemble_runs)

    def with_tag(self, tag: str | None) -> Translator:
        """This translator putting `tag` (one piece of the source tokenizer, e.g. '<bt>' or
        '>>fr<<') in front of every source line, as training put a corpus's tag; None: as it is."""
        if tag is None:
            return self
        ids = [tag_id(self.src_sp, tag, f"--tag {tag}")]
        if self.tags is not None and tag not in self.tags:
            config = self.run_dir / CONFIG if self.run_dir is not None else "the run's config"
            if not self.tags:
                raise UserError(f"--tag {tag}: the run was trained without tags (no corpus of data.train of {config} "
                                "has one); leave out --tag")
            raise UserError(f"--tag {tag}: the run was trained with the tags {', '.join(self.tags)} (data.train of "
                            f"{config}); give one of them")
        return dataclasses.replace(self, tag_ids=ids)

    def with_engine(self, engine: SearchEngine | None) -> Translator:
        """This translator with `engine` searching where it can (None: our searches alone)."""
        return dataclasses.replace(self, engine=engine)

    def encode(self, lines: list[str], cut: list[int] | None = None) -> list[list[int]]:
        """Source ids + EOS (after the tag's id, if any), truncated to what the model's
        positions allow; the indices of the lines cut short are appended to `cut` when given."""
        limit = max_source_subwords(self.model)
        # A list goes to SentencePiece's pool of threads, started for each call: 0.2-1 ms, more
        # than a few lines take one by one (about 10 us each).
        sp = self.src_sp
        encoded = sp.encode(lines) if len(lines) >= FEW_LINES else [sp.encode(line) for line in lines]
        if self.tag_ids:
            encoded = [self.tag_ids + s if s else s for s in encoded]
        if cut is not None:
            cut.extend(i for i, s in enumerate(encoded) if len(s) > limit)
        return [s[:limit] + [EOS] for s in encoded]

    def encode_prefixes(self, texts: list[str], where: Callable[[int], str]) -> list[list[int]]:
        """Forced prefixes as target ids, one per text (blank = none); a prefix longer than the
        model's outputs can be is a UserError naming `where(i)` (its file and line)."""
        limit = max_source_subwords(self.model)
        prefixes = [self.tgt_sp.encode(t) if t.strip() else [] for t in texts]
        for i, p in enumerate(prefixes):
            if len(p) > limit:
                raise UserError(f"{where(i)}: the prefix has {len(p)} target pieces; the model's outputs hold at most {limit}")
        return prefixes

    def translate_hypotheses(
        self, lines: list[str], nbest: int = 1, ids: list[list[int]] | None = None, progress: tqdm | None = None,
        first_line: int = 0, prefixes: list[list[int]] | None = None, constraints: list[Phrases] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decode a list of sentences -> their n-best hypotheses, in input order.

        `ids` are the lines already encoded (`encode`); `progress` advances by the sentences of
        each decoded batch (blank lines, which are not decoded, at once); `first_line` is the
        line number (from 0) of `lines[0]` in the whole input, which seeds sampling;
        `prefixes` (`encode_prefixes`, one per line) are forced at the start of the outputs
        (a blank line with a prefix gives the prefix alone); `constraints`: the target phrases
        (ids) of each line, decoded by constrained beam search (`seq2seq_cli/decode/constraints.py`);
        the lines without any decode as without."""
        d = self.decode
        if not d.sampling and nbest > d.beam_size:
            raise UserError(f"--nbest {nbest} is larger than the beam size {d.beam_size}; raise --beam-size")
        if constraints is not None and any(constraints) and d.sampling:
            raise UserError("--constraints and --glossary need beam search; leave out --sampling")
        word_start = self.word_start() if constraints is not None and any(constraints) else None
        engine = self.engine if self.engine is not None and self.engine.why_not(d, nbest) is None else None
        if ids is None:
            ids = self.encode(lines)
        out: list[list[Hypothesis]] = [[NO_HYPOTHESIS] * nbest for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        blank = [i for i, line in enumerate(lines) if not line.strip()]
        if blank:  # not translated: the empty output, with the model's score for it
            empty = d.model_copy(update={"beam_size": 1, "sampling": False, "max_len_a": 0.0, "max_len_b": 0, "min_len": 0})
            src = pad_batch([[EOS]] * len(blank), [], []).to(self.device)
            if prefixes:
                found = search(self.model, src, empty, 1, prefixes=[prefixes[i] for i in blank])
            else:
                found = search(self.model, src, empty, 1)
            for i, hyps in zip(blank, found):
                out[i] = hyps + [NO_HYPOTHESIS] * (nbest - 1)
        if progress is not None and len(todo) < len(lines):
            progress.update(len(lines) - len(todo))
        # Lines with constraints and lines without are batched apart: a batch then runs one
        # search, not both, each with its own steps.
        groups = [todo] if not constraints else [[i for i in todo if constraints[i]], [i for i in todo if not constraints[i]]]
        batches = []
        for group in groups:
            if len(group) == 1:  # a lone line (a request of one sentence): one batch, nothing to plan
                batches.append(group)
                continue
            lens = np.array([len(ids[i]) for i in group], dtype=np.int64)
            batches += [[group[j] for j in batch] for batch in token_batches(lens, lens, d.batch_tokens)]

        def decode(batch: list[int]) -> None:
            held = [i for i in batch if constraints and constraints[i]]
            rows = [i for i in batch if not (constraints and constraints[i])]
            if rows and engine:  # the engine takes the lines without a prefix; our search what it leaves
                taken = [i for i in rows if not (prefixes and prefixes[i])]
                by_engine = dict(zip(taken, engine.search([ids[i] for i in taken], d, nbest) if taken else []))
                for i, engine_hyps in by_engine.items():
                    if engine_hyps is not None:
                        out[i] = engine_hyps
                rows = [i for i in rows if by_engine.get(i) is None]
            if rows:
                src = pad_batch([ids[i] for i in rows], [], []).to(self.device)
                lines_of = [first_line + i for i in rows]
                if prefixes:  # a prefix's tokens may be off the shortlist: the whole vocabulary
                    found = search(self.model, src, d, nbest, lines_of, [prefixes[i] for i in rows])
                else:
                    found = search(self.listed or self.model, src, d, nbest, lines=lines_of)
                for i, hyps in zip(rows, found):
                    out[i] = hyps
            if held:
                assert constraints is not None and not isinstance(self.model, Ensemble)  # refused in translate_file
                src = pad_batch([ids[i] for i in held], [], []).to(self.device)
                found = constrained_beam_search(self.model, src, d, [constraints[i] for i in held], nbest, word_start)
                for i, hyps in zip(held, found):
                    out[i] = hyps + [NO_HYPOTHESIS] * (nbest - len(hyps))
            if progress is not None:
                progress.update(len(batch))

        threads = torch.get_num_threads()
        # An engine uses the threads itself, on each batch.
        if self.device.type != "cpu" or threads == 1 or engine:
            for rows in batches:
                decode(rows)
            return out
        # On CPU the threads decode batches side by side, one thread each: the matrices of a
        # decoding step are too small to keep several threads busy on one of them, and their
        # handshakes at every op cost more than they save (a lone sentence too decodes on one).
        batches = spread(batches, threads)
        if len(batches) <= 1:  # one batch, or none (blank lines only)
            with one_thread():
                for rows in batches:
                    decode(rows)
            return out
        pool = ThreadPoolExecutor(min(threads, len(batches)), initializer=torch.set_num_threads, initargs=(1,))
        try:
            list(pool.map(decode, batches))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # stopped (Ctrl-C, SIGTERM): no batch waiting starts
            torch.set_num_threads(threads)
        return out

    def word_start(self) -> Tensor:
        """(V,) the target tokens that begin a word or hold no letter or digit (see
        `constrained_beam_search`), computed once."""
        if self._word_start is None:
            pieces = all_pieces(self.tgt_sp)
            starts = [p.startswith("\u2581") or not any(c.isalnum() for c in p) or (p.startswith("<") and p.endswith(">"))
                      for p in pieces]  # special pieces (<pad>, </s>, ...) count as word starts
            vocab = self.attention_model.tgt_embed.tokens.num_embeddings
            starts = (starts + [True] * vocab)[:vocab]
            self._word_start = torch.tensor(starts, dtype=torch.bool, device=self.device)
        return self._word_start

    def translate(self, lines: list[str], splitter: Splitter | None = None) -> list[str]:
        """Translate sentences (1-best) in input order; with `splitter`, each line is cut into
        sentences and their translations joined back (`seq2seq_cli/decode/sentences.py`)."""
        if splitter is None:
            return [self.tgt_sp.decode(h[0].tokens) for h in self.translate_hypotheses(lines)]
        split = plan(lines, splitter)
        return split.join(self.translate(split.units))

    def cross_attention(self, src_ids: list[int], tokens: list[int], layer: int, head: int | None) -> Tensor:
        """Cross-attention of one hypothesis, teacher-forced -> (T+1, S): rows are output
        tokens then EOS, columns are source subwords then EOS."""
        src = torch.tensor([src_ids], device=self.device)
        model = self.attention_model
        tgt_in = torch.tensor([[model.cfg.decoder_start_id] + tokens], device=self.device)
        with torch.no_grad():
            memory, src_mask, _ = model.encode(src)
            _, weights = model.decode(tgt_in, model.init_state(memory, src_mask), need_weights=True)
        w = weights[layer][0]  # (H, T+1, S)
        return (w.mean(dim=0) if head is None else w[head]).float().cpu()

    def render(self, tokens: list[int], src_line: str, attention: Tensor | None) -> str:
        """Detokenise; with replace_unk, each UNK becomes the most attended source piece."""
        if not (self.decode.replace_unk and UNK in tokens and attention is not None):
            return self.tgt_sp.decode(tokens)
        surfaces = [p.surface for p in self.src_sp.encode(src_line, return_type="proto").pieces]
        skip = len(self.tag_ids)  # the tag is not a piece of the line
        text = []
        for j, tok in enumerate(tokens):
            if tok == UNK:
                i = int(attention[j, skip : skip + len(surfaces)].argmax()) if surfaces else 0
                text.append(surfaces[i] if surfaces else "")
            else:
                text.append(self.tgt_sp.id_to_piece(tok).replace("\u2581", " "))
        return "".join(text).strip()

    def format(self, index: int, src_line: str, src_ids: list[int], hyps: list[Hypothesis], opts: OutputOptions) -> list[str]:
        """Output lines for one input sentence (n-best, with optional scores and alignment)."""
        lines = []
        for rank, h in enumerate(hyps):
            attention = None
            # the explicit attention pass only where its result is used
            plotted = opts.attention_plots is not None and rank == 0
            if (opts.alignment or plotted or (self.decode.replace_unk and UNK in h.tokens)) and src_line.strip():
                attention = self.cross_attention(src_ids, h.tokens, opts.attention_layer, opts.attention_head)
            line = self.render(h.tokens, src_line, attention)
            if opts.scores:
                line += f"\t{h.score:.4f}"
            if opts.alignment:
                skip = len(self.tag_ids)  # source positions are the line's pieces, the tag not counted
                pairs = [] if attention is None else attention[: len(h.tokens), skip : len(src_ids) - 1].argmax(dim=1).tolist()
                line += "\t" + " ".join(f"{i}-{j}" for j, i in enumerate(pairs))
            if opts.attention_plots and rank == 0 and attention is not None:
                plot_attention(
                    attention, [self.src_sp.id_to_piece(t) for t in src_ids[:-1]] + ["</s>"],
                    [self.tgt_sp.id_to_piece(t) for t in h.tokens] + ["</s>"],
                    opts.attention_plots / f"{index + 1:06d}.png",
                )
            lines.append(line)
        return lines

    def translate_stream(
        self, lines: Iterable[str], opts: OutputOptions, chunk_lines: int = CHUNK_LINES, progress: tqdm | None = None,
        cut: list[int] | None = None, prefix: PrefixFile | None = None,
    ) -> Iterator[str]:
        """Translate an iterable of lines chunk by chunk; yields the output lines in order.
        `progress` (a tqdm bar) advances by the sentences of each decoded batch; the line
        numbers (from 1) of lines cut to the model's positions are appended to `cut`;
        `prefix` gives each line its forced prefix."""
        for rows in self.translate_chunks(chunked(lines, chunk_lines), opts, progress, cut, prefix=prefix):
            yield from rows

    def translate_chunks(
        self, chunks: Iterable[list[str]], opts: OutputOptions, progress: tqdm | None = None, cut: list[int] | None = None,
        input_name: str = "the input", prefix: PrefixFile | None = None,
    ) -> Iterator[list[str]]:
        """Translate chunks of lines -> the output lines of each chunk, in order (see
        `translate_stream`): each chunk is answered before the next is read. `input_name`
        names the input in the messages about its constraints. With `prefix`, input lines
        beyond its lines, or fewer than them, are a UserError."""
        done = units_done = 0
        for chunk in chunks:
            chunk = [line.rstrip("\r\n") for line in chunk]
            constraints = self.constraints(opts.terminology, chunk, done, input_name)
            prefixes = None if prefix is None else prefix.take(done, len(chunk))
            if constraints and prefixes:
                for k, (c, f) in enumerate(zip(constraints, prefixes)):
                    if c and f:
                        raise UserError(f"{input_name}:{done + k + 1}: a line has both constraints and a prefix; "
                                        "give it one or the other")
            # a line with constraints or a prefix is decoded whole: they belong to the line
            keep_whole = [bool((constraints and constraints[i]) or (prefixes and prefixes[i])) for i in range(len(chunk))]
            split = plan(chunk, opts.splitter, keep_whole) if opts.splits() and opts.splitter is not None else None
            if split is None:
                rows = self.translate_lines(chunk, opts, progress, cut, done, constraints, prefixes)
            else:
                rows = self.translate_split(split, opts, progress, cut, done, units_done, constraints, prefixes)
            yield rows
            done += len(chunk)
            units_done += len(chunk) if split is None else len(split.units)
        if opts.terminology is not None:
            opts.terminology.check_line_count(done, input_name)
        if prefix is not None:
            prefix.check_count(done)

    def translate_lines(
        self, chunk: list[str], opts: OutputOptions, progress: tqdm | None, cut: list[int] | None, done: int,
        constraints: list[Phrases] | None, prefixes: list[list[int]] | None,
    ) -> list[str]:
        """The output rows of a chunk of lines decoded one per line; `done`: the lines before it."""
        cut_here: list[int] = []
        ids = self.encode(chunk, cut_here)
        if cut is not None:
            cut.extend(done + i + 1 for i in cut_here)
        rows: list[str] = []
        hyps_of = self.translate_hypotheses(chunk, opts.nbest, ids, progress, done, prefixes, constraints)
        for k, hyps in enumerate(hyps_of):
            rows.extend(self.format(done + k, chunk[k], ids[k], hyps, opts))
        return rows

    def translate_split(
        self, split: SplitPlan, opts: OutputOptions, progress: tqdm | None, cut: list[int] | None, done: int,
        units_done: int, constraints: list[Phrases] | None, prefixes: list[list[int]] | None,
    ) -> list[str]:
        """The output lines of a chunk cut into sentences (`split`): its units decoded as one
        batch and joined back, one line per line. `done`, `units_done`: the lines and units before
        the chunk (units seed sampling); a line cut to the model's positions is counted once."""
        units, owners = split.units, split.owners
        cut_here: list[int] = []
        ids = self.encode(units, cut_here)
        if cut is not None:
            cut.extend(sorted({done + owners[i] + 1 for i in cut_here}))
        if progress is not None and getattr(progress, "total", None) is not None:  # the bar counts sentences
            progress.total += len(units) - len(split.splits)
            progress.refresh()
        unit_constraints = None if constraints is None else [constraints[o] for o in owners]
        unit_prefixes = None if prefixes is None else [prefixes[o] for o in owners]
        hyps_of = self.translate_hypotheses(units, 1, ids, progress, units_done, unit_prefixes, unit_constraints)
        outputs = [self.format(units_done + k, units[k], ids[k], hyps, opts)[0] for k, hyps in enumerate(hyps_of)]
        return split.join(outputs)

    def constraints(self, terms: Terminology | None, lines: list[str], first: int, input_name: str) -> list[Phrases] | None:
        """The constraint phrases (target ids) of `lines`, the input lines `first`.. (from 0),
        or None without terminology; a line whose phrases hold more tokens than the model's
        output positions is a UserError naming it."""
        if terms is None:
            return None
        phrases = terms.phrases(self.tgt_sp, lines, first, input_name)
        limit = max_source_subwords(self.model)
        for i, p in enumerate(phrases):
            if sum(map(len, p)) > limit:
                raise UserError(f"{input_name}:{first + i + 1}: the constraints of this line have {sum(map(len, p))} "
                                f"target tokens, more than the model's {limit} output positions")
        return phrases


def shortlisted(model: Seq2SeqTransformer, shortlist: Shortlist) -> Seq2SeqTransformer:
    """A copy of `model` (sharing everything) whose searches score only the target ids
    `shortlist` gives each batch's source ids (`Seq2SeqTransformer.candidates`)."""
    listed = copy.copy(model)
    listed.candidates = shortlist.candidates
    return listed


def read_shortlist(path: Path, src_sp: SentencePieceProcessor, tgt_sp: SentencePieceProcessor) -> Shortlist:
    """The run's shortlist file; a UserError where there is none."""
    if not path.is_file():
        raise UserError(f"{path}: the run has no shortlist (seq2seq train writes it from the training data when it "
                        "starts); decode without --shortlist")
    return read(path, {p: i for i, p in enumerate(all_pieces(src_sp))}, {p: i for i, p in enumerate(all_pieces(tgt_sp))})


def describe_decode_error(exc: ValidationError, overrides: dict[str, object]) -> str:
    """A rejected decoding option as one line: the flag (or the run's decode.* key), the value
    and what is allowed."""
    problems = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        if not err["loc"]:
            problems.append(f"decoding options: {msg}")
            continue
        name = str(err["loc"][0])
        where = f"--{name.replace('_', '-')}" if name in overrides else f"decode.{name} (the run's config)"
        problems.append(f"{where} {err['input']!r}: {msg}")
    return "; ".join(problems)
