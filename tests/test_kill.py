"""SIGKILL at random moments, resume each time: the final weights are bit-identical to an
uninterrupted run and no checkpoint on disk is ever corrupt."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seq2seq_cli import checkpoint as ckpt
from helpers import make_config, quiet

KILLS = 20


def assert_no_corrupt_checkpoint(ckpt_dir: Path) -> None:
    """Every checkpoint that has a manifest matches it (an unfinished one has none)."""
    if not ckpt_dir.is_dir():
        return
    for name in ["last", "best", *ckpt.step_names(ckpt_dir)]:
        if (ckpt_dir / f"{name}.json").is_file():
            assert ckpt.verify_checkpoint(ckpt_dir, name, need_state=name != "best") is None, name


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(tmp_path):
    settings = {"max_steps": 600, "valid_every": 6, "log_every": 3, "threads": 1}
    reference = quiet(make_config(tmp_path, "reference", **settings))
    cfg = make_config(tmp_path, "run", **settings)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    rng = random.Random(1234)
    kills = starts = 0
    while True:
        resume = any(ckpt_dir.glob("*.json")) if ckpt_dir.is_dir() else False
        cmd = [sys.executable, "-m", "seq2seq_cli", "train", "--config", str(cfg), "--no-progress"]
        proc = subprocess.Popen(cmd + (["--resume"] if resume else []), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        starts += 1
        if kills < KILLS:
            try:
                proc.wait(timeout=rng.uniform(2.0, 4.5))  # start-up takes ~2.5 s; then training and saves
            except subprocess.TimeoutExpired:
                proc.kill()  # SIGKILL: no handler, no cleanup
                proc.wait()
                kills += 1
                assert_no_corrupt_checkpoint(ckpt_dir)
                continue
        err = proc.communicate(timeout=300)[1].decode()
        assert proc.returncode == 0, err
        break
    assert kills == KILLS and starts == KILLS + 1
    assert_no_corrupt_checkpoint(ckpt_dir)
    a = load_file(str(reference / "checkpoints" / "last.safetensors"))
    b = load_file(str(ckpt_dir / "last.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((ckpt_dir / "last.json").read_text())["step"] == settings["max_steps"]
