"""`translate --prefix FILE`: target text each output starts with, one line per input line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_text_file, iter_lines

# `Translator.encode_prefixes`: texts, and where text i comes from -> target ids of each
Encode = Callable[[list[str], Callable[[int], str]], list[list[int]]]


class PrefixFile:
    """The lines of a --prefix file (target text each output starts with; blank = none),
    checked (UTF-8) and tokenized once, before anything is translated, then handed out chunk
    by chunk along the input."""

    def __init__(self, path: Path, input_name: str, encode: Encode) -> None:
        if not path.exists() and not path.is_symlink():
            raise UserError(f"{path}: prefix file not found (expected one line of target text per input line)")
        check_text_file(path)
        self.path = path
        self.input_name = input_name
        self.lines = list(iter_lines(path))
        if self.lines:
            self.lines[0] = self.lines[0].removeprefix("\ufeff")
        self.ids = encode(self.lines, lambda i: f"{path}:{i + 1}")

    def mismatch(self, input_lines: int | str) -> UserError:
        return UserError(f"{self.path} has {len(self.lines)} lines but the input {self.input_name} has {input_lines}; "
                         "give one prefix per input line (an empty line for none)")

    def check_count(self, input_lines: int) -> None:
        """Refuse an input whose line count is not the file's."""
        if input_lines != len(self.lines):
            raise self.mismatch(input_lines)

    def take(self, start: int, count: int) -> list[list[int]]:
        """The target ids of the prefixes of input lines start .. start+count-1 (from 0)."""
        if start + count > len(self.lines):
            raise self.mismatch(f"more ({start + count} at least)")
        return self.ids[start : start + count]
