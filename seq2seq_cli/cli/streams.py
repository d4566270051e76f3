"""What the commands check of their streams and files before a model loads (closed standard
streams, an output path that cannot be written, the documents extra), stdin's pairs for
`score -i -`, and the process's start and end around the app: closed descriptors held by
/dev/null, a reader of stdout gone ending it quietly."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from seq2seq_cli.errors import UserError


def check_streams(input: str | None, output: str) -> None:
    """Refuse, before a model loads, a closed stdin read (`-i -` with `<&-`) or a closed stdout
    written (`-o -` with `>&-`), and an `-o FILE` that cannot be written (`paths.check_output_path`)."""
    from seq2seq_cli.paths import check_output_path, refuse_link_loop

    if input == "-" and sys.stdin is None:
        raise UserError("standard input is closed (<&-): give the text with -i FILE, or on a pipe")
    if input is not None and input != "-":
        refuse_link_loop(Path(input))
    if output == "-" and sys.stdout is None:
        raise UserError("standard output is closed (>&-): write the output to a file with -o FILE")
    if output != "-":
        check_output_path(output)


def need_documents_extra(module: str, what: str) -> None:
    """Refuse `what` (e.g. "translating a .docx") where the documents extra is not installed."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UserError(f"{what} needs the documents extra ({module} is missing): pip install 'seq2seq[documents]'")


def stdin_pairs() -> Iterator[tuple[str, str]]:
    """The pairs of stdin, source<TAB>target a line, read as they are scored."""
    from seq2seq_cli.stdio import stdin_lines

    for number, line in enumerate(stdin_lines(sys.stdin.buffer), start=1):
        parts = line.split("\t")
        if len(parts) != 2:
            raise UserError(f"<stdin>:{number}: expected 2 tab-separated columns (source, target), found {len(parts)}")
        yield parts[0], parts[1]


def score_inputs(input: Path | None, src: Path | None, tgt: Path | None, output: str,
                 read_pairs: Callable[..., Iterator[tuple[str, str]]]) -> tuple[Iterator[tuple[str, str]], dict[str, Path]]:
    """`score`'s pairs (of stdin for `-i -`, read as they are scored; else `read_pairs` of the
    files, checked now) and the input files the output may not replace (flag -> path)."""
    from_stdin = input is not None and str(input) == "-"
    check_streams("-" if from_stdin else None, output)
    if from_stdin and (src is not None or tgt is not None):
        raise UserError("give the pairs as --input PAIRS.tsv (source<TAB>target a line), or as --src FILE and --tgt FILE")
    pairs = stdin_pairs() if from_stdin else read_pairs(input, src, tgt)
    inputs = {flag: path for flag, path in (("--input", input), ("--src", src), ("--tgt", tgt))
              if path is not None and not (flag == "--input" and from_stdin)}
    return pairs, inputs


def run_guarded(app: Any) -> None:
    """Run the Typer `app` as `seq2seq`: the standard streams closed at start held by /dev/null
    (`stdio.guard_standard_streams`), and what stdout still holds at the end written while its
    reader is there, else dropped quietly with the status of a process ended by SIGPIPE."""
    from seq2seq_cli.stdio import guard_standard_streams, silence_stdout

    guard_standard_streams()
    try:
        app(prog_name="seq2seq")
    finally:
        try:
            if sys.stdout is not None:
                sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
            raise SystemExit(141) from None
