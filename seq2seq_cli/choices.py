"""The fixed choices of command-line flags, as typed values: a bad value is refused by the
parser with the choices listed (exit code 2), like any bad flag."""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    """Who searches: `auto` picks the fastest engine that gives our answers (`seq2seq_cli/decode/loading.py`)."""

    auto = "auto"
    torch = "torch"
    ctranslate2 = "ctranslate2"


class DocumentFormat(StrEnum):
    """How `translate` reads its input: `auto` by the file's name and content (`seq2seq_cli/documents/detect.py`)."""

    auto = "auto"
    text = "text"
    html = "html"
    xml = "xml"
    docx = "docx"
    odt = "odt"


class ExportFormat(StrEnum):
    """What `export` writes."""

    ctranslate2 = "ctranslate2"
    hf = "hf"
    argos = "argos"
