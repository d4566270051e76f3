"""Whole documents translated on the command line: HTML and XML (`markup.py`), .docx and .odt
(`docfiles.py`, `odt.py`), read whole and written whole, the output replaced only once it is complete."""

from __future__ import annotations

import sys
from pathlib import Path

from seq2seq_cli.decode.files import check_output
from seq2seq_cli.decode.markup import translate_markup
from seq2seq_cli.decode.sentences import Splitter
from seq2seq_cli.decode.translate import OutputOptions, Translator
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write, atomic_write_text, check_text_file

LINE_OPTIONS = (("nbest", "--nbest"), ("scores", "--scores"), ("alignment", "--alignment"),
                ("attention_plots", "--attention-plots"), ("terminology", "--constraints and --glossary"))


def check_document_options(fmt: str, opts: OutputOptions, prefix: Path | None) -> None:
    """Refuse the options that belong to line-by-line output with a document format."""
    for name, flag in LINE_OPTIONS:
        value = getattr(opts, name)
        if (value != 1) if name == "nbest" else (value is not None and value is not False):
            raise UserError(f"{flag} works line by line; --format {fmt} translates a whole document (leave it out)")
    if prefix is not None:
        raise UserError(f"--prefix works line by line; --format {fmt} translates a whole document (leave it out)")


def read_document(src: str) -> str:
    """The text of `src` ('-' = stdin), checked to be UTF-8."""
    if src == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"<stdin>: invalid UTF-8 at byte {exc.start} ({exc.reason})") from None
    path = Path(src)
    check_text_file(path)
    return path.read_text(encoding="utf-8").removeprefix("\ufeff")


def translate_document(translator: Translator, src: str, out: str, fmt: str, splitter: Splitter | None) -> None:
    """Translate the HTML or XML document `src` ('-' = stdin) into `out` ('-' = stdout)."""
    if out != "-":
        inputs = {"input": Path(src)} if src != "-" else {}
        protected: list[Path | None] = [*translator.run_dirs()] or [None]  # None: no run to protect
        for run_dir in protected:
            check_output(Path(out), inputs, run_dir, "the translation")
    text = read_document(src)
    splitter = splitter or Splitter(translator.languages[0], whole=True)  # --no-split: a text node is one sentence
    result = translate_markup(translator, text, fmt, splitter, "stdin" if src == "-" else src)
    if out == "-":
        sys.stdout.write(result)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(out), result)


def translate_office_file(translator: Translator, src: str, out: str, splitter: Splitter | None) -> None:
    """Translate the .docx or .odt `src` into `out` (a file; '-' = stdout's bytes)."""
    from seq2seq_cli.decode.docfiles import translate_bytes

    if src == "-":
        raise UserError("-i -: a .docx or .odt is read from a file; give -i FILE.docx or -i FILE.odt")
    path = Path(src)
    if not path.is_file():
        raise UserError(f"{src}: input file not found")
    if out != "-":
        protected: list[Path | None] = [*translator.run_dirs()] or [None]
        for run_dir in protected:
            check_output(Path(out), {"input": path}, run_dir, "the translation")
    data = path.read_bytes()
    result = translate_bytes(translator, src, data, splitter or Splitter(translator.languages[0], whole=True))
    if out == "-":
        sys.stdout.buffer.write(result)
        sys.stdout.flush()
    else:
        def write(tmp: str) -> None:
            Path(tmp).write_bytes(result)

        atomic_write(Path(out), write)
