"""Lines of text read as they arrive, in chunks: a file's lines CHUNK_LINES at a time, and
stdin answered as it arrives; the attention plots' folder (SIGTERM ending a translation as
Ctrl-C does is `fileio.terminate_as_interrupt`).

Stdin is read in bytes and answered as it arrives: each chunk holds the complete lines
already there (at least one, at most a chunk's worth), so a program that writes a line and
waits for its translation gets it, while a file redirected to stdin still goes in big chunks.
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import BOM, MAX_LINE_BYTES, line_too_long, read_line

CHUNK_LINES = 10000  # lines of a file or pipe read, sorted by length and batched at a time

STDIN = "<stdin>"


def decode_line(raw: bytes, number: int, name: str = STDIN) -> str:
    """One line of bytes -> text without its newline (and, the first line, without a byte-order
    mark); UserError naming `name` and the line."""
    try:
        line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        return line.removeprefix(BOM) if number == 1 else line
    except UnicodeDecodeError as exc:
        raise UserError(f"{name}:{number}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason})") from None


def _readable_now(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def stdin_chunks(stream: BinaryIO, chunk_lines: int) -> Iterator[list[str]]:
    """The lines of `stream` (stdin's bytes) in chunks of those available now: each chunk
    is yielded once no more input is waiting (or it holds `chunk_lines`). A stream without a
    file descriptor is read in chunks of `chunk_lines`. Invalid UTF-8, or a line of more than
    MAX_LINE_BYTES bytes, is a UserError naming <stdin> and the line."""
    try:
        fd = stream.fileno()
    except (OSError, AttributeError, ValueError):
        fd = -1
    number = 0
    chunk: list[str] = []
    if fd < 0:
        while raw := read_line(stream, STDIN, number + 1):
            number += 1
            chunk.append(decode_line(raw, number))
            if len(chunk) >= chunk_lines:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
        return
    pending = b""
    while True:
        data = os.read(fd, 1 << 16)
        if data:
            pending += data
            *lines, pending = pending.split(b"\n")
        else:
            lines, pending = ([pending] if pending else []), b""
        if len(pending) > MAX_LINE_BYTES:  # a line is never held whole past the bound
            raise line_too_long(STDIN, number + len(lines) + 1)
        for raw in lines:
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise line_too_long(STDIN, number)
            chunk.append(decode_line(raw, number))
            if len(chunk) >= chunk_lines:
                yield chunk
                chunk = []
        if not data:
            break
        if chunk and not _readable_now(fd):
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def prepare_plot_dir(path: Path) -> None:
    """Create the directory of --attention-plots before anything is decoded, or say why not."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: --attention-plots names a directory to write one PNG per sentence into; this is a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path}: cannot create the --attention-plots directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{path}: the --attention-plots directory is not writable")


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Lists of `size` consecutive lines (the last one shorter)."""
    it = iter(lines)
    while chunk := list(islice(it, size)):
        yield chunk
