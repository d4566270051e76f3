"""SIGKILL at chosen points of training, resume each time: the final weights are
bit-identical to an uninterrupted run and no checkpoint on disk is ever corrupt. SIGKILL while
`tokenize` trains SentencePiece, and while `train` builds its first encoding: the rerun
succeeds and leaves no temporary file behind.

Each kill lands at a step read from the run's own log (metrics.jsonl), a few logging
intervals past where the previous process had got to: between saves, or while a checkpoint is
being written (the validation record is logged just before the save), whatever the speed of
the machine."""

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import yaml
from safetensors.torch import load_file

from helpers import REPO, SHIPPED, make_config, quiet
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.encoding import BUILDING
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.run.tokenizing import train_tokenizer
from seq2seq_cli.train.metrics import read_metrics

KILLS = 20
SETTINGS = {"max_steps": 300, "valid_every": 6, "log_every": 3, "threads": 1}


def assert_no_corrupt_checkpoint(ckpt_dir: Path) -> None:
    """Every checkpoint that has a manifest matches it (an unfinished one has none)."""
    if not ckpt_dir.is_dir():
        return
    for name in ["last", "best", *ckpt.step_names(ckpt_dir)]:
        if (ckpt_dir / f"{name}.json").is_file():
            assert ckpt.verify_checkpoint(ckpt_dir, name, need_state=name != "best") is None, name


def logged_step(run: Path) -> int:
    """The highest step in the run's metrics.jsonl (0 before it exists)."""
    return max((r.get("step", 0) for r in read_metrics(run / "metrics.jsonl")), default=0)


def kill_at_step(proc: subprocess.Popen, run: Path, target: int, timeout: float = 300.0) -> int:
    """SIGKILL `proc` (no handler, no cleanup) as soon as its log reaches step `target`
    -> the step logged when it was killed."""
    deadline = time.monotonic() + timeout
    while logged_step(run) < target:
        assert proc.poll() is None, f"training ended before step {target}: {proc.communicate()[1].decode()}"
        assert time.monotonic() < deadline, f"step {target} not reached in {timeout:.0f} s"
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    return logged_step(run)


@pytest.mark.parametrize("kills, max_steps", [
    pytest.param(3, 30, id="3-kills"),
    pytest.param(KILLS, SETTINGS["max_steps"], id=f"{KILLS}-kills", marks=pytest.mark.slow),
])
def test_sigkill_at_chosen_steps_loses_nothing(tmp_path, kills, max_steps):
    """Three kills by default (at steps 12, 15 and 18 where each lands on time: a save, between
    saves, a save); the full loop, 20 kills over 300 steps, with --runslow or SEQ2SEQ_SLOW=1."""
    settings = {**SETTINGS, "max_steps": max_steps}
    reference = quiet(make_config(tmp_path, "reference", **settings))
    cfg = make_config(tmp_path, "run", **settings)
    run = tmp_path / "run"
    ckpt_dir = run / "checkpoints"
    rng = random.Random(1234)
    resumed_from: list[int] = []
    killed_at: list[int] = []
    cmd = [sys.executable, "-m", "seq2seq_cli", "train", "--config", str(cfg), "--no-progress"]
    for _ in range(kills):
        resume = (ckpt_dir / "last.json").is_file()
        resumed_from.append(json.loads((ckpt_dir / "last.json").read_text())["step"] if resume else 0)
        # past anything an earlier process logged (the log is truncated to the resume point
        # only once the new process has started)
        target = logged_step(run) + settings["log_every"] * rng.randint(1, 4)
        proc = subprocess.Popen(cmd + (["--resume"] if resume else []), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed_at.append(kill_at_step(proc, run, target))
        assert killed_at[-1] >= target
        assert_no_corrupt_checkpoint(ckpt_dir)
    proc = subprocess.Popen(cmd + ["--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.communicate(timeout=600)[1].decode()
    assert proc.returncode == 0, err
    # the kills landed after training had made progress: every resume started from a
    # checkpoint no older than the one before, and most from a newer one
    assert resumed_from == sorted(resumed_from) and len(set(resumed_from)) > kills // 2
    # some kills landed between saves, some just as a validation's checkpoint was being written
    assert {s % settings["valid_every"] for s in killed_at} >= {0, 3}
    assert_no_corrupt_checkpoint(ckpt_dir)
    a = load_file(str(reference / "checkpoints" / "last.safetensors"))
    b = load_file(str(ckpt_dir / "last.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((ckpt_dir / "last.json").read_text())["step"] == settings["max_steps"]


# ---------------------------------------------------------------------------
# SIGKILL while the tokenizer is trained, and while the first encoding is built


def leftovers(run: Path) -> list[str]:
    """Temporary files and directories in a run directory (none once a command has finished)."""
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if p.name.startswith((".building-", ".spm-training.", "tmp")) or p.name.endswith((".tmp", ".incomplete")))


@pytest.fixture(scope="module")
def kill_corpus(tmp_path_factory) -> Path:
    """A training split of a few thousand distinct pairs (so that training the tokenizer and
    encoding take a moment) and a small validation split."""
    out = tmp_path_factory.mktemp("kill-corpus")
    for lang in ("es", "en"):
        lines = (SHIPPED / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
        (out / f"train.{lang}").write_text("".join(f"{lines[i % len(lines)]} {i}\n" for i in range(4000)), encoding="utf-8")
        (out / f"valid.{lang}").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    return out


def kill_config(tmp: Path, corpus: Path) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"].update(train=str(corpus / "train"), valid=str(corpus / "valid"))
    raw["train"].update(max_steps=1, valid_every=1, threads=1)
    path = tmp / "kill.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def kill_when(proc: subprocess.Popen, appeared: Callable[[], list[Path]], timeout: float = 120.0) -> list[Path]:
    """SIGKILL `proc` as soon as `appeared()` finds something -> what it found."""
    deadline = time.monotonic() + timeout
    while not (found := appeared()):
        if proc.poll() is not None:
            pytest.fail(f"the command ended before it could be killed: {proc.communicate()[1].decode()[-2000:]}")
        assert time.monotonic() < deadline, f"nothing appeared in {timeout:.0f} s"
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    return found


def test_sigkill_of_tokenize_leaves_nothing_once_rerun(tmp_path, kill_corpus):
    cfg = kill_config(tmp_path, kill_corpus)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "tokenize", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found = kill_when(proc, lambda: list(run.glob(".spm-training.*")))
    assert not (run / "spm.model").exists()  # killed while SentencePiece trained: no model, half or whole
    assert [p for p in found if p.exists()], "the killed process's temporary directory is left behind"
    paths = train_tokenizer(load_config(cfg))
    assert paths == [run / "spm.model"]
    assert spm.SentencePieceProcessor(model_file=str(paths[0])).get_piece_size() == 300
    assert leftovers(run) == []


def test_sigkill_of_the_first_encoding_leaves_nothing_once_rerun(tmp_path, kill_corpus):
    cfg = kill_config(tmp_path, kill_corpus)
    run = tmp_path / "run"
    encoded = run / "cache" / "encoded"
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "train", "--config", str(cfg), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found = kill_when(proc, lambda: list(encoded.glob(f"{BUILDING}*")))
    assert [p for p in found if p.exists()], "the killed process's temporary directory is left behind"
    assert not list(encoded.glob("train-*")) and not (run / "checkpoints").exists()
    quiet(cfg)
    assert (run / "checkpoints" / "last.json").is_file()
    assert [p.name.split("-")[0] for p in sorted(encoded.iterdir())] == ["train", "valid"]
    assert leftovers(run) == []
