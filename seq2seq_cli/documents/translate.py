"""One document translated whole, the same for `translate` and `serve`: its format detected
(`detect.py`), checked, translated by its module (plain text line by line with each line cut
into sentences, HTML/XML in `markup.py`, .docx in `docx.py`, .odt in `odt.py`) and written
back in the same format. On the command line the output is replaced only once it is complete;
plain text from the command line streams through `text.py` instead (n-best lists, scores,
alignments), giving the same translations.
"""

from __future__ import annotations

import sys
from pathlib import Path

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents import docx, odt
from seq2seq_cli.documents.detect import SNIFF_BYTES, check_document, detect, document_text, text_encoding
from seq2seq_cli.documents.lines import OutputOptions, translate_sentences
from seq2seq_cli.documents.markup import translate_markup
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.text import check_output_file
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write, check_output

KINDS = {DocumentFormat.html: "an HTML", DocumentFormat.xml: "an XML", DocumentFormat.docx: "a .docx",
         DocumentFormat.odt: "an .odt"}
LINE_OPTIONS = (("nbest", "--nbest"), ("scores", "--scores"), ("alignment", "--alignment"),
                ("attention_plots", "--attention-plots"), ("terminology", "--constraints and --glossary"))


def check_document_options(fmt: DocumentFormat, opts: OutputOptions, prefix: Path | None) -> None:
    """Refuse the options that belong to line-by-line output with a document format."""
    for name, flag in LINE_OPTIONS:
        value = getattr(opts, name)
        if (value != 1) if name == "nbest" else (value is not None and value is not False):
            raise UserError(f"{flag} works line by line; {KINDS[fmt]} document is translated whole (leave it out)")
    if prefix is not None:
        raise UserError(f"--prefix works line by line; {KINDS[fmt]} document is translated whole (leave it out)")


def input_format(src: str, given: DocumentFormat) -> DocumentFormat:
    """The format of the input `src` ('-' = stdin: text unless `given` says otherwise)."""
    if given is not DocumentFormat.auto or src == "-":
        return detect(src, b"", given)
    path = Path(src)
    if not path.is_file():
        return detect(src, b"", given)  # the text path reports what is wrong with it
    with path.open("rb") as f:
        return detect(src, f.read(SNIFF_BYTES), given)


def text_chars(fmt: DocumentFormat, data: bytes, name: str = "the file") -> int:
    """Characters of text a checked document holds (what a server's limit counts)."""
    if fmt is DocumentFormat.odt:
        return odt.text_chars(data, name)
    if fmt is DocumentFormat.docx:
        return docx.text_chars(data, name)
    return len(document_text(name, data, fmt))


def describe_pieces(name: str, count: int, translator: Translator) -> str:
    """The one warning of a document whose sentences were too long for the model."""
    return (f"warning: {name}: {count} sentence(s) longer than the model's {translator.max_source} "
            "source subwords were translated in pieces, cut between words")


def translate_bytes(translator: Translator, name: str, data: bytes, fmt: DocumentFormat, splitter: Splitter,
                    cut: list[int] | None = None) -> bytes:
    """A document's bytes -> the translated document's bytes, in the same format. Plain text is
    translated line by line (every line ends in LF, the last too, as `translate` writes them,
    whatever ended them), each line cut into sentences by `splitter` and joined back; HTML and
    XML are written in the encoding they were read in (`text_encoding`). The indices of a
    document's sentences translated in pieces (too long for the model) are appended to `cut`
    when given."""
    check_document(name, data, fmt)
    if fmt is DocumentFormat.docx:
        return docx.translate_docx(translator, data, splitter, name, cut)
    if fmt is DocumentFormat.odt:
        return odt.translate_odt(translator, data, splitter, name, cut)
    text = document_text(name, data, fmt)
    if fmt in (DocumentFormat.html, DocumentFormat.xml):
        translated = translate_markup(translator, text, fmt.value, splitter, name, cut)
        return translated.encode(text_encoding(name, data, fmt), errors="xmlcharrefreplace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the file is not a line
    out = translate_sentences(translator.translate, [line.rstrip("\r") for line in lines], splitter)
    return "".join(line + "\n" for line in out).encode("utf-8")  # each line ends in LF, the last too, as `translate` writes


def translate_document(translator: Translator, src: str, out: str, fmt: DocumentFormat, splitter: Splitter | None) -> None:
    """Translate the document `src` ('-' = stdin) in format `fmt` into `out` ('-' = stdout):
    read whole, translated whole, and written only once complete."""
    name = "stdin" if src == "-" else src
    if out != "-":
        check_output_file(Path(out))
        inputs = {"input": Path(src)} if src != "-" else {}
        protected: list[Path | None] = [*translator.run_dirs()] or [None]  # None: no run to protect
        for run_dir in protected:
            check_output(Path(out), inputs, run_dir, "the translation")
    if src == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    else:
        path = Path(src)
        if path.is_dir():
            raise UserError(f"{src}: cannot read (a directory, expected a {fmt.value} file)")
        if not path.is_file():
            raise UserError(f"{src}: input file not found")
        data = path.read_bytes()
    splitter = splitter or Splitter(translator.languages[0], whole=True)  # --no-split: a text node is one sentence
    cut: list[int] = []
    result = translate_bytes(translator, name, data, fmt, splitter, cut)
    if cut:
        print(describe_pieces(name, len(cut), translator), file=sys.stderr)
    if out == "-":
        sys.stdout.buffer.write(result)
        sys.stdout.flush()
        return

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(result)

    atomic_write(Path(out), write)
