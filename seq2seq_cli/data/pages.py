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
    it has already visited. Only read-only file mappings listed in /proc/self/maps are touched."""

    def __init__(self, directory: Path) -> None:
        self.ranges: list[tuple[int, int]] = []
        advice = getattr(mmap, "MADV_DONTNEED", None)
        root = str(directory.resolve()) + os.sep
        try:
            with open("/proc/self/maps", encoding="utf-8") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].rstrip("\n").startswith(root) and "w" not in fields[1]:
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        self.ranges.append((start, end))
        except OSError:
            pass
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if self.ranges and advice is not None else None
        self._advice = advice

    def __call__(self) -> None:
        if self._madvise is not None:
            for start, end in self.ranges:
                self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), self._advice)


_RELEASES: dict[tuple[int, str], PageRelease] = {}


def release_pages(directory: str) -> None:
    """Drop the pages under `directory` mapped by this process, with the mappings found on
    this process's first call for that directory (`datasets.map` workers are processes too)."""
    key = (os.getpid(), directory)
    if key not in _RELEASES:
        _RELEASES[key] = PageRelease(Path(directory))
    _RELEASES[key]()


def release_dataset(dataset) -> None:
    """Drop this process's resident pages of the Arrow files of a `datasets.Dataset` (the
    mappings found now)."""
    for folder in {Path(f["filename"]).parent for f in dataset.cache_files}:
        PageRelease(folder)()
