"""Lines of text translated with what each output line carries: n-best lists, scores,
alignments, attention plots, constraints and glossary terms, forced prefixes, and lines cut
into sentences and joined back. The plain-text document path (`text.py`) and the tests use it.

Lines come in chunks; each chunk is decoded by the translator (sorted by length, batched by a
source-token budget) and answered in input order before the next is read, so memory stays
bounded on large files and the output lines match the input lines one for one (an empty input
line gives an empty output line). With n-best N each input gives N consecutive lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from seq2seq_cli.decode.hypotheses import Hypothesis
from seq2seq_cli.decode.plots import plot_attention
from seq2seq_cli.decode.prefixes import PrefixFile
from seq2seq_cli.decode.terms import Terminology
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.sentences import SplitPlan, Splitter, plan
from seq2seq_cli.documents.streams import CHUNK_LINES, chunked
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import UNK

if TYPE_CHECKING:
    from seq2seq_cli.decode.constraints import Phrases


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


def format_hypotheses(
    translator: Translator, index: int, src_line: str, src_ids: list[int], hyps: list[Hypothesis], opts: OutputOptions,
) -> list[str]:
    """Output lines for one input sentence (n-best, with optional scores and alignment)."""
    lines = []
    for rank, h in enumerate(hyps):
        attention = None
        # the explicit attention pass only where its result is used
        plotted = opts.attention_plots is not None and rank == 0
        if (opts.alignment or plotted or (translator.decode.replace_unk and UNK in h.tokens)) and src_line.strip():
            attention = translator.cross_attention(src_ids, h.tokens, opts.attention_layer, opts.attention_head)
        line = translator.render(h.tokens, src_line, attention)
        if opts.scores:
            line += f"\t{h.score:.4f}"
        if opts.alignment:
            skip = len(translator.tag_ids)  # source positions are the line's pieces, the tag not counted
            pairs = [] if attention is None else attention[: len(h.tokens), skip : len(src_ids) - 1].argmax(dim=1).tolist()
            line += "\t" + " ".join(f"{i}-{j}" for j, i in enumerate(pairs))
        if opts.attention_plots and rank == 0 and attention is not None:
            plot_attention(
                attention, [translator.src_sp.id_to_piece(t) for t in src_ids[:-1]] + ["</s>"],
                [translator.tgt_sp.id_to_piece(t) for t in h.tokens] + ["</s>"],
                opts.attention_plots / f"{index + 1:06d}.png",
            )
        lines.append(line)
    return lines


def translate_stream(
    translator: Translator, lines: Iterable[str], opts: OutputOptions, chunk_lines: int = CHUNK_LINES,
    progress: tqdm | None = None, cut: list[int] | None = None, prefix: PrefixFile | None = None,
) -> Iterator[str]:
    """Translate an iterable of lines chunk by chunk; yields the output lines in order.
    `progress` (a tqdm bar) advances by the sentences of each decoded batch; the line
    numbers (from 1) of lines cut to the model's positions are appended to `cut`;
    `prefix` gives each line its forced prefix."""
    for rows in translate_chunks(translator, chunked(lines, chunk_lines), opts, progress, cut, prefix=prefix):
        yield from rows


def translate_chunks(
    translator: Translator, chunks: Iterable[list[str]], opts: OutputOptions, progress: tqdm | None = None,
    cut: list[int] | None = None, input_name: str = "the input", prefix: PrefixFile | None = None,
) -> Iterator[list[str]]:
    """Translate chunks of lines -> the output lines of each chunk, in order (see
    `translate_stream`): each chunk is answered before the next is read. `input_name`
    names the input in the messages about its constraints. With `prefix`, input lines
    beyond its lines, or fewer than them, are a UserError."""
    done = units_done = 0
    for chunk in chunks:
        chunk = [line.rstrip("\r\n") for line in chunk]
        constraints = line_constraints(translator, opts.terminology, chunk, done, input_name)
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
            rows = translate_unsplit(translator, chunk, opts, progress, cut, done, constraints, prefixes)
        else:
            rows = translate_split(translator, split, opts, progress, cut, done, units_done, constraints, prefixes)
        yield rows
        done += len(chunk)
        units_done += len(chunk) if split is None else len(split.units)
    if opts.terminology is not None:
        opts.terminology.check_line_count(done, input_name)
    if prefix is not None:
        prefix.check_count(done)


def translate_unsplit(
    translator: Translator, chunk: list[str], opts: OutputOptions, progress: tqdm | None, cut: list[int] | None, done: int,
    constraints: list[Phrases] | None, prefixes: list[list[int]] | None,
) -> list[str]:
    """The output rows of a chunk of lines decoded one per line; `done`: the lines before it."""
    cut_here: list[int] = []
    ids = translator.encode(chunk, cut_here)
    if cut is not None:
        cut.extend(done + i + 1 for i in cut_here)
    rows: list[str] = []
    hyps_of = translator.translate_hypotheses(chunk, opts.nbest, ids, progress, done, prefixes, constraints)
    for k, hyps in enumerate(hyps_of):
        rows.extend(format_hypotheses(translator, done + k, chunk[k], ids[k], hyps, opts))
    return rows


def translate_split(
    translator: Translator, split: SplitPlan, opts: OutputOptions, progress: tqdm | None, cut: list[int] | None, done: int,
    units_done: int, constraints: list[Phrases] | None, prefixes: list[list[int]] | None,
) -> list[str]:
    """The output lines of a chunk cut into sentences (`split`): its units decoded as one
    batch and joined back, one line per line. `done`, `units_done`: the lines and units before
    the chunk (units seed sampling); a line cut to the model's positions is counted once."""
    units, owners = split.units, split.owners
    cut_here: list[int] = []
    ids = translator.encode(units, cut_here)
    if cut is not None:
        cut.extend(sorted({done + owners[i] + 1 for i in cut_here}))
    if progress is not None and getattr(progress, "total", None) is not None:  # the bar counts sentences
        progress.total += len(units) - len(split.splits)
        progress.refresh()
    unit_constraints = None if constraints is None else [constraints[o] for o in owners]
    unit_prefixes = None if prefixes is None else [prefixes[o] for o in owners]
    hyps_of = translator.translate_hypotheses(units, 1, ids, progress, units_done, unit_prefixes, unit_constraints)
    outputs = [format_hypotheses(translator, units_done + k, units[k], ids[k], hyps, opts)[0] for k, hyps in enumerate(hyps_of)]
    return split.join(outputs)


def line_constraints(
    translator: Translator, terms: Terminology | None, lines: list[str], first: int, input_name: str) -> list[Phrases] | None:
    """The constraint phrases (target ids) of `lines`, the input lines `first`.. (from 0),
    or None without terminology; a line whose phrases hold more tokens than the model's
    output positions is a UserError naming it."""
    if terms is None:
        return None
    phrases = terms.phrases(translator.tgt_sp, lines, first, input_name)
    limit = translator.max_source
    for i, p in enumerate(phrases):
        if sum(map(len, p)) > limit:
            raise UserError(f"{input_name}:{first + i + 1}: the constraints of this line have {sum(map(len, p))} "
                            f"target tokens, more than the model's {limit} output positions")
    return phrases


def translate_sentences(translate: Callable[[list[str]], list[str]], lines: list[str], splitter: Splitter | None) -> list[str]:
    """`translate` (sentences -> translations) applied to `lines`; with `splitter`, each line is
    cut into sentences and their translations joined back with the line's spacing."""
    if splitter is None:
        return translate(lines)
    split = plan(lines, splitter)
    return split.join(translate(split.units))
