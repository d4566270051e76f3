"""What the tests of `seq2seq distill` share: a student's config of the tiny corpus, and the
refusals of the hostile tests (each with a row in docs/errors.md, section "Distillation")."""

from __future__ import annotations

from pathlib import Path

import yaml

from helpers import REPO


def student_yaml(tmp_path: Path, corpus_dir: Path, teacher: Path | None, **train) -> Path:
    """configs/student.yaml shrunk to the tiny corpus: a 2+1-layer student of `teacher`."""
    raw = yaml.safe_load((REPO / "configs" / "student.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "student")
    for split in ("train", "valid", "test"):
        raw["data"][split] = str(corpus_dir / split)
    raw["model"].update({"d_model": 32, "heads": 2, "ffn_size": 64, "encoder_layers": 2, "decoder_layers": 1})
    raw["train"].update({"max_steps": 6, "valid_every": 3, "max_minutes": None, "tensorboard": False, "plot": False,
                         "warmup_steps": 2, **train})
    raw["distill"]["teacher"] = None if teacher is None else str(teacher)
    path = tmp_path / "student.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


DOCUMENTED = {"teacher-changed"}  # docs/errors.md's rows of test_distill_hostile.py, with REFUSALS
REFUSALS = {
    "student-inside-teacher": ("inside", "is inside its teacher's run", "give the student a run of its own"),
    "beam-over-vocabulary": ("nbest", "distill.nbest: a beam of 5000", "larger than the teacher's target vocabulary"),
}
