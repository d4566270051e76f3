"""The directory an import or export writes: checked before any work, replaced as a whole.

`check_output_dir` refuses, before anything is converted, an output that would lose data: a
symbolic link or a file where a directory is to be written, a directory that holds the model
being read (the run or Marian directory itself, or one of its parents), a run another command
(a `train`) holds, and any non-empty directory without `--force`. `replacing_output` then
takes the output's run lock and builds the new directory beside the old one
(`fileio.replacing_dir`): an interrupted import or export leaves the old directory as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_directory_target, replacing_dir
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run import runlock


def check_output_dir(out: Path, force: bool, inputs: Iterable[Path], what: str) -> None:
    """Refuse `out` as the directory to write when writing there could lose data; `inputs` are
    the files and directories of the model being read, `what` is "imported" or "exported"."""
    out = Path(out)
    check_directory_target(out)
    target = out.resolve()
    for given in inputs:
        held = Path(given).resolve()
        if held == target or held.is_relative_to(target):
            raise UserError(f"{out}: holds the model being {what} ({held}); write into another directory")
        owner = RunLayout(Path(given)).owner_of(out) if Path(given).is_dir() else None
        if owner is not None:
            raise UserError(f"{out}: belongs to the run {given} ({owner.relative_to(given)}); write into another directory")
    if not out.is_dir():
        return
    who = runlock.holder(out)
    if who is not None:
        raise UserError(f"{out}: run directory is in use by {who}; wait for it to finish, or write into another directory")
    if any(out.iterdir()) and not force:
        raise UserError(f"{out}: already exists and is not empty; use --force to overwrite")


@contextlib.contextmanager
def replacing_output(out: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces `out` as a whole when the body succeeds (see
    `fileio.replacing_dir`), holding the run lock of an existing `out` meanwhile."""
    out = Path(out)
    lock = runlock.hold(out, runlock.command_line()) if out.is_dir() and not out.is_symlink() else contextlib.nullcontext()
    with lock, replacing_dir(out) as tmp:
        yield tmp
