"""The run's kept CTranslate2 conversion (RUN/ctranslate2/NAME-SHA/) is checked against the
manifest written with it: a file missing, cut short or damaged inside is converted again (or,
where the run cannot be written, into a temporary folder), never a traceback at every start and
never wrong translations with exit 0; a conversion CTranslate2 cannot load leaves the line to
our searches, saying why. A process killed while converting a read-only run leaves its temporary
folder, named with its process id, for the next start to remove."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, train_shipped_tiny
from seq2seq_cli.cli import app
from seq2seq_cli.fileio import sha256
from seq2seq_cli.layout import RunLayout

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
from seq2seq_cli.convert import ctranslate2_cache  # noqa: E402
from seq2seq_cli.convert.ctranslate2_cache import MANIFEST, MODEL_FILE, problem  # noqa: E402

LINES = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:8]


pytestmark = pytest.mark.usefixtures("torch_threads")  # torch gets its threads back after each test


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, str]:
    """A tiny run (20 updates) with its kept conversion, and `translate`'s output of LINES."""
    tmp = tmp_path_factory.mktemp("conversion")
    run = train_shipped_tiny(tmp, "run", max_steps=20)
    (tmp / "in.es").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["translate", "-m", str(run), "-i", str(tmp / "in.es"), "-o", str(tmp / "out.en")])
    assert r.exit_code == 0, r.output
    assert "searched by CTranslate2" in said(r)[0] and "not CTranslate2" not in r.stderr, r.stderr
    return run, (tmp / "out.en").read_text(encoding="utf-8")


def said(r) -> list[str]:
    """The lines on stderr as a terminal shows them (a progress bar redraws itself after each CR,
    and a line is written above it), blank ones left out."""
    return [line.rsplit("\r", 1)[-1] for line in r.stderr.split("\n") if line.rsplit("\r", 1)[-1].strip()]


def folder_of(run: Path) -> Path:
    layout = RunLayout(run)
    return layout.converted("best", sha256(layout.best))


@pytest.fixture
def run_copy(converted, tmp_path) -> Path:
    run, _ = converted
    shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("cache", "tensorboard", "*.state.pt"))
    return tmp_path / "run"


def translate(run: Path, *flags: str):
    src = run.parent / "in.es"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(run.parent / "out.en"), *flags])
    return r, (run.parent / "out.en").read_text(encoding="utf-8") if r.exit_code == 0 else ""


def truncate(folder: Path) -> None:
    model = folder / MODEL_FILE
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])


def damage(folder: Path) -> None:
    """Bytes inside model.bin's weights overwritten, its size kept."""
    model = folder / MODEL_FILE
    data = bytearray(model.read_bytes())
    start = len(data) // 2
    data[start : start + 4096] = b"\x7f" * 4096
    model.write_bytes(bytes(data))


def damage_keeping_times(folder: Path) -> None:
    """As `damage`, then its times set back (`touch -r`): the change time, which no tool sets,
    still tells."""
    st = (folder / MODEL_FILE).stat()
    damage(folder)
    os.utime(folder / MODEL_FILE, ns=(st.st_atime_ns, st.st_mtime_ns))


def vocabulary(folder: Path) -> Path:
    return next(p for p in folder.iterdir() if p.name.endswith("vocabulary.json"))


DAMAGE = {
    "model-cut-short": (truncate, "model.bin has "),
    "model-damaged-same-size": (damage, "model.bin is damaged"),
    "model-damaged-times-kept": (damage_keeping_times, "model.bin is damaged"),
    "config-deleted": (lambda f: (f / "config.json").unlink(), "config.json is missing"),
    "vocabulary-deleted": (lambda f: vocabulary(f).unlink(), "vocabulary.json is missing"),
    "manifest-deleted": (lambda f: (f / MANIFEST).unlink(), f"no {MANIFEST}"),
}


def test_a_conversion_carries_a_manifest_of_its_files(converted):
    folder = folder_of(converted[0])
    assert (folder / MANIFEST).is_file() and problem(folder) is None


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_conversion_is_converted_again(run_copy, converted, case):
    """`translate` with no flags: the note names what is wrong, the checkpoint is converted
    again, and the translation is the undamaged conversion's, exit 0."""
    folder = folder_of(run_copy)
    original = (folder / MODEL_FILE).read_bytes()
    hurt, reason = DAMAGE[case]
    hurt(folder)
    assert problem(folder) is not None
    r, out = translate(run_copy)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    notes = [line for line in said(r) if line.startswith("note: ")]
    assert len(notes) == 1 and reason in notes[0] and "converted again" in notes[0], r.stderr
    assert problem(folder) is None and (folder / MODEL_FILE).read_bytes() == original
    assert out == converted[1]
    r, again = translate(run_copy)  # the next start loads it as it is
    assert r.exit_code == 0 and again == out and "note:" not in r.stderr, r.stderr


def test_a_damaged_conversion_of_a_run_that_cannot_be_written_is_converted_into_a_temporary_folder(
        run_copy, converted, monkeypatch, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    def read_only(dest):
        raise PermissionError(13, "Permission denied", str(dest.parent))

    monkeypatch.setattr(ctranslate2_cache, "replacing_dir", read_only)
    damage(folder_of(run_copy))
    r, out = translate(run_copy)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "model.bin is damaged" in r.stderr and "converted into a temporary folder" in r.stderr
    assert out == converted[1]
    assert list(tmp.iterdir()) == []


def test_a_conversion_ctranslate2_cannot_load_leaves_the_lines_to_our_searches(run_copy, converted):
    """A conversion that matches its manifest but that CTranslate2 refuses (here: one rewritten
    with its manifest) is one note in the first line, and our searches translate."""
    folder = folder_of(run_copy)
    truncate(folder)
    ctranslate2_cache._write_manifest(folder)
    r, out = translate(run_copy)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    first = next(line for line in said(r) if not line.startswith("note: "))
    assert "our searches" in first and "CTranslate2 cannot load the converted model" in first, first
    torch_run, expected = translate(run_copy, "--engine", "torch")
    assert torch_run.exit_code == 0 and out == expected


def test_engine_ctranslate2_on_a_conversion_it_cannot_load_is_one_line(run_copy):
    folder = folder_of(run_copy)
    truncate(folder)
    ctranslate2_cache._write_manifest(folder)
    r, _ = translate(run_copy, "--engine", "ctranslate2")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    lines = said(r)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CTranslate2 cannot load the converted model" in lines[0]


KILLED_CONVERSION = textwrap.dedent("""
    import sys, time
    from seq2seq_cli.convert import ctranslate2_cache
    from seq2seq_cli.run.loaded import open_run

    def read_only(dest):
        raise PermissionError(13, "Permission denied", str(dest.parent))

    def convert(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.bin").write_bytes(b"half")
        print("converting", flush=True)
        time.sleep(120)

    ctranslate2_cache.replacing_dir = read_only
    with ctranslate2_cache.converted_model(open_run(sys.argv[1]), convert):
        pass
""")


def test_a_process_killed_while_converting_a_read_only_run_leaves_nothing_for_good(run_copy, tmp_path, monkeypatch):
    shutil.rmtree(RunLayout(run_copy).ctranslate2)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CONVERSION, str(run_copy)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "converting"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    left = [p.name for p in tmp.iterdir()]
    assert len(left) == 1 and left[0].startswith(f"seq2seq-ct2-{proc.pid}."), left
    live = tmp / f"seq2seq-ct2-{os.getpid()}.other.tmp"  # a live process's: kept
    live.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(ctranslate2_cache, "replacing_dir", lambda dest: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(dest.parent))))
    r, _ = translate(run_copy)
    assert r.exit_code == 0, r.output
    assert [p.name for p in tmp.iterdir()] == [live.name]
