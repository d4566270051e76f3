"""Dropping a process's resident pages of memory-mapped files (madvise DONTNEED; Linux), so
that its RSS does not grow with the part of a corpus it has already read."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path


class PageRelease:
    """Drop this process's resident pages of the memory-mapped files under a directory
    (madvise DONTNEED; Linux). The data stays in the file and the page cache and is read back
    on the next access, so a training process's RSS does not grow with the part of the corpus
    it has already visited. Only read-only file mappings listed in /proc/self/maps are touched,
    and they are looked up at every call: a mapping found earlier may have been unmapped since
    and its addresses reused by the heap, whose memory DONTNEED would wipe."""

    def __init__(self, directory: Path) -> None:
        self.root = str(directory.resolve()) + os.sep
        advice = getattr(mmap, "MADV_DONTNEED", None)
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if advice is not None else None
        self._advice = advice

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """(start, end) addresses of this process's read-only mappings of files under the directory, now."""
        found = []
        try:
            with open("/proc/self/maps", encoding="utf-8") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].rstrip("\n").startswith(self.root) and "w" not in fields[1]:
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        found.append((start, end))
        except OSError:
            pass
        return found

    def __call__(self) -> None:
        if self._madvise is not None:
            for start, end in self.ranges:
                self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), self._advice)


def release_pages(directory: str) -> None:
    """Drop the pages under `directory` mapped by this process (`datasets.map` workers are
    processes too)."""
    PageRelease(Path(directory))()


def release_dataset(dataset) -> None:
    """Drop this process's resident pages of the Arrow files of a `datasets.Dataset`."""
    for folder in {Path(f["filename"]).parent for f in dataset.cache_files}:
        PageRelease(folder)()
