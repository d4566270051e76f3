"""Atomic writes and the UTF-8 line reading shared by the data reader, translate and evaluate."""

from __future__ import annotations

import gzip
import os
import re
import stat
import threading
from pathlib import Path

import pytest

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import (
    atomic_write,
    atomic_write_text,
    check_text_file,
    check_utf8,
    iter_lines,
    read_lines,
    replacing_dir,
    write_lines,
)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old\n")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("ne", encoding="utf-8")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, half_then_fail)
    assert path.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    atomic_write_text(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"


def test_write_lines_from_a_failing_generator_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("earlier\n", encoding="utf-8")

    def lines():
        yield "a"
        yield "b"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_lines(path, lines())
    assert path.read_text(encoding="utf-8") == "earlier\n"
    assert write_lines(path, iter(["x", "", "y"])) == 3
    assert read_lines(path) == ["x", "", "y"]


@pytest.mark.parametrize("compress", [False, True])
def test_the_first_invalid_utf8_is_named_by_file_line_and_byte(tmp_path, compress):
    data = "uno\nniño\n".encode() + b"tr\xe8s\nbad \xff\n"
    path = tmp_path / ("f.txt.gz" if compress else "f.txt")
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(UserError) as err:
        check_utf8(path)
    assert str(err.value) == f"{path}:3: invalid UTF-8 at byte 2 of the line (invalid continuation byte)"


def test_line_count_and_lines(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes("a\n\nñ\r\nlast".encode())
    assert check_text_file(path) == 4
    assert list(iter_lines(path)) == ["a", "", "ñ\r", "last"]
    gz = tmp_path / "f.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_lines(gz) == read_lines(path)


def test_missing_and_unreadable_inputs(tmp_path):
    with pytest.raises(UserError, match="input file not found"):
        check_text_file(tmp_path / "absent.txt")
    with pytest.raises(UserError, match="a directory, expected a text file"):
        check_text_file(tmp_path)
    fake = tmp_path / "plain.gz"
    fake.write_text("not gzip\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"plain.gz: cannot read \("):
        check_text_file(fake)
    with pytest.raises(UserError, match="output directory .* does not exist"):
        write_lines(tmp_path / "no" / "out.txt", ["a"])


def test_config_and_checkpoint_import_without_a_cycle():
    import subprocess
    import sys

    code = "import seq2seq_cli.config, sys; assert 'seq2seq_cli.run.checkpoint' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


@pytest.fixture
def umask():
    """Set the process umask for a test, restoring it after."""
    import os

    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


def test_new_files_take_the_umask_whatever_mode_the_writer_used(tmp_path, umask):
    import os
    import stat

    def private_writer(tmp: str) -> None:  # as some writers do: 0600 whatever the umask
        os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600))

    for mask, expected in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        umask(mask)
        path = tmp_path / f"new-{mask:o}.bin"
        atomic_write(path, private_writer)
        assert stat.S_IMODE(path.stat().st_mode) == expected
    umask(0o022)
    kept = tmp_path / "kept.bin"
    atomic_write(kept, private_writer)
    kept.chmod(0o640)
    atomic_write(kept, private_writer)  # an existing file keeps its own permissions
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_replacing_dir_swaps_in_a_complete_directory_or_leaves_the_old_one(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old.txt").write_text("old", encoding="utf-8")
    with pytest.raises(OSError), replacing_dir(dest) as tmp:
        assert tmp.parent == dest.parent and tmp.name.startswith(".out.") and tmp.name.endswith(".new")
        (tmp / "new.txt").write_text("half", encoding="utf-8")
        raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (dest / "old.txt").read_text(encoding="utf-8") == "old"
    with replacing_dir(dest) as tmp:
        (tmp / "new.txt").write_text("new", encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in dest.iterdir()] == ["new.txt"]
    with replacing_dir(tmp_path / "fresh" / "dir") as tmp:
        (tmp / "a").write_text("a", encoding="utf-8")
    assert (tmp_path / "fresh" / "dir" / "a").read_text(encoding="utf-8") == "a"


def test_replacing_dir_refuses_a_symlink_or_a_file(tmp_path):
    (tmp_path / "f").write_text("x", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "out", target_is_directory=True)
    for name, why in (("link", "is a symbolic link"), ("f", "is a file, expected a directory")):
        with pytest.raises(UserError, match=f"^{tmp_path / name}: {why}"), replacing_dir(tmp_path / name):
            pass
    assert (tmp_path / "f").read_text(encoding="utf-8") == "x" and (tmp_path / "link").is_symlink()


def is_device(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)


@pytest.mark.skipif(not is_device("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("how", ["lines", "bytes"])
def test_a_device_that_refuses_the_write_is_named_in_the_error_and_stays_a_device(how):
    with pytest.raises(OSError) as caught:
        if how == "lines":
            write_lines(Path("/dev/full"), ["a line"] * 10_000)
        else:
            atomic_write(Path("/dev/full"), lambda tmp: Path(tmp).write_bytes(b"<html></html>"))
    assert caught.value.filename == "/dev/full" and "No space left" in caught.value.strerror
    assert is_device("/dev/full")  # written to, never replaced by a regular file


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, lambda tmp: Path(tmp).write_bytes(b"translated\n"))
    reader.join(timeout=30)
    assert got == [b"translated\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary file left beside it


@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_file_is_named_as_such(tmp_path, encoding, name):
    path = tmp_path / "in.txt"
    path.write_bytes("Hola mundo.\n".encode(encoding))  # Python writes the byte-order mark first
    with pytest.raises(UserError) as caught:
        check_utf8(path)
    assert str(caught.value).startswith(f"{path}:1: invalid UTF-8 at byte 0")
    assert str(caught.value).endswith(f"the file starts with the byte-order mark of {name}: save it as UTF-8")


def test_a_pipe_as_an_input_is_refused_not_read_empty(tmp_path):
    """An input is checked, then read again; a FIFO (or `<(cmd)`) would be empty the second time."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"pipe: not a regular file \(a pipe or a device is read once"):
        check_text_file(fifo)


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_a_compressed_input_cut_short_is_named(tmp_path, suffix):
    import lzma

    whole = (gzip.compress if suffix == ".gz" else lzma.compress)(("hola mundo\n" * 2000).encode())
    path = tmp_path / f"cut.es{suffix}"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}: cannot read \(cut short: "):
        check_text_file(path)
