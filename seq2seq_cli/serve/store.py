"""The server's temporary folder of translated files (`/translate_file`): each is downloaded
once (then removed) or removed after FILE_LIFETIME_S; the folder is removed when the server ends.

A file is stored under an id of the server's own (32 hex digits and the suffix of its format),
never under the name it was sent with: any name (quotes, commas, `%`, emoji, NUL, 300
characters) is only given back in the download's Content-Disposition. The server holds a lock
on a file beside its folder (the folder's name + LOCK) while it runs; a server killed without
the chance to remove its folder (SIGKILL) leaves it unlocked, and the next server to start
removes every such folder older than FILE_LIFETIME_S.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import IO

from seq2seq_cli.layout import LOCK  # FOLDER.lock, beside the folder: held by the server whose folder it is

FILE_LIFETIME_S = 600.0  # a translated file not downloaded by then is removed
PREFIX = "seq2seq-files-"
ID = re.compile(r"[0-9a-f]{32}(\.[a-z]{1,5})?")
SUFFIX = re.compile(r"\.[a-z]{1,5}")


def _locked(path: Path) -> IO[str] | None:
    """`path` opened and locked for this process; None if another process holds it."""
    handle = path.open("a")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def remove_stale(root: Path, now: float | None = None) -> list[Path]:
    """Remove the folders of servers that ended without removing theirs: the PREFIX folders in
    `root` holding a LOCK no process holds, untouched for FILE_LIFETIME_S -> those removed."""
    now = time.time() if now is None else now
    removed = []
    for folder in root.glob(PREFIX + "*"):
        lock = _lock_of(folder)
        try:
            if not folder.is_dir() or not lock.is_file():
                continue
            newest = max([folder.stat().st_mtime, *(p.stat().st_mtime for p in folder.iterdir())])
            if now - newest <= FILE_LIFETIME_S:
                continue
            handle = _locked(lock)
        except OSError:  # another user's folder, or gone meanwhile
            continue
        if handle is not None:
            shutil.rmtree(folder, ignore_errors=True)
            lock.unlink(missing_ok=True)
            handle.close()
            removed.append(folder)
    return removed


class FileStore:
    """Translated files kept for their one download, by id."""

    def __init__(self) -> None:
        remove_stale(Path(tempfile.gettempdir()))
        self.folder = Path(tempfile.mkdtemp(prefix=PREFIX))
        self._lock = _locked(_lock_of(self.folder))
        self.names: dict[str, str] = {}  # id -> the name the file was sent with
        self._finalizer = weakref.finalize(self, _remove, str(self.folder), self._lock)

    def put(self, name: str, data: bytes) -> str:
        """Store a translated file -> its id (what its download URL ends with)."""
        self.sweep()
        suffix = SUFFIX.fullmatch(Path(name).suffix.lower())
        stored = uuid.uuid4().hex + (suffix.group(0) if suffix else "")
        (self.folder / stored).write_bytes(data)
        self.names[stored] = name
        return stored

    def take(self, stored: str, keep: bool = False) -> tuple[str, bytes] | None:
        """A stored file's name and bytes, removed from the folder unless `keep`; None if
        there is no such file."""
        self.sweep()
        if not ID.fullmatch(stored) or stored not in self.names:
            return None
        path = self.folder / stored
        try:
            data = path.read_bytes()
        except OSError:
            return None
        name = self.names[stored]
        if not keep:
            path.unlink(missing_ok=True)
            del self.names[stored]
        return name, data

    def sweep(self) -> None:
        now = time.time()
        for path in self.folder.iterdir():
            if now - path.stat().st_mtime > FILE_LIFETIME_S:
                path.unlink(missing_ok=True)
                self.names.pop(path.name, None)

    def close(self) -> None:
        self._finalizer()


def _lock_of(folder: Path) -> Path:
    return folder.with_name(folder.name + LOCK)


def _remove(folder: str, lock: IO[str] | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _lock_of(Path(folder)).unlink(missing_ok=True)
    if lock is not None:
        lock.close()
