"""Standard input: a pipe is answered line by line as it arrives, invalid UTF-8 names <stdin> and
the line, a byte-order mark in front of the first line is not text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import one_error_line, subprocess_env
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture
def run(short_run: Path) -> Path:
    """The shared 4-update run, read only."""
    return short_run


def read_line_within(stream, seconds: float) -> str:
    """The next line of a pipe, or AssertionError when none comes within `seconds`."""
    import select

    deadline = time.monotonic() + seconds
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([stream], [], [], left)[0], f"no line within {seconds} s (got {line!r})"
        byte = os.read(stream.fileno(), 1)
        assert byte, f"output ended (got {line!r})"
        line += byte
    return line.decode("utf-8")


def test_a_pipe_is_answered_line_by_line_before_its_end(run):
    """A program writes a line and waits for its translation before writing the next."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "--device", "cpu"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=subprocess_env(),
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        answers = []
        for line in ("hola", "adiós amigo", ""):
            proc.stdin.write(line.encode("utf-8") + b"\n")
            proc.stdin.flush()
            answers.append(read_line_within(proc.stdout, 240 if not answers else 60))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert answers[2] == "\n" and proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()
    one = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="hola\nadiós amigo\n\n")
    assert one.stdout.splitlines() == [a.rstrip("\n") for a in answers]


@pytest.mark.parametrize("data, line, offset", [(b"hola\n\xff\xfe\n", 2, 0), (b"hola\nad\xc3i\xc3\xb3s\n", 2, 2)])
def test_invalid_utf8_on_stdin_names_stdin_and_the_line(run, data, line, offset):
    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input=data)
    one_error_line(r, f"<stdin>:{line}: invalid UTF-8 at byte {offset} of the line")


def test_a_byte_order_mark_is_skipped_on_stdin_and_in_an_input_file(run, tmp_path):
    """An editor's BOM in front of the first line is not text to translate, on stdin or in -i."""
    plain = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="hola\nadiós\n")
    assert plain.exit_code == 0, plain.output
    bom = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="\ufeffhola\nadiós\n".encode())
    assert bom.exit_code == 0 and bom.stdout == plain.stdout, bom.output
    src = tmp_path / "bom.es"
    src.write_text("\ufeffhola\nadiós\n", encoding="utf-8")
    from_file = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", "-i", str(src)])
    assert from_file.exit_code == 0 and from_file.stdout == plain.stdout, from_file.output


def test_invalid_utf8_on_a_real_pipe_names_stdin_and_the_line(run):
    proc = subprocess.run([sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "--device", "cpu"],
                          input=b"hola\n\xff\n", capture_output=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    last = proc.stderr.decode().strip().splitlines()[-1]
    assert last == "error: <stdin>:2: invalid UTF-8 at byte 0 of the line (invalid start byte)"


def test_stdin_s_first_line_loses_its_byte_order_mark():
    import io

    from seq2seq_cli.documents.streams import stdin_chunks

    chunks = list(stdin_chunks(io.BytesIO("\ufeffhola\n\ufeffadiós\n".encode()), 10))  # no descriptor
    assert chunks == [["hola", "\ufeffadiós"]]
