"""A run is never lost: a second `train` on a trained run, two commands on one run directory,
`tokenize` into a trained run, `export --force` onto the model it exports, `translate -o`
onto its own input."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import REPO
from helpers import make_config
from seq2seq_cli.cli import app
from seq2seq_cli.run import runlock

runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(config, run directory) of a tiny trained run, copied fresh by the tests that change it."""
    tmp = tmp_path_factory.mktemp("safety")
    cfg = make_config(tmp, "run", max_steps=3, valid_every=3, tensorboard=False)
    result = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress"])
    assert result.exit_code == 0, result.output
    return cfg, tmp / "run"


def copy_run(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the trained run and a config pointing at it."""
    cfg, run = trained
    new_run = tmp_path / "run"
    shutil.copytree(run, new_run)
    text = cfg.read_text(encoding="utf-8").replace(str(run), str(new_run))
    new_cfg = tmp_path / "run.yaml"
    new_cfg.write_text(text, encoding="utf-8")
    return new_cfg, new_run


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_train_again_without_resume_is_refused_and_keeps_the_run(trained, tmp_path):
    cfg, run = copy_run(trained, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    metrics = (run / "metrics.jsonl").read_text(encoding="utf-8")
    line = error_line(runner.invoke(app, ["train", "-c", str(cfg), "--no-progress"]))
    assert "--resume" in line and "--overwrite" in line and str(run) in line
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == metrics


def test_overwrite_starts_over_and_clears_the_old_run(trained, tmp_path):
    cfg, run = copy_run(trained, tmp_path)
    (run / "checkpoints" / "step-00000999.safetensors").write_bytes(b"old")
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots" / "old.png").write_bytes(b"old")
    spm = (run / "spm.model").read_bytes()
    result = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress", "--overwrite", "--set", "train.max_steps=2",
                                 "--set", "train.valid_every=2"])
    assert result.exit_code == 0, result.output
    assert not (run / "checkpoints" / "step-00000999.safetensors").exists()
    assert not (run / "plots" / "old.png").exists()
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert max(s for s in steps if s is not None) == 2
    assert (run / "spm.model").read_bytes() == spm  # the tokenizer stays


def test_resume_and_overwrite_together_are_refused(trained, tmp_path):
    cfg, _ = copy_run(trained, tmp_path)
    line = error_line(runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--overwrite"]))
    assert "--resume and --overwrite" in line


def test_a_locked_run_names_its_holder(trained, tmp_path):
    """Another process holds the run: train and tokenize say who; when it dies, the lock goes with it."""
    cfg, run = copy_run(trained, tmp_path)
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); sys.argv = ['seq2seq', 'train', '-c', 'x.yaml'];"
            f"from seq2seq_cli.run import runlock; runlock.acquire({str(run)!r}, runlock.command_line());"
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for args in (["train", "-c", str(cfg), "--resume", "--no-progress"], ["tokenize", "-c", str(cfg)]):
            line = error_line(runner.invoke(app, args))
            assert f"pid {holder.pid}" in line and "seq2seq train" in line and "since" in line, line
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the OS drops the lock
        holder.wait()
    path = runlock.acquire(run, "test")  # not stale
    runlock.release(path)


def test_the_lock_is_reentrant_and_released(tmp_path):
    first = runlock.acquire(tmp_path, "a")
    second = runlock.acquire(tmp_path, "b")
    assert first == second
    runlock.release(second)
    runlock.release(first)
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from seq2seq_cli.run import runlock;"
            f"runlock.release(runlock.acquire({str(tmp_path)!r}, 'c'))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_tokenize_into_a_trained_run_is_refused(trained, tmp_path):
    cfg, run = copy_run(trained, tmp_path)
    spm = (run / "spm.model").read_bytes()
    line = error_line(runner.invoke(app, ["tokenize", "-c", str(cfg)]))
    assert "checkpoints" in line and "another run_dir" in line
    assert (run / "spm.model").read_bytes() == spm


def test_export_force_onto_the_run_is_refused(trained, tmp_path):
    _, run = copy_run(trained, tmp_path)
    for target in (run, run / "checkpoints", run.parent):
        line = error_line(runner.invoke(app, ["export", str(target), "-m", str(run), "--force"]))
        assert "holds the model being exported" in line, line
        assert (run / "checkpoints" / "last.safetensors").is_file()


def test_translate_output_onto_its_input_is_refused(trained, tmp_path):
    _, run = trained
    src = tmp_path / "in.txt"
    src.write_text("hola\n", encoding="utf-8")
    link = tmp_path / "other-name.txt"
    os.link(src, link)
    for out in (src, link):
        line = error_line(runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(out)]))
        assert "is the input file" in line, line
    assert src.read_text(encoding="utf-8") == "hola\n"


def test_translate_output_keeps_permissions_and_special_files(trained, tmp_path):
    _, run = trained
    src = tmp_path / "in.txt"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    out.write_text("old\n", encoding="utf-8")
    out.chmod(0o640)
    assert runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--no-progress"]).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and len(out.read_text(encoding="utf-8").splitlines()) == 2
    real = tmp_path / "real.txt"
    real.write_text("", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    assert runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(link), "--no-progress"]).exit_code == 0
    assert link.is_symlink() and len(real.read_text(encoding="utf-8").splitlines()) == 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    result = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(fifo), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert len(reader.communicate(timeout=30)[0].splitlines()) == 2
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_checkpoint_without_manifest_is_said_to_be_unverified(trained, tmp_path):
    _, run = copy_run(trained, tmp_path)
    (run / "checkpoints" / "best.json").unlink()
    src = tmp_path / "in.txt"
    src.write_text("hola\n", encoding="utf-8")
    result = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(tmp_path / "out.txt"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "best.safetensors: no manifest (best.json), so the weights cannot be fully verified" in result.stderr


def test_averaged_checkpoints_carry_a_manifest(trained, tmp_path):
    cfg, run = copy_run(trained, tmp_path)
    result = runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--no-progress", "--set", "train.max_steps=6",
                                 "--set", "train.valid_every=3"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["average", "-m", str(run), "--last", "2"]).exit_code == 0
    assert (run / "checkpoints" / "average-last-2.json").is_file()
    result = runner.invoke(app, ["translate", "-m", str(run / "checkpoints" / "average-last-2.safetensors"), "--no-progress"],
                           input="hola\n")
    assert result.exit_code == 0 and "cannot be fully verified" not in result.stderr, result.output


def test_long_source_lines_are_reported_once_with_their_numbers(trained, tmp_path):
    _, run = trained
    src = tmp_path / "long.txt"
    long_line = " ".join(["palabra"] * 400)
    src.write_text(f"hola\n{long_line}\nadiós\n{long_line}\n", encoding="utf-8")
    result = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(tmp_path / "out.txt"), "--no-progress"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "long.txt: 2 line(s) longer than the model's 254 source subwords" in warnings[0] and "(lines 2, 4)" in warnings[0]


def test_temporary_files_of_dead_processes_are_removed(tmp_path):
    from seq2seq_cli.fileio import write_lines

    dead = tmp_path / ".out.txt.1999999999.0badc0de.tmp"  # no process has this id
    live = tmp_path / f".out.txt.{os.getpid()}.0badc0de.tmp"
    dead_dir = tmp_path / ".spm-training.1999999999.x.tmp"
    for p in (dead, live):
        p.write_text("half\n", encoding="utf-8")
    dead_dir.mkdir()
    write_lines(tmp_path / "out.txt", ["a"])
    assert not dead.exists() and live.exists()
    from seq2seq_cli.fileio import remove_dead_temps

    remove_dead_temps(tmp_path, ".spm-training.")
    assert not dead_dir.exists()


def test_write_errors_name_the_output_not_its_temporary_file(tmp_path):
    from seq2seq_cli.fileio import write_lines

    def full_disk():
        yield "a"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as info:
        write_lines(tmp_path / "out.txt", full_disk())
    assert info.value.filename == str(tmp_path / "out.txt") and info.value.errno == 28
    assert list(tmp_path.iterdir()) == []


def test_train_gives_the_lock_back_when_it_returns_or_fails(trained, tmp_path):
    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.errors import UserError
    from seq2seq_cli.train.loop import train

    cfg, run = copy_run(trained, tmp_path)
    train(load_config(cfg, ["train.max_steps=4"]), resume=True, progress=False, log=lambda _: None)
    assert runlock._held == {}
    with pytest.raises(UserError):
        train(load_config(cfg), progress=False, log=lambda _: None)  # refused: the run has checkpoints
    assert runlock._held == {}


def test_tokenize_killed_while_training_leaves_nothing_after_a_rerun(tmp_path):
    """SIGKILL while SentencePiece trains: no lock is left, the rerun succeeds and removes the
    dead process's temporary directory."""
    cfg = make_config(tmp_path, "run", max_steps=1)
    text = cfg.read_text(encoding="utf-8").replace(str(REPO / "data" / "bible-es-en" / "valid"),
                                                   str(REPO / "data" / "bible-es-en" / "train"))
    cfg.write_text(text, encoding="utf-8")
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "tokenize", "-c", str(cfg)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(run.glob(".spm-training.*")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    killed_mid_training = bool(list(run.glob(".spm-training.*")))
    result = runner.invoke(app, ["tokenize", "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    assert (run / "spm.model").is_file()
    assert not list(run.glob(".spm-training.*")) and not list(run.glob("*.tmp"))
    assert killed_mid_training  # the kill did land while SentencePiece was training


def test_writing_to_a_device_keeps_the_device(tmp_path):
    from seq2seq_cli.fileio import write_lines

    assert write_lines(Path(os.devnull), ["a", "b"]) == 2
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert not list(Path(os.devnull).parent.glob(".null.*.tmp"))


def foreign_tokenizer(run: Path) -> None:
    """Replace the run's spm.model by another SentencePiece model of the same size (BPE instead
    of unigram, on the same text): every piece count matches, the ids do not."""
    import sentencepiece as spm

    from helpers import SHIPPED

    before = (run / "spm.model").read_bytes()
    prefix = run.parent / "foreign"
    spm.SentencePieceTrainer.train(input=[str(SHIPPED / "valid.es"), str(SHIPPED / "valid.en")], model_prefix=str(prefix),
                                   model_type="bpe", vocab_size=300, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    shutil.copyfile(f"{prefix}.model", run / "spm.model")
    assert spm.SentencePieceProcessor(model_file=str(run / "spm.model")).get_piece_size() == 300
    assert (run / "spm.model").read_bytes() != before


def test_a_foreign_tokenizer_of_the_same_size_is_refused(trained, tmp_path):
    from seq2seq_cli.data.tokenizer import TOKENIZER_SHA256
    from seq2seq_cli.run.checkpoint import read_metadata

    cfg, run = copy_run(trained, tmp_path)
    assert runner.invoke(app, ["average", "-m", str(run), "--last", "1"]).exit_code == 0
    average = run / "checkpoints" / "average-last-1.safetensors"
    recorded = read_metadata(run / "checkpoints" / "last.safetensors")[TOKENIZER_SHA256]
    assert json.loads(recorded).keys() == {"spm.model"}
    assert read_metadata(average)[TOKENIZER_SHA256] == recorded  # averaging carries it over
    foreign_tokenizer(run)
    for model in (run, average):
        line = error_line(runner.invoke(app, ["translate", "-m", str(model), "--no-progress"], input="hola\n"))
        assert line.startswith(f"error: {run / 'spm.model'}: tokenizer is not the one ") and "sha256 differs" in line, line
        assert str(model if model == average else run / "checkpoints" / "best.safetensors") in line, line
    # --resume: refused before the corpus is encoded with the foreign tokenizer
    encoded = sorted((run / "cache" / "encoded").iterdir())
    result = runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--no-progress", "--set", "train.max_steps=6"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert f"{run / 'spm.model'}: tokenizer is not the one {run / 'checkpoints' / 'last.safetensors'}" in line, line
    assert sorted((run / "cache" / "encoded").iterdir()) == encoded


def test_a_checkpoint_without_a_tokenizer_record_loads_as_before(trained, tmp_path):
    """Checkpoints saved before they recorded their tokenizer are used unchecked."""
    from safetensors.torch import load_file, save_file

    from seq2seq_cli.data.tokenizer import TOKENIZER_SHA256
    from seq2seq_cli.fileio import sha256
    from seq2seq_cli.run.checkpoint import read_metadata

    _, run = copy_run(trained, tmp_path)
    best = run / "checkpoints" / "best.safetensors"
    meta = read_metadata(best)
    tensors = load_file(str(best))
    best.unlink()  # best may be a hard link to a step checkpoint: rewrite only this name
    save_file(tensors, str(best), metadata={k: v for k, v in meta.items() if k != TOKENIZER_SHA256})
    manifest = json.loads((run / "checkpoints" / "best.json").read_text(encoding="utf-8"))
    manifest["sha256"]["weights"] = sha256(best)
    (run / "checkpoints" / "best.json").unlink()
    (run / "checkpoints" / "best.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert TOKENIZER_SHA256 not in read_metadata(best)
    foreign_tokenizer(run)
    result = runner.invoke(app, ["translate", "-m", str(run), "--no-progress", "--full-vocabulary"],  # the shortlist
                           input="hola\n")  # holds the run's own tokenizer's pieces, which the test replaced
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1, result.output


def test_a_copied_run_trains_the_copy_and_leaves_the_original(trained, tmp_path):
    _, original = copy_run(trained, tmp_path / "a")
    saved = original / "config.yaml"  # as a run trained in place records it
    saved.write_text(saved.read_text(encoding="utf-8").replace(str(trained[1]), str(original)), encoding="utf-8")
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    before = {p.relative_to(original): p.read_bytes() for p in sorted(original.rglob("*")) if p.is_file()}
    result = runner.invoke(app, ["train", "-c", str(copy / "config.yaml"), "--resume", "--no-progress",
                                 "--set", "train.max_steps=5", "--set", "train.valid_every=5"])
    assert result.exit_code == 0, result.output
    assert {p.relative_to(original): p.read_bytes() for p in sorted(original.rglob("*")) if p.is_file()} == before
    assert json.loads((copy / "checkpoints" / "last.json").read_text(encoding="utf-8"))["step"] == 5
    assert f"resumed from {copy / 'checkpoints' / 'last.safetensors'} at step 3" in result.stderr
    # the config saved into a run does not name a directory: the run is where it lies
    assert yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))["run_dir"] is None


def test_the_saved_config_resumes_from_any_directory(tmp_path, monkeypatch):
    """Data paths given relative to where `train` first ran are saved resolved, so the command
    training prints at its end (`train --config RUN/config.yaml --resume`) works from elsewhere."""
    first = tmp_path / "first"
    (first / "data").mkdir(parents=True)
    for lang in ("es", "en"):
        lines = (REPO / "data" / "bible-es-en" / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:120]
        (first / "data" / f"small.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = "runs/rel"
    raw["data"].update(train="data/small", valid="data/small", test="data/small")
    raw["train"].update(max_steps=2, valid_every=2, tensorboard=False)
    (first / "rel.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.chdir(first)
    result = runner.invoke(app, ["train", "-c", "rel.yaml", "--no-progress"])
    assert result.exit_code == 0, result.output
    run = first / "runs" / "rel"
    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["data"]["train"] == saved["data"]["valid"] == saved["data"]["test"] == str(first / "data" / "small")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["train", "-c", str(run / "config.yaml"), "--resume", "--no-progress",
                                 "--set", "train.max_steps=4"])
    assert result.exit_code == 0, result.output
    assert json.loads((run / "checkpoints" / "last.json").read_text(encoding="utf-8"))["step"] == 4
