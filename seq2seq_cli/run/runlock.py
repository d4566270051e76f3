"""Guards of a run directory: one writer at a time, and no run lost by starting over.

`hold(run_dir, command)` takes an OS file lock (`fcntl.flock`) on `RUN/.lock` for as long as
a command writes the run (`train`, `tokenize`). The lock belongs to the open file, so it dies
with the process: a killed run leaves no stale lock. The holder writes its pid, command and
start time into the file, so a second command can say who holds the run (and the holder's
machine, when it is another one sharing the run directory). Within one process
the lock is re-entrant (`train` trains the tokenizer under its own lock).

`check_writable` names a run directory this process may not write (or create), before
anything is written into it. `check_fresh_start` refuses to start a run over a directory that holds checkpoints unless the
user said `--resume` or `--overwrite`; `clear_run` removes what belonged to the old run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from seq2seq_cli.errors import UserError
from seq2seq_cli.layout import BEST, LAST, RunLayout

_held: dict[Path, tuple[IO[str], int]] = {}  # lock path -> (open file, how many holders in this process)


def _describe_holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        host = info.get("host")  # on a shared filesystem the holder may run on another machine
        where = f" on {host}" if host and host != socket.gethostname() else ""
        return f"pid {info['pid']}{where} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def acquire(run_dir: Path, command: str) -> Path:
    """Lock `run_dir` for this process (re-entrant) -> the lock file's path; `release` it.

    Raises UserError naming the holder when another process holds the run."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: run_dir is a file, expected a directory (or a path that does not exist yet)")
    check_writable(run_dir)
    lock_path = RunLayout(run_dir).lock.resolve()
    if lock_path in _held:
        f, count = _held[lock_path]
        _held[lock_path] = (f, count + 1)
        return lock_path
    f = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 (held open: the lock lives as long as the file)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UserError(
            f"{run_dir}: run directory is in use by {_describe_holder(lock_path)}; "
            "wait for it to finish, or use another run_dir"
        ) from None
    except OSError as exc:  # ENOLCK, ENOSYS: a (shared) filesystem mounted without lock support
        f.close()
        raise UserError(
            f"{run_dir}: the run directory cannot be locked ({exc.strerror or exc}): its filesystem does not support "
            "file locks (Lustre: mount it with -o flock; NFS: run its lock service); use a run_dir on one that does"
        ) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}) + "\n")
    f.flush()
    _held[lock_path] = (f, 1)
    return lock_path


def check_writable(run_dir: Path) -> None:
    """Create `run_dir` if need be and check that this process may write in it, so that a
    read-only run directory is named as such, not blamed on the first file written there
    (a data cache, the lock, the config)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" in {Path(exc.filename).parent}" if exc.filename else ""
        raise UserError(f"{run_dir}: run directory cannot be created ({exc.strerror or exc}{where}); "
                        "use a run_dir in a writable place") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UserError(f"{run_dir}: run directory is not writable; make it writable (chmod u+w), or use another run_dir")
    for sub in RunLayout(run_dir).subdirs:
        if sub.is_dir() and not os.access(sub, os.W_OK | os.X_OK):
            raise UserError(f"{sub}: directory of the run is not writable; make it writable (chmod u+w), "
                            "or use another run_dir")


def release(lock_path: Path) -> None:
    """Give back one hold of a lock taken by `acquire`; the last one unlocks the file."""
    f, count = _held[lock_path]
    if count > 1:
        _held[lock_path] = (f, count - 1)
        return
    del _held[lock_path]
    with contextlib.suppress(OSError):
        f.seek(0)
        f.truncate()
    f.close()  # closing the file releases the flock


@contextlib.contextmanager
def hold(run_dir: Path, command: str) -> Iterator[None]:
    """Hold the lock of `run_dir` for the body of the `with` (see `acquire`)."""
    lock_path = acquire(run_dir, command)
    try:
        yield
    finally:
        release(lock_path)


def holder(run_dir: Path) -> str | None:
    """Who holds the lock of `run_dir` in another process ("pid N (COMMAND, since ...)"), or
    None when no process does; the lock is only tested, not kept."""
    lock_path = RunLayout(run_dir).lock
    if not lock_path.is_file() or lock_path.resolve() in _held:
        return None
    try:
        f = open(lock_path, encoding="utf-8")  # noqa: SIM115 (closed below, after the test)
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_holder(lock_path)
        except OSError:  # no lock support there: no holder can be told (taking the lock says so)
            return None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return None


def command_line() -> str:
    """This process's command, as shown to a second command that finds the run locked."""
    name = Path(sys.argv[0]).name if sys.argv else "python"
    if name in ("seq2seq", "__main__.py"):  # the console script, or python -m seq2seq_cli
        name = "seq2seq"
    return " ".join([name, *sys.argv[1:2]])


def has_checkpoints(run_dir: Path) -> bool:
    """Whether the run directory holds a finished checkpoint (a manifest, or `last`/`best`);
    the unfinished files of a first save killed half-way do not make a run."""
    layout = RunLayout(run_dir)
    if not layout.checkpoints.is_dir():
        return False
    return any(layout.checkpoints.glob("*.json")) or any(layout.weights(n).exists() for n in (LAST, BEST))


def check_fresh_start(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start over in a run directory that holds checkpoints, unless asked to."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other: continue the run, or start it over")
    if not resume and not overwrite and has_checkpoints(run_dir):
        raise UserError(
            f"{run_dir}: holds the checkpoints of an earlier run; continue it with --resume, "
            "or start over with --overwrite (removes its checkpoints and metrics)"
        )


def clear_run(run_dir: Path) -> list[Path]:
    """Remove what belonged to an earlier training run (checkpoints, metrics, TensorBoard
    events, plots); the tokenizer, the data cache and the config stay -> what was removed."""
    removed = []
    for path in RunLayout(run_dir).outputs:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed
