"""Paths the user names: a loop of symbolic links (which names no file to read or write), and
the one rule of every `-o FILE`, checked before anything is computed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from seq2seq_cli.errors import UserError


def link_loop(path: Path) -> bool:
    """Whether `path` is a symbolic link that leads back to itself (or through too many links)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def refuse_link_loop(path: Path) -> None:
    """Refuse a path that is a loop of symbolic links, which names no file to read or write."""
    if link_loop(path):
        raise UserError(f"{path}: a loop of symbolic links (too many levels of links lead nowhere); "
                        "point the link at a file, or give another path")


def check_output_path(output: str) -> None:
    """The one rule of every `-o FILE` (`-` aside): a file name in a directory that exists.
    Refuses a name ending in a slash (a directory, never a file), a directory, a loop of links,
    a parent that is a file or that does not exist, each in one line."""
    path = Path(output)
    refuse_link_loop(path)
    if output.endswith(("/", os.sep)) and not path.is_dir():
        if path.exists():
            raise UserError(f"{output}: names a directory (it ends in a slash), but {path} is a file; "
                            "give the file name without the slash")
        raise UserError(f"{output}: names a directory (it ends in a slash), which does not exist; "
                        f"give a file name to write, e.g. {path}/out.txt in a directory that exists")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a file name to write")
    parent = path.parent
    for folder in (parent, *parent.parents):
        if link_loop(folder):
            raise UserError(f"{path}: {folder} is a loop of symbolic links; write into a directory that exists")
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{path}: {folder} is a file, not a directory; write into a directory")
        if folder.is_dir():
            break
    if not parent.is_dir():
        raise UserError(f"{path}: output directory {parent} does not exist")
