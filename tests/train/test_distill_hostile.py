"""`seq2seq distill` used as a hostile but fair user would: a teacher named by a step checkpoint,
a teacher changed between two runs, a stop anywhere (Ctrl-C, SIGTERM in the student's training,
SIGKILL), a damaged conversion of the teacher, and the refusals that name what to change."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distill_helpers import REFUSALS, student_yaml
from typer.testing import CliRunner

from helpers import one_error_line, subprocess_env, train_shipped_tiny
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.decode.loading import load_translator
from seq2seq_cli.documents.lines import translate_sentences
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.fileio import read_lines, sha256
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run.loaded import open_run
from seq2seq_cli.train import distill as distilling
from seq2seq_cli.train import teacher as teaching

runner = CliRunner()


def echo(sources: list[str], targets: list[str]) -> list[str]:
    """A teacher's translate function that is fast and tells its lines apart."""
    return [s[::-1] for s in sources]


@pytest.fixture(scope="module")
def stepped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run with the step checkpoint 20, whose outputs differ from the best's (40)."""
    return train_shipped_tiny(tmp_path_factory.mktemp("stepped"), max_steps=40, valid_every=20, keep_last=2)


def test_a_teacher_named_by_its_step_checkpoint_translates_with_that_checkpoint(stepped_run, corpus_dir):
    step = RunLayout(stepped_run).checkpoints / "step-00000020.safetensors"
    sources = read_lines(corpus_dir / "train.es")[:24]
    teacher = open_run(step)
    assert teacher.checkpoint == step and teacher.weights_sha256 == sha256(step)
    translate, _ = teaching.teacher_translate(teacher, None)
    splitter = Splitter("es")
    own = translate_sentences(load_translator([step]).translator.translate, sources, splitter)
    best = translate_sentences(load_translator([stepped_run]).translator.translate, sources, splitter)
    assert sum(a != b for a, b in zip(own, best)) >= 12  # the two checkpoints tell apart
    assert translate(sources, sources) == own


def test_a_student_of_another_teacher_is_refused_before_anything_is_translated(stepped_run, short_run, corpus_dir,
                                                                               tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(stepped_run, teacher, ignore=shutil.ignore_patterns("ctranslate2"))
    cfg = student_yaml(tmp_path, corpus_dir, teacher)
    said: list[str] = []
    distilling.distill(load_config(cfg), progress=False, log=said.append, translate=echo, report=False)
    student = tmp_path / "student"
    record = json.loads((student / "distilled" / "teacher.json").read_text(encoding="utf-8"))
    assert record["teacher_sha256"] == sha256(RunLayout(teacher).best)
    distilled = (student / "distilled" / "train-1.jsonl").read_bytes()
    # the teacher changed: its best holds other weights (its step 20's)
    checkpoints = RunLayout(teacher).checkpoints
    for suffix in (".safetensors", ".json"):
        shutil.copy(checkpoints / f"step-00000020{suffix}", checkpoints / f"best{suffix}")
    result = runner.invoke(app, ["distill", "--config", str(cfg), "--no-progress", "--no-report"])
    line = one_error_line(result, str(student), "other teacher weights", record["teacher_sha256"][:12],
                          sha256(RunLayout(teacher).best)[:12], "give the student a new run_dir")
    assert str(RunLayout(student).checkpoints) in line
    assert (student / "distilled" / "train-1.jsonl").read_bytes() == distilled  # nothing translated again
    # another teacher named on the command line: the same refusal
    other = runner.invoke(app, ["distill", "--config", str(cfg), "--teacher", str(short_run), "--no-progress"])
    one_error_line(other, "other teacher weights")
    # the same teacher: the student resumes (at its end already)
    shutil.rmtree(teacher)
    shutil.copytree(stepped_run, teacher, ignore=shutil.ignore_patterns("ctranslate2"))
    again: list[str] = []
    distilling.distill(load_config(cfg), progress=False, log=again.append, translate=echo, report=False)
    assert any("training resumes" in line for line in again), again


def test_a_student_distilled_before_the_record_was_kept_is_checked_by_its_progress_records(tiny_run, short_run,
                                                                                          corpus_dir, tmp_path):
    cfg = student_yaml(tmp_path, corpus_dir, tiny_run)
    distilling.distill(load_config(cfg), progress=False, log=lambda _: None, translate=echo, report=False)
    (tmp_path / "student" / "distilled" / "teacher.json").unlink()
    result = runner.invoke(app, ["distill", "--config", str(cfg), "--teacher", str(short_run), "--no-progress"])
    one_error_line(result, "other teacher weights", open_run(tiny_run).weights_sha256[:12])


def test_ctrl_c_in_the_teachers_pass_says_how_to_resume(tiny_run, corpus_dir, tmp_path):
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run))

    def stopped(sources: list[str], targets: list[str]) -> list[str]:
        raise KeyboardInterrupt

    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        distilling.distill(config, progress=False, log=said.append, translate=stopped, report=False)
    assert said[-1] == (f"interrupted; the teacher's pass resumes where it was last recorded with: "
                        f"seq2seq distill --config {tmp_path / 'student.yaml'} --teacher {tiny_run}"), said


def test_sigterm_in_the_students_training_advises_the_distill_command(tiny_run, corpus_dir, tmp_path, monkeypatch):
    from seq2seq_cli.train import loop

    validate = loop.validate_and_save

    def then_sigterm(*args, **kwargs):
        validate(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # taken between updates, as from the outside

    monkeypatch.setattr(loop, "validate_and_save", then_sigterm)
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run))
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        distilling.distill(config, progress=False, log=said.append, translate=echo, report=False)
    stop = [line for line in said if line.startswith("interrupted at step")]
    assert stop and stop[0].endswith(
        f"Resume with: seq2seq distill --config {tmp_path / 'student.yaml'} --teacher {tiny_run}"), said
    assert not any("train --config" in line for line in said)


def test_a_teacher_whose_conversion_was_cut_short_is_converted_again(tiny_run, corpus_dir, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_run, teacher, ignore=shutil.ignore_patterns("ctranslate2"))
    sources = read_lines(corpus_dir / "train.es")[:16]
    first, path = teaching.teacher_translate(open_run(teacher), None)
    assert "CTranslate2" in path
    want = first(sources, sources)
    (converted,) = (teacher / "ctranslate2").iterdir()
    with open(converted / "model.bin", "r+b") as f:
        f.truncate(1000)
    (converted / "config.json").unlink()
    again, _ = teaching.teacher_translate(open_run(teacher), None)
    assert again(sources, sources) == want


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _lock_frees(path: Path, within: float) -> bool:
    """Whether this process can take the lock `path` within `within` seconds (it then lets go)."""
    deadline = time.monotonic() + within
    with open(path, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
            else:
                fcntl.flock(lock, fcntl.LOCK_UN)
                return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_to_distill_ends_the_teachers_process_and_frees_the_run(tiny_run, corpus_dir, tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    for lang in ("es", "en"):  # a pass of minutes: still under way when distill is killed
        (big / f"train.{lang}").write_text((corpus_dir / f"train.{lang}").read_text(encoding="utf-8") * 40,
                                           encoding="utf-8")
        for split in ("valid", "test"):
            shutil.copy(corpus_dir / f"{split}.{lang}", big / f"{split}.{lang}")
    cfg = student_yaml(tmp_path, big, tiny_run)
    student = tmp_path / "student"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "distill", "--config", str(cfg), "--no-progress",
                             "--no-report"], env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        partial = student / "distilled" / "train-1.jsonl.partial"
        deadline = time.monotonic() + 120
        while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert partial.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no pass started"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        teachers = [int(pid) for pid in children
                    if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert teachers, children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in teachers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in teachers)
        # A killed process's leader thread shows as a zombie while its other threads (the
        # engine's) still exit; the open files, and so the lock, go with the last of them.
        assert _lock_frees(RunLayout(student).lock, within=20), "the student run's lock is still held"
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_name_what_to_change(case, tiny_run, corpus_dir, tmp_path):
    what, *fragments = REFUSALS[case]
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_run, teacher, ignore=shutil.ignore_patterns("ctranslate2"))
    cfg = student_yaml(tmp_path, corpus_dir, teacher)
    student = tmp_path / "student"
    args = ["--set", f"run_dir={teacher / 'students' / 'small'}"] if what == "inside" else \
        ["--set", "distill.nbest=5000"]
    result = runner.invoke(app, ["distill", "--config", str(cfg), *args, "--no-progress"])
    line = one_error_line(result, *fragments)
    assert "--beam-size" not in line
    assert not (teacher / "students").exists() and not (student / "distilled").exists()
