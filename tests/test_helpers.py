"""The comparisons other tests rely on fail where they should."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers import assert_same


def fake_run(root: Path, steps: list[int]) -> Path:
    (root / "checkpoints").mkdir(parents=True)
    save_file({"w": torch.ones(2)}, str(root / "checkpoints" / "last.safetensors"))
    records = [{"step": s, "train_loss": 1.0 / s, "elapsed_s": s * 0.1, "tokens_per_s": 9.0} for s in steps]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return root


def test_assert_same_sees_records_one_run_has_and_the_other_lacks(tmp_path):
    short, long = fake_run(tmp_path / "a", [1, 2]), fake_run(tmp_path / "b", [1, 2, 3])
    assert_same(short, fake_run(tmp_path / "c", [1, 2]))
    for a, b in ((short, long), (long, short)):
        with pytest.raises(AssertionError, match="training records against"):
            assert_same(a, b)
