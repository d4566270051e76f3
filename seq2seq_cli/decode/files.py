"""The files of decoding: where an output may go, and stdin read as it arrives.

An output file is refused when writing it would destroy something the command needs or a
run holds: one of the command's inputs (the same path, a symbolic link to it or a hard
link) or any path inside the run directory of the model (its tokenizer, config,
checkpoints...). Outputs are checked before anything is translated.
"""

from __future__ import annotations

import os
from pathlib import Path

from seq2seq_cli.errors import UserError


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name the same file (after links), or would once `a` is written."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(output: Path, inputs: dict[str, Path], run_dir: Path | None, what: str) -> None:
    """Refuse writing `what` (e.g. "the translation") to `output` when it is one of `inputs`
    (the flag naming each input -> its path) or lies inside `run_dir` (the model's run)."""
    for flag, path in inputs.items():
        if _same(output, path):
            raise UserError(f"{output}: is the {flag} file {path}; write {what} to another file")
    if run_dir is not None:
        run = run_dir.resolve()
        target = output.resolve()
        if target == run or run in target.parents:
            raise UserError(f"{output}: is inside the model's run directory {run_dir}; write {what} outside it")
