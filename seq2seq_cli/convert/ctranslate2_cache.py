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
once CTranslate2 has loaded it; that folder is named with the process's id, and those of killed
processes are removed by the next start.

Each conversion holds a manifest (`MANIFEST`: every file's size, sha256 and stamp: its times,
inode and device), written when it is made and checked at every start: a conversion missing a
file, cut short or damaged inside (same size) is converted again, with the reason on stderr,
instead of breaking every later command or decoding wrong weights. A file whose stamp is the
one recorded has not been written since and is not read again; any other is hashed (a copied
run once, then its manifest takes the new stamps where the run can be written). On a 2-core
Intel Xeon, hashing the model.bin of a quick-start-sized model (35.6M parameters, 143 MB) takes
0.30 s; checking sizes and stamps 0.05 ms.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from seq2seq_cli.convert.export import VMAP
from seq2seq_cli.fileio import atomic_write_text, remove_dead_temps, replacing_dir, terminate_as_interrupt
from seq2seq_cli.layout import WEIGHTS, RunLayout
from seq2seq_cli.run.loaded import RunFiles

MODEL_FILE = "model.bin"  # written last by CTranslate2's converter
MANIFEST = "seq2seq-manifest.json"  # {"files": {name: {"size": bytes, "sha256": hex}}} of the other files
TEMP_PREFIX = "seq2seq-ct2-"  # $TMPDIR/seq2seq-ct2-PID.XXXX.tmp: a conversion of a run that cannot hold it


@contextlib.contextmanager
def converted_model(files: RunFiles, convert: Callable[[Path], object]) -> Iterator[Path]:
    """The folder of the CTranslate2 model of `files`' checkpoint, for the block: the run's own
    (RUN/ctranslate2/NAME-SHA), written by `convert(folder)` plus the shortlist the first time;
    where the run cannot hold it, a temporary folder removed when the block ends."""
    layout = files.layout
    name = files.checkpoint.name.removesuffix(WEIGHTS)
    folder = layout.converted(name, files.weights_sha256)
    shortlist = layout.shortlist if layout.shortlist.is_file() else None
    ready = False
    if folder.is_dir():
        damage = problem(folder)
        if damage is not None:
            print(f"note: {folder}: {damage}; the checkpoint is converted again", file=sys.stderr)
        ready = damage is None and _same_vmap(folder, shortlist)
    if not ready and not _write_kept(folder, shortlist, convert):
        temps = Path(tempfile.gettempdir())
        remove_dead_temps(temps, TEMP_PREFIX)  # those of processes killed while converting
        with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}.", suffix=".tmp") as tmp, \
                terminate_as_interrupt():
            _write(Path(tmp) / "model", shortlist, convert)
            yield Path(tmp) / "model"
        return
    yield folder


def complete(folder: Path, shortlist: Path | None) -> bool:
    """Whether `folder` holds a whole converted model, as its manifest describes it, with the
    run's shortlist as it is now."""
    return (folder / MODEL_FILE).is_file() and problem(folder) is None and _same_vmap(folder, shortlist)


def _same_vmap(folder: Path, shortlist: Path | None) -> bool:
    """Whether `folder`'s vocabulary map is the run's shortlist as it is now (none where it has none)."""
    vmap = folder / VMAP
    if shortlist is None:
        return not vmap.exists()
    return vmap.is_file() and filecmp.cmp(vmap, shortlist, shallow=False)


def problem(folder: Path) -> str | None:
    """What is wrong with the conversion in `folder` against its manifest (a file missing, of
    another size, or of another sha256), or None where every file is as it was written. A file
    whose size, times and inode are those the manifest recorded has not been written since and
    is not read; one whose stamp differs (a copied run, a file rewritten) is hashed, and where
    every hash matches the manifest takes the new stamps (where the run can be written)."""
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (a conversion cut short, or made before conversions carried one)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is not readable ({exc})"
    if not isinstance(listed, dict) or MODEL_FILE not in listed:
        return f"{MANIFEST} does not list {MODEL_FILE}"
    hashed = False
    for name, want in listed.items():
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != want.get("size"):
            return f"{name} has {st.st_size} bytes, {want.get('size')} when converted (cut short or changed)"
        if _stamp(st) == want.get("stamp"):
            continue
        if _sha256(path) != want.get("sha256"):
            return f"{name} is damaged (its sha256 differs from the one written when it was converted)"
        hashed = True
    if hashed:  # every file as written, under new stamps: later starts need not hash it again
        with contextlib.suppress(OSError):
            _write_manifest(folder, {name: want["sha256"] for name, want in listed.items()})
    return None


def _stamp(st: os.stat_result) -> list[int]:
    """What changes whenever a file is written (or its times set back): mtime, ctime, inode, device."""
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_manifest(folder: Path, hashes: dict[str, str] | None = None) -> None:
    """The manifest of every file in `folder`: its size, sha256 (`hashes`' where given) and
    stamp, written last, as the conversion's seal."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith("."):
            st = path.stat()
            digest = (hashes or {}).get(path.name) or _sha256(path)
            files[path.name] = {"size": st.st_size, "sha256": digest, "stamp": _stamp(st)}
    atomic_write_text(folder / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")


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
    _write_manifest(folder)


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
