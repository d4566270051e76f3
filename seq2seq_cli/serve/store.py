"""The server's temporary folder of translated files (`/translate_file`): each is downloaded
once (then removed) or removed after FILE_LIFETIME_S; the folder is removed when the server ends."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import uuid
import weakref
from pathlib import Path

FILE_LIFETIME_S = 600.0  # a translated file not downloaded by then is removed
NAME = re.compile(r"[0-9a-f]{32}\.[\w. -]{1,200}")


class FileStore:
    """Translated files kept for their one download."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="seq2seq-files-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)

    def put(self, name: str, data: bytes) -> str:
        self.sweep()
        stored = f"{uuid.uuid4().hex}.{Path(name).name}"
        (self.folder / stored).write_bytes(data)
        return stored

    def take(self, stored: str) -> bytes | None:
        """A stored file's bytes, removed from the folder; None if there is no such file."""
        self.sweep()
        if not NAME.fullmatch(stored):
            return None
        path = self.folder / stored
        try:
            data = path.read_bytes()
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return data

    def sweep(self) -> None:
        now = time.time()
        for path in self.folder.iterdir():
            if now - path.stat().st_mtime > FILE_LIFETIME_S:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self._finalizer()
