"""The run's CTranslate2 model, converted once and kept with the run.

The CTranslate2 engine decodes a checkpoint converted as `export --format ctranslate2` converts
it. The conversion is written once, into RUN/ctranslate2/NAME-SHA/ (`RunLayout.converted`: the
checkpoint's name and the first 16 hex digits of its weights' sha256), with the run's shortlist
as its vmap.txt, and later starts load it as it is. It is written as a whole
(`fileio.replacing_dir`: built under a temporary name, renamed in when complete), so a reader
finds the whole model or none; SIGTERM or Ctrl-C while converting removes the temporary folder,
and one left by a killed process is removed by the next conversion. A checkpoint whose weights
change (training writes a new best) gets a new folder, and the folders of its earlier weights,
and of step checkpoints training has rotated away, are removed. Where the run cannot be written
(a read-only run directory, a full disk), the conversion goes to a temporary folder, removed
once CTranslate2 has loaded it.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from seq2seq_cli.convert.export import VMAP
from seq2seq_cli.fileio import replacing_dir, terminate_as_interrupt
from seq2seq_cli.layout import WEIGHTS, RunLayout
from seq2seq_cli.run.loaded import RunFiles

MODEL_FILE = "model.bin"  # written last by CTranslate2's converter


@contextlib.contextmanager
def converted_model(files: RunFiles, convert: Callable[[Path], object]) -> Iterator[Path]:
    """The folder of the CTranslate2 model of `files`' checkpoint, for the block: the run's own
    (RUN/ctranslate2/NAME-SHA), written by `convert(folder)` plus the shortlist the first time;
    where the run cannot hold it, a temporary folder removed when the block ends."""
    layout = files.layout
    name = files.checkpoint.name.removesuffix(WEIGHTS)
    folder = layout.converted(name, files.weights_sha256)
    shortlist = layout.shortlist if layout.shortlist.is_file() else None
    if not complete(folder, shortlist) and not _write_kept(folder, shortlist, convert):
        with tempfile.TemporaryDirectory(prefix="seq2seq-ct2-") as tmp, terminate_as_interrupt():
            _write(Path(tmp) / "model", shortlist, convert)
            yield Path(tmp) / "model"
        return
    yield folder


def complete(folder: Path, shortlist: Path | None) -> bool:
    """Whether `folder` holds a converted model with the run's shortlist as it is now."""
    if not (folder / MODEL_FILE).is_file():
        return False
    vmap = folder / VMAP
    if shortlist is None:
        return not vmap.exists()
    return vmap.is_file() and filecmp.cmp(vmap, shortlist, shallow=False)


def _write_kept(folder: Path, shortlist: Path | None, convert: Callable[[Path], object]) -> bool:
    """Write the conversion into the run at `folder` -> whether it is there now (False: the
    run cannot be written; the reason is printed once)."""
    try:
        folder.parent.mkdir(exist_ok=True)
        if not os.access(folder.parent, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(folder.parent))
        with terminate_as_interrupt(), replacing_dir(folder) as tmp:
            _write(tmp, shortlist, convert)
    except OSError as exc:
        if complete(folder, shortlist):  # another process wrote it meanwhile
            return True
        where = exc.filename or folder.parent
        print(f"note: {where}: {exc.strerror or exc}; the CTranslate2 model is converted into a temporary "
              "folder for this process only", file=sys.stderr)
        return False
    remove_stale(RunLayout(folder.parent.parent), folder)
    return True


def _write(folder: Path, shortlist: Path | None, convert: Callable[[Path], object]) -> None:
    convert(folder)
    if shortlist is not None:  # CTranslate2's vocabulary map is the shortlist's format
        shutil.copyfile(shortlist, folder / VMAP)


def remove_stale(layout: RunLayout, keep: Path) -> None:
    """Remove the conversions of `layout`'s run that no checkpoint can use any more: the earlier
    weights of `keep`'s checkpoint, and checkpoints no longer in checkpoints/."""
    name = keep.name.rsplit("-", 1)[0]
    for entry in layout.ctranslate2.iterdir():
        if entry == keep or entry.name.startswith(".") or not entry.is_dir() or "-" not in entry.name:
            continue
        owner = entry.name.rsplit("-", 1)[0]
        if owner == name or not layout.weights(owner).is_file():
            shutil.rmtree(entry, ignore_errors=True)
