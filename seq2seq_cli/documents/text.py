"""Translate a text file or stdin line by line: `translate_file`, what `seq2seq translate`
runs for text. The input is read in chunks of CHUNK_LINES lines (stdin as it arrives), each
translated by the `Translator` and written in input order; a file output is replaced only once
every line is translated. The inputs, the output and `--prefix` are checked before anything
is translated.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from seq2seq_cli.decode.prefixes import PrefixFile
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.lines import OutputOptions, translate_chunks
from seq2seq_cli.documents.streams import CHUNK_LINES, chunked, prepare_plot_dir, stdin_chunks
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_output, check_text_file, iter_lines, terminate_as_interrupt, write_lines

PLOT_WARNING = 50  # sentences beyond which --attention-plots warns that it is slow


def translate_file(
    translator: Translator, src: str, out: str, opts: OutputOptions | None = None, progress: bool = True,
    prefix: Path | None = None,
) -> int:
    """Translate `src` ('-' = stdin) into `out` ('-' = stdout); returns the number of output lines.
    `prefix`: a file of target text each output starts with, one line per input line.

    Stdin (a terminal or a pipe) is answered as it arrives: the lines already there are
    translated and written before more is read (`stdin_chunks`); files go in chunks of CHUNK_LINES.
    A file `out` is replaced only once every line is translated (see `write_lines`).
    """
    opts = opts or OutputOptions()
    if out != "-":
        check_output_file(Path(out))
        inputs = {"input": Path(src)} if src != "-" else {}
        if opts.terminology is not None:
            inputs.update(opts.terminology.files())
        if prefix is not None:
            inputs["--prefix"] = prefix
        protected: list[Path | None] = [*translator.run_dirs()] or [None]  # None: no run to protect
        for run_dir in protected:
            check_output(Path(out), inputs, run_dir, "the translation")
    prefix_file = None if prefix is None else PrefixFile(prefix, "stdin" if src == "-" else src, translator.encode_prefixes)
    if opts.attention_plots is not None:
        prepare_plot_dir(opts.attention_plots)
    if opts.terminology is not None:
        if translator.decode.sampling:
            raise UserError("--constraints and --glossary need beam search; leave out --sampling")
        if translator.ensemble_runs:
            raise UserError("--constraints and --glossary decode with one model; give one --model (-m)")
        opts.terminology.check_tokens(translator.tgt_sp)
    if src == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        chunks = stdin_chunks(stdin, CHUNK_LINES) if stdin is not None else chunked(sys.stdin, CHUNK_LINES)
        total: int | None = None
    else:
        total = check_text_file(Path(src))  # bad input is reported before anything is translated
        if opts.terminology is not None:
            opts.terminology.check_line_count(total, src)
        if prefix_file is not None:
            prefix_file.check_count(total)
        chunks = chunked(iter_lines(Path(src)), CHUNK_LINES)
    if opts.attention_plots is not None:
        chunks = warn_about_plots(chunks, total)
    cut: list[int] = []
    with tqdm(total=total, unit="sent", disable=not progress or total is None, file=sys.stderr) as bar:
        outputs = translate_chunks(translator, chunks, opts, bar, cut, "stdin" if src == "-" else src, prefix_file)
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
        print(describe_cut(src, cut, translator.max_source), file=sys.stderr)
    return count


def check_output_file(out: Path) -> None:
    """The one rule of every format's `-o`: a file name in a directory that exists."""
    if not out.parent.is_dir():
        raise UserError(f"{out}: output directory {out.parent} does not exist")
    if out.is_dir():
        raise UserError(f"{out}: is a directory, expected a file name to write")


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
