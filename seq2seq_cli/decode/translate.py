"""Translate lines, files and stdin with a trained run.

Input is read in chunks; each chunk is sorted by length, cut into batches by a source-token
budget, decoded, detokenised and written back in input order, so memory stays bounded on
large files and the output lines match the input lines one for one (an empty input line
gives an empty output line). With --nbest N each input gives N consecutive lines.

Attention-based extras (hard alignments, attention heatmaps, unknown-token replacement)
re-run the finished hypotheses through the decoder with the explicit attention path, so
search itself stays on the fast path.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor
from tqdm import tqdm

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data.batching import pad_batch, token_batches
from seq2seq_cli.data.tokenizer import tag_id
from seq2seq_cli.decode.files import check_output, prepare_plot_dir, stdin_chunks, terminate_as_interrupt
from seq2seq_cli.decode.onednn import for_decoding
from seq2seq_cli.decode.search import NO_HYPOTHESIS, Hypothesis, max_source_subwords, search
from seq2seq_cli.device import decoding_dtype, pick_device
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write, check_text_file, iter_lines, write_lines
from seq2seq_cli.ids import EOS, UNK
from seq2seq_cli.model.transformer import Seq2SeqTransformer
from seq2seq_cli.run.loaded import load_run

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

CHUNK_LINES = 10000  # lines of a file or pipe read, sorted by length and batched at a time
PLOT_WARNING = 50  # sentences beyond which --attention-plots warns that it is slow


@dataclass
class OutputOptions:
    """What each output line carries besides the translation."""

    nbest: int = 1
    scores: bool = False  # append "\tSCORE"
    alignment: bool = False  # append "\tSRC-TGT ..." (subword positions, argmax cross-attention)
    attention_plots: Path | None = None  # one PNG heatmap per sentence
    attention_layer: int = -1  # decoder layer whose cross-attention is used
    attention_head: int | None = None  # None = mean over heads


@dataclass
class Translator:
    """A loaded run: model, tokenizers and the decoding options to use."""

    model: Seq2SeqTransformer
    src_sp: SentencePieceProcessor
    tgt_sp: SentencePieceProcessor
    decode: DecodeConfig
    device: torch.device
    run_dir: Path | None = None  # the run directory the model was loaded from
    languages: tuple[str, str] = ("src", "tgt")  # the run's data.src_lang and data.tgt_lang
    prefix: list[int] = field(default_factory=list)  # a tag's id, put in front of every source (`with_tag`)

    @classmethod
    def load(cls, model_path: str | Path, device: str = "auto", overrides: dict[str, object] | None = None) -> Translator:
        """Load a run directory or checkpoint; `overrides` (DecodeConfig keys) replace the run's
        decode settings and are validated like the config."""
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise UserError(f"--device {device!r}: expected auto, cpu or cuda")
        dev = pick_device(device, setting="--device")
        run = load_run(model_path, dev)
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
        model = run.model.to(decoding_dtype(decode, dev))
        languages = (run.config.data.src_lang, run.config.data.tgt_lang)
        model = for_decoding(model, decode.quantize)  # weights are fixed: pack them once
        return cls(model, run.src_sp, run.tgt_sp, decode, dev, run.run_dir, languages)

    def with_tag(self, tag: str | None) -> Translator:
        """This translator putting `tag` (one piece of the source tokenizer, e.g. '<bt>' or
        '>>fr<<') in front of every source line, as training put a corpus's tag; None: as it is."""
        if tag is None:
            return self
        return dataclasses.replace(self, prefix=[tag_id(self.src_sp, tag, f"--tag {tag}")])

    def encode(self, lines: list[str], cut: list[int] | None = None) -> list[list[int]]:
        """Source ids + EOS (after the tag's id, if any), truncated to what the model's
        positions allow; the indices of the lines cut short are appended to `cut` when given."""
        limit = max_source_subwords(self.model)
        encoded = self.src_sp.encode(lines)
        if self.prefix:
            encoded = [self.prefix + s if s else s for s in encoded]
        if cut is not None:
            cut.extend(i for i, s in enumerate(encoded) if len(s) > limit)
        return [s[:limit] + [EOS] for s in encoded]

    def translate_hypotheses(
        self, lines: list[str], nbest: int = 1, ids: list[list[int]] | None = None, progress: tqdm | None = None,
        first_line: int = 0,
    ) -> list[list[Hypothesis]]:
        """Decode a list of sentences -> their n-best hypotheses, in input order.

        `ids` are the lines already encoded (`encode`); `progress` advances by the sentences of
        each decoded batch (blank lines, which are not decoded, at once); `first_line` is the
        line number (from 0) of `lines[0]` in the whole input, which seeds sampling."""
        d = self.decode
        if not d.sampling and nbest > d.beam_size:
            raise UserError(f"--nbest {nbest} is larger than the beam size {d.beam_size}; raise --beam-size")
        if ids is None:
            ids = self.encode(lines)
        out: list[list[Hypothesis]] = [[NO_HYPOTHESIS] * nbest for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        blank = [i for i, line in enumerate(lines) if not line.strip()]
        if blank:  # not translated: the empty output, with the model's score for it
            empty = d.model_copy(update={"beam_size": 1, "sampling": False, "max_len_a": 0.0, "max_len_b": 0, "min_len": 0})
            src = pad_batch([[EOS]] * len(blank), [], []).to(self.device)
            for i, hyps in zip(blank, search(self.model, src, empty, 1)):
                out[i] = hyps + [NO_HYPOTHESIS] * (nbest - 1)
        if progress is not None and len(todo) < len(lines):
            progress.update(len(lines) - len(todo))
        lens = np.array([len(ids[i]) for i in todo], dtype=np.int64)
        batches = [[todo[j] for j in batch] for batch in token_batches(lens, lens, d.batch_tokens)]

        def decode(rows: list[int]) -> None:
            src = pad_batch([ids[i] for i in rows], [], []).to(self.device)
            for i, hyps in zip(rows, search(self.model, src, d, nbest, lines=[first_line + i for i in rows])):
                out[i] = hyps
            if progress is not None:
                progress.update(len(rows))

        threads = torch.get_num_threads()
        if self.device.type != "cpu" or threads == 1 or len(batches) == 1:
            for rows in batches:
                decode(rows)
            return out
        # On CPU the threads decode batches side by side, one thread each: the matrices of a
        # decoding step are too small to keep several threads busy on one of them.
        pool = ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,))
        try:
            list(pool.map(decode, batches))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # stopped (Ctrl-C, SIGTERM): no batch waiting starts
            torch.set_num_threads(threads)
        return out

    def translate(self, lines: list[str]) -> list[str]:
        """Translate sentences (1-best) in input order."""
        return [self.tgt_sp.decode(h[0].tokens) for h in self.translate_hypotheses(lines)]

    def cross_attention(self, src_ids: list[int], tokens: list[int], layer: int, head: int | None) -> Tensor:
        """Cross-attention of one hypothesis, teacher-forced -> (T+1, S): rows are output
        tokens then EOS, columns are source subwords then EOS."""
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.model.cfg.decoder_start_id] + tokens], device=self.device)
        with torch.no_grad():
            memory, src_mask, _ = self.model.encode(src)
            _, weights = self.model.decode(tgt_in, self.model.init_state(memory, src_mask), need_weights=True)
        w = weights[layer][0]  # (H, T+1, S)
        return (w.mean(dim=0) if head is None else w[head]).float().cpu()

    def render(self, tokens: list[int], src_line: str, attention: Tensor | None) -> str:
        """Detokenise; with replace_unk, each UNK becomes the most attended source piece."""
        if not (self.decode.replace_unk and UNK in tokens and attention is not None):
            return self.tgt_sp.decode(tokens)
        surfaces = [p.surface for p in self.src_sp.encode(src_line, return_type="proto").pieces]
        skip = len(self.prefix)  # the tag is not a piece of the line
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
                skip = len(self.prefix)  # source positions are the line's pieces, the tag not counted
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
        cut: list[int] | None = None,
    ) -> Iterator[str]:
        """Translate an iterable of lines chunk by chunk; yields the output lines in order.
        `progress` (a tqdm bar) advances by the sentences of each decoded batch; the line
        numbers (from 1) of lines cut to the model's positions are appended to `cut`."""
        for rows in self.translate_chunks(chunked(lines, chunk_lines), opts, progress, cut):
            yield from rows

    def translate_chunks(
        self, chunks: Iterable[list[str]], opts: OutputOptions, progress: tqdm | None = None, cut: list[int] | None = None,
    ) -> Iterator[list[str]]:
        """Translate chunks of lines -> the output lines of each chunk, in order (see
        `translate_stream`): each chunk is answered before the next is read."""
        done = 0
        for chunk in chunks:
            chunk = [line.rstrip("\r\n") for line in chunk]
            cut_here: list[int] = []
            ids = self.encode(chunk, cut_here)
            if cut is not None:
                cut.extend(done + i + 1 for i in cut_here)
            rows: list[str] = []
            for k, hyps in enumerate(self.translate_hypotheses(chunk, opts.nbest, ids, progress, first_line=done)):
                rows.extend(self.format(done + k, chunk[k], ids[k], hyps, opts))
            yield rows
            done += len(chunk)


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Lists of `size` consecutive lines (the last one shorter)."""
    it = iter(lines)
    while chunk := list(islice(it, size)):
        yield chunk


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


def plot_attention(weights: Tensor, src_pieces: list[str], tgt_pieces: list[str], path: Path) -> None:
    """Heatmap of cross-attention (target pieces x source pieces) written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, S = weights.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * S + 1.5), max(3.0, 0.35 * T + 1.0)))
    ax.imshow(weights.numpy(), cmap="Greys", vmin=0.0, aspect="auto")
    ax.set_xticks(range(S), src_pieces, rotation=90, fontsize=8)
    ax.set_yticks(range(T), tgt_pieces, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def translate_file(translator: Translator, src: str, out: str, opts: OutputOptions | None = None, progress: bool = True) -> int:
    """Translate `src` ('-' = stdin) into `out` ('-' = stdout); returns the number of output lines.

    Stdin (a terminal or a pipe) is answered as it arrives: the lines already there are
    translated and written before more is read (`stdin_chunks`); files go in chunks of CHUNK_LINES.
    A file `out` is replaced only once every line is translated (see `write_lines`).
    """
    opts = opts or OutputOptions()
    if out != "-" and not Path(out).parent.is_dir():
        raise UserError(f"{out}: output directory {Path(out).parent} does not exist")
    if out != "-" and Path(out).is_dir():
        raise UserError(f"{out}: is a directory, expected a file name to write")
    if out != "-":
        check_output(Path(out), {"input": Path(src)} if src != "-" else {}, translator.run_dir, "the translation")
    if opts.attention_plots is not None:
        prepare_plot_dir(opts.attention_plots)
    if src == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        chunks = stdin_chunks(stdin, CHUNK_LINES) if stdin is not None else chunked(sys.stdin, CHUNK_LINES)
        total: int | None = None
    else:
        total = check_text_file(Path(src))  # bad input is reported before anything is translated
        chunks = chunked(iter_lines(Path(src)), CHUNK_LINES)
    if opts.attention_plots is not None:
        chunks = warn_about_plots(chunks, total)
    cut: list[int] = []
    with tqdm(total=total, unit="sent", disable=not progress or total is None, file=sys.stderr) as bar:
        outputs = translator.translate_chunks(chunks, opts, bar, cut)
        if out != "-":
            with terminate_as_interrupt():  # SIGTERM removes the temporary file, as Ctrl-C does
                count = write_lines(Path(out), (line for rows in outputs for line in rows))
        else:
            count = 0
            sink: TextIO = sys.stdout
            for rows in outputs:
                sink.writelines(line + "\n" for line in rows)
                sink.flush()  # each chunk is answered as soon as it is translated
                count += len(rows)
    if cut:
        print(describe_cut(src, cut, max_source_subwords(translator.model)), file=sys.stderr)
    return count


def warn_about_plots(chunks: Iterable[list[str]], total: int | None) -> Iterator[list[str]]:
    """Pass `chunks` on, warning once that --attention-plots is slow for more than
    PLOT_WARNING sentences: at once when `total` is known, else when the input gets there."""
    seen, warned = 0, False
    for chunk in chunks:
        seen += len(chunk)
        count = total if total is not None else seen
        if not warned and count > PLOT_WARNING:
            some = f"{count}" if total is not None else f"more than {PLOT_WARNING}"
            print(f"warning: --attention-plots draws one PNG per sentence, about a second each: {some} sentences "
                  "will take a while (plot a few chosen lines instead)", file=sys.stderr)
            warned = True
        yield chunk


def describe_cut(src: str, cut: list[int], limit: int) -> str:
    """The one warning of a file whose lines were cut to the model's positions."""
    shown = ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else "")
    name = "stdin" if src == "-" else src
    return (f"warning: {name}: {len(cut)} line(s) longer than the model's {limit} source subwords were cut "
            f"to fit (lines {shown}); their translations cover only the beginning")
