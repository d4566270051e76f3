"""The standard streams: closed at start (`<&-`, `>&-`, `2>&-`), a reader of stdout that went
away (`| head`), and stdin's lines read with the checks of every text input."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterator
from typing import BinaryIO

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import BOM, read_line


def guard_standard_streams() -> None:
    """Where the process started with stdin, stdout or stderr closed (`<&-`, `>&-`, `2>&-`),
    put /dev/null on that descriptor, so that no file opened later takes its number (a log line
    for stderr would go into it). Closed stdin and stdout stay `None` in `sys` (Python's mark of
    a closed stream: the commands that read or write them refuse in one line); a closed stderr
    becomes /dev/null, so that log lines are dropped, never written to stdout."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if fd == 2:
                sys.stderr = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end was closed (`seq2seq ... | head`): writing to
    it fails with EPIPE, which `poll` reports as an error on the descriptor."""
    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that what Python still holds for it is dropped at exit
    rather than reported as another broken pipe."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def stdin_lines(stream: BinaryIO, name: str = "<stdin>") -> Iterator[str]:
    """The lines of a stream of bytes (stdin's), without their newline (a CR before it dropped),
    the byte-order mark skipped; invalid UTF-8 and lines past MAX_LINE_BYTES are UserErrors naming
    `name` and the line."""
    number = 0
    while raw := read_line(stream, name, number + 1):
        number += 1
        try:
            line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError as exc:
            raise UserError(f"{name}:{number}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason})") from None
        yield line.removeprefix(BOM) if number == 1 else line
