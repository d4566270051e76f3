"""The edges of the command line: closed standard streams, a reader of stdout that goes away,
loops of symbolic links, output names that cannot be files, a config that is not UTF-8, a line
too long to be a sentence, a .docx without the documents extra, `score` on stdin and stopped by
SIGTERM. Each refusal is one line with a row in docs/errors.md, section "Command-line edges"
(checked below)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import REPO, documented_errors, one_error_line, subprocess_env, train_shipped_tiny
from seq2seq_cli.cli import app

runner = CliRunner()
SEQ2SEQ = f"{sys.executable} -m seq2seq_cli"


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: a tiny run, an input and the odd paths the cases name."""
    tmp = tmp_path_factory.mktemp("edges")
    train_shipped_tiny(tmp, "run", max_steps=2)
    (tmp / "in.txt").write_text("hola\nadiós\n", encoding="utf-8")
    (tmp / "pairs.tsv").write_text("hola\thello\nadiós\tgoodbye\n", encoding="utf-8")
    (tmp / "plain.txt").write_text("kept\n", encoding="utf-8")
    os.symlink(tmp / "loop-b", tmp / "loop-a")
    os.symlink(tmp / "loop-a", tmp / "loop-b")
    (tmp / "nul.txt").write_bytes(b"hola\n" + b"\0" * (3 << 20) + b"\n")
    (tmp / "latin1.yaml").write_bytes("name: canción\n".encode("latin-1"))
    (tmp / "a.docx").write_bytes(b"PK\x03\x04")
    return tmp


def shell(ws: Path, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`command` (`seq2seq` standing for this checkout's) run by bash in the workspace."""
    return subprocess.run(["bash", "-c", command.replace("seq2seq ", f"{SEQ2SEQ} ")], cwd=ws, capture_output=True,
                          timeout=timeout, env=subprocess_env())


def cli(ws: Path, *args: str) -> list[str]:
    return [str(a).replace("WS", str(ws)) for a in args]


# case -> (the command, in the workspace; the message after `error: `). `seq2seq ...` strings run
# in bash as separate processes (the streams are closed there); lists go through CliRunner.
CASES: dict[str, tuple[str | Callable[[Path], list[str]], str]] = {
    "stdin-closed": ("seq2seq translate -m run --engine torch <&-",
                     "standard input is closed (<&-): give the text with -i FILE, or on a pipe"),
    "stdout-closed": ("seq2seq translate -m run -i in.txt --engine torch >&-",
                      "standard output is closed (>&-): write the output to a file with -o FILE"),
    "input-link-loop": (lambda ws: cli(ws, "translate", "-m", "WS/run", "-i", "WS/loop-a", "--engine", "torch"),
                        "WS/loop-a: a loop of symbolic links (too many levels of links lead nowhere); point the link "
                        "at a file, or give another path"),
    "output-link-loop": (lambda ws: cli(ws, "translate", "-m", "WS/run", "-i", "WS/in.txt", "-o", "WS/loop-b"),
                         "WS/loop-b: a loop of symbolic links (too many levels of links lead nowhere); point the link "
                         "at a file, or give another path"),
    "output-trailing-slash": (lambda ws: cli(ws, "translate", "-m", "WS/run", "-i", "WS/in.txt", "-o", "WS/newdir/"),
                              "WS/newdir/: names a directory (it ends in a slash), which does not exist; give a file "
                              "name to write, e.g. WS/newdir/out.txt in a directory that exists"),
    "output-parent-is-file": (lambda ws: cli(ws, "translate", "-m", "WS/run", "-i", "WS/in.txt",
                                             "-o", "WS/plain.txt/out.txt"),
                              "WS/plain.txt/out.txt: WS/plain.txt is a file, not a directory; write into a directory"),
    "config-not-utf8": (lambda ws: cli(ws, "tokenize", "-c", "WS/latin1.yaml"),
                        "WS/latin1.yaml:1: invalid UTF-8 at byte 11 of the line (invalid continuation byte)"),
    "input-line-too-long": (lambda ws: cli(ws, "translate", "-m", "WS/run", "-i", "WS/nul.txt", "--engine", "torch"),
                            "WS/nul.txt:2: line longer than 1048576 bytes (1 MiB), the most a line may hold; "
                            "expected one sentence a line (a file without newlines, or not text?)"),
    "stdin-line-too-long": ("seq2seq translate -m run --engine torch < nul.txt",
                            "<stdin>:2: line longer than 1048576 bytes (1 MiB), the most a line may hold; "
                            "expected one sentence a line (a file without newlines, or not text?)"),
    "stdin-pipe-line-too-long": ("head -c 3145728 /dev/zero | seq2seq translate -m run --engine torch",
                                 "<stdin>:1: line longer than 1048576 bytes (1 MiB), the most a line may hold; "
                                 "expected one sentence a line (a file without newlines, or not text?)"),
    "score-stdin-columns": ("printf 'hola\\thello\\nadiós\\n' | seq2seq score -m run -i - --device cpu",
                            "<stdin>:2: expected 2 tab-separated columns (source, target), found 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_edge_is_one_line(ws, case):
    command, message = CASES[case]
    message = message.replace("WS", str(ws))
    if isinstance(command, str):
        done = shell(ws, command)
        lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
        assert done.returncode == 1, (done.returncode, done.stderr)
        assert lines == [f"error: {message}"], done.stderr
        assert done.stdout == b""
    else:
        line = one_error_line(runner.invoke(app, command(ws)))
        assert line == f"error: {message}"
    assert not (ws / "newdir").exists() and (ws / "plain.txt").read_text(encoding="utf-8") == "kept\n"


def test_every_case_has_a_row_in_the_errors_page():
    rows = documented_errors("Command-line edges")
    assert set(rows) == set(CASES) | {"docx-without-extra"}


def test_a_docx_without_the_documents_extra_is_one_line(ws, monkeypatch):
    """An install without python-docx: refused before the model loads, naming the extra as
    `serve` names its own."""
    monkeypatch.setitem(sys.modules, "docx", None)
    line = one_error_line(runner.invoke(app, cli(ws, "translate", "-m", "WS/nowhere", "-i", "WS/a.docx")))
    assert line == "error: translating a .docx needs the documents extra (docx is missing): pip install 'seq2seq[documents]'"
    assert line == documented_errors("Command-line edges")["docx-without-extra"]


def test_log_lines_never_go_to_stdout_when_stderr_is_closed(ws):
    """With stderr closed the translation alone is written to stdout (the log line is dropped),
    exit 0, as with stderr open."""
    open_err = shell(ws, "seq2seq translate -m run -i in.txt --engine torch --no-progress")
    closed = shell(ws, "seq2seq translate -m run -i in.txt --engine torch --no-progress 2>&-")
    assert open_err.returncode == closed.returncode == 0, closed
    assert b"translating with" in open_err.stderr and b"translating with" not in closed.stdout
    assert closed.stdout == open_err.stdout and len(closed.stdout.splitlines()) == 2


@pytest.mark.parametrize(("command", "reader"), [
    ("seq2seq tokenize -c run/config.yaml --set run_dir=tok", "true"),
    ("yes hola | head -50 | seq2seq translate -m run --engine torch --no-progress", "true"),
    ("yes $'hola\\thello' | head -20000 | seq2seq score -m run -i - --device cpu", "head -1"),
])
def test_a_reader_of_stdout_that_goes_away_ends_the_command_quietly(ws, command, reader):
    """`| head -1` (or a reader gone before the first line): the command stops at the broken pipe
    without a word, with the status of a process ended by SIGPIPE (141), as cat or grep do."""
    done = shell(ws, f"{command} | {reader}; exit ${{PIPESTATUS[-2]}}")
    assert done.returncode == 141, done
    assert b"error" not in done.stderr and b"Traceback" not in done.stderr, done.stderr
    assert len(done.stdout.splitlines()) == (1 if reader == "head -1" else 0)


def test_score_reads_stdin_as_translate_does(ws):
    from_file = runner.invoke(app, cli(ws, "score", "-m", "WS/run", "-i", "WS/pairs.tsv", "--device", "cpu"))
    from_stdin = runner.invoke(app, cli(ws, "score", "-m", "WS/run", "-i", "-", "--device", "cpu"),
                               input=(ws / "pairs.tsv").read_bytes())
    assert from_file.exit_code == from_stdin.exit_code == 0, from_stdin.output
    assert from_stdin.stdout == from_file.stdout and len(from_stdin.stdout.splitlines()) == 2


def test_score_stopped_by_sigterm_leaves_no_temporary_file(ws):
    """SIGTERM while `score -o F` writes: the temporary file is removed, as Ctrl-C removes it,
    and F is not written."""
    out = ws / "scores.txt"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "score", "-m", str(ws / "run"), "-i", "-",
                             "-o", str(out), "--device", "cpu"], cwd=ws, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=subprocess_env())
    assert proc.stdin is not None
    proc.stdin.write(b"hola\thello\n")
    proc.stdin.flush()  # stdin stays open: the scores are being written to the temporary file
    deadline = time.monotonic() + 120
    while not list(ws.glob(".scores.txt.*.tmp")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not list(ws.glob(".scores.txt.*")) and not out.exists()


def test_405_names_the_methods_allowed(ws):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.serve.app import ServeSettings, create_app

    with TestClient(create_app(Translator.load(ws / "run", "cpu"), ServeSettings())) as client:
        answer = client.get("/translate")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"
    assert answer.json() == {"error": "Method Not Allowed"}


def test_the_docs_section_exists():
    assert "## Command-line edges" in (REPO / "docs" / "errors.md").read_text(encoding="utf-8")


def export_outputs(page: str) -> list[tuple[str, bool]]:
    """(the output directory, whether --force is given) of each `seq2seq export` line of a page's
    code blocks."""
    import shlex

    found = []
    for line in (REPO / page).read_text(encoding="utf-8").splitlines():
        if not line.startswith("seq2seq export"):
            continue
        words = [w for w in shlex.split(line.split("#", 1)[0])[2:] if "[" not in w and "]" not in w]
        valued = {"--model", "-m", "--format", "--quantization"}
        positional = [w for i, w in enumerate(words) if not w.startswith("-") and (i == 0 or words[i - 1] not in valued)]
        found.append((positional[0].rstrip("/"), "--force" in words))
    return found


def test_the_export_commands_of_the_docs_run_after_the_readmes():
    """docs/interop.md's export commands, run after the README's, each write where no earlier
    one wrote (export refuses a directory that holds a model unless --force)."""
    readme = {out for out, _ in export_outputs("README.md")}
    interop = export_outputs("docs/interop.md")
    assert interop and all(force or out not in readme for out, force in interop), (readme, interop)
