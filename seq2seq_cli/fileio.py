"""Files on disk: atomic writes, and UTF-8 text read and written line by line.

Every file the tool writes goes through `atomic_write` (temp file, fsync, rename), so a
reader sees the old file or the new one, never half of one. Text input is checked by one
scanner, `check_utf8`, whose error names the file, the line and the byte offset of the
first invalid UTF-8 in it. A name ending in `.gz` (`.xz`) is read through gzip (lzma). A
directory written as a whole (an imported or exported model) goes through `replacing_dir`: it
is built under a temporary name beside the old one and swapped in only when complete.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import lzma
import os
import shutil
import signal
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from seq2seq_cli.errors import UserError
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.paths import check_output_path, refuse_link_loop


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path), fsync it and rename it over `path`: readers see the old or the new file.

    A file that exists keeps its permissions; a new one gets those of any file created under
    the umask (0644 under umask 022). Errors name `path`, never the temporary file. Anything
    that is not a regular file (a device such as /dev/null, a FIFO) is written to directly,
    never replaced."""
    path = Path(path)
    refuse_link_loop(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a file name to write")
    if path.exists() and not path.is_file():
        try:
            write(str(path))
        except OSError as exc:  # a device that refuses the write (/dev/full): name it
            if exc.filename is not None or exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(path.parent, f".{path.name}.")
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # the file keeps its permissions, or a new one gets those of any new file (0666 less
        # the umask), whatever mode the writer created the temporary file with
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename in (tmp, None) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None  # e.g. a full disk while writing
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def current_umask() -> int:
    """The process's umask (set and restored at once: the only way to read it portably)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_dead_temps(folder: Path, prefix: str, suffix: str = ".tmp") -> None:
    """Remove the temporary files and directories named PREFIX<pid>.*SUFFIX that a process
    killed before it could clean up left in `folder` (those of live processes stay)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        rest = entry.name.removeprefix(prefix) if entry.name.startswith(prefix) else None
        pid = rest.split(".", 1)[0] if rest else ""
        if not pid.isdigit() or not entry.name.endswith(suffix) or pid_alive(int(pid)):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            pass


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (and `root`) to disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_directory_target(dest: Path) -> None:
    """Refuse a symbolic link or a file where a directory is to be written."""
    if dest.is_symlink():
        raise UserError(f"{dest}: is a symbolic link; write into a directory that is not a link")
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest}: is a file, expected a directory to write into")


@contextlib.contextmanager
def replacing_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside `dest` to write into; when the body succeeds,
    it replaces `dest` as a whole (the old directory is renamed aside, the new one renamed in,
    then the old one removed). When the body fails, the temporary directory is removed and
    `dest` is left as it was. A symbolic link or a file at `dest` is refused."""
    dest = Path(dest)
    check_directory_target(dest)
    dest = dest.resolve()
    if not dest.name:
        raise UserError(f"{dest}: cannot be replaced; write into another directory")
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(parent, f".{dest.name}.", ".new")
    tag = f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    new, old = parent / f"{tag}.new", parent / f"{tag}.old"
    new.mkdir()
    try:
        yield new
        _fsync_tree(new)
        if dest.exists():
            os.chmod(new, stat.S_IMODE(dest.stat().st_mode))
            os.rename(dest, old)
            try:
                os.rename(new, dest)
            except BaseException:
                os.rename(old, dest)
                raise
        else:
            os.rename(new, dest)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    dir_fd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    atomic_write(path, write)


def open_bytes(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when its name ends in .gz or .xz."""
    if path.suffix == ".xz":
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # type: ignore[return-value]


MAX_LINE_BYTES = 1 << 20
"""Bytes one line of a text input may hold (its newline aside): a sentence, or a paragraph, is
far shorter; a longer line (a binary file, a file without newlines) is refused before it is
read whole, as the server refuses a request past --max-chars."""


def line_too_long(where: str, number: int) -> UserError:
    """The one line for line `number` of `where` holding more than MAX_LINE_BYTES bytes."""
    return UserError(f"{where}:{number}: line longer than {MAX_LINE_BYTES} bytes (1 MiB), the most a line may hold; "
                     "expected one sentence a line (a file without newlines, or not text?)")


def read_line(stream: BinaryIO, where: str, number: int) -> bytes:
    """The next line of `stream` (b'' at its end), its newline kept: line `number` of `where`,
    read without holding more than MAX_LINE_BYTES + 1 bytes of it; `line_too_long` past that."""
    raw = stream.readline(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
        raise line_too_long(where, number)
    return raw


def check_utf8(path: Path) -> int:
    """Read `path` once, in bounded memory -> its number of lines.

    Raises UserError `PATH:LINE: invalid UTF-8 at byte OFFSET of the line (REASON)` at the
    first line that is not valid UTF-8 (lines and offsets counted from 1 and 0), and
    `line_too_long` at the first line of more than MAX_LINE_BYTES bytes.
    """
    count = 0
    with open_bytes(path) as f:
        while raw := read_line(f, str(path), count + 1):
            count += 1
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                hint = wide_bom_hint(raw) if count == 1 else ""
                raise UserError(f"{path}:{count}: invalid UTF-8 at byte {exc.start} of the line ({exc.reason}){hint}") from None
    return count


def wide_bom_hint(start: bytes) -> str:
    """'; the file starts with the byte-order mark of UTF-16: save it as UTF-8' where the bytes
    a file starts with are UTF-16's or UTF-32's mark, else ''."""
    wide = next((name for mark, name in WIDE_BOMS if start.startswith(mark)), None)
    return f"; the file starts with the byte-order mark of {wide}: save it as UTF-8" if wide else ""


WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))
"""Byte-order marks of the encodings a text input is most often saved in by mistake (UTF-32's first)."""


def check_text_file(path: Path) -> int:
    """Check that `path` is a readable UTF-8 text file (see `check_utf8`) -> its line count."""
    refuse_link_loop(path)
    if path.is_dir():
        raise UserError(f"{path}: cannot read (a directory, expected a text file)")
    if not path.exists():
        raise UserError(f"{path}: input file not found")
    if not path.is_file():  # checked, then read again: a pipe would be empty the second time
        raise UserError(f"{path}: not a regular file (a pipe or a device is read once, and an input is read twice: "
                        "to check it, then to use it); save it to a file first, or give translate standard input with -i -")
    try:
        return check_utf8(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except EOFError as exc:  # a .gz or .xz file cut short
        raise UserError(f"{path}: cannot read (cut short: {exc})") from None


BOM = "\ufeff"  # the byte-order mark, skipped at the start of every text input


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a checked UTF-8 file (see `check_text_file`), without their newline, one at a
    time; the byte-order mark an editor may put first is skipped."""
    with open_bytes(path) as f:
        for number, raw in enumerate(f):
            line = raw.decode("utf-8").removesuffix("\n")
            yield line.removeprefix(BOM) if number == 0 else line


def first_surrogate(text: str) -> int | None:
    """The code point of the first lone surrogate in `text`, or None. JSON's \\u escapes can
    name half of a UTF-16 pair, which is no character: such a string is not text, and UTF-8
    cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ord(text[exc.start])
    return None


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text`, written as JSON writes it ('\\ud800'), or None."""
    point = first_surrogate(text)
    return None if point is None else f"\\u{point:04x}"


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file, with a clear error for a missing file or bad encoding."""
    check_text_file(path)
    return list(iter_lines(path))


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write lines to `path` atomically (temp file, then rename) -> the number written.

    `lines` may be a generator: if it raises, the file at `path` is left as it was.
    A symbolic link keeps pointing where it did (its target is replaced). Anything that is not
    a regular file (a device such as /dev/null, a FIFO) is written to directly.
    """
    check_output_path(str(path))
    if path.is_symlink():
        path = path.resolve()
    count = 0

    def write(tmp: str) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
                count += 1

    atomic_write(path, write)
    return count


def file_key(path: Path) -> list:
    """What tells one version of a file from another without reading it: its real path, size,
    modification and change times, inode and device. A file rewritten under its old
    modification time (`cp -p`, `rsync -t`, `touch -r`) has another change time, which no
    tool sets back, or another inode."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------------------------- outputs
# An output file is refused when writing it would destroy something the command needs or a
# run holds: one of the command's inputs (the same path, a symbolic link to it or a hard link)
# or a path the model's run owns (its tokenizer, config, lock, metrics, and everything in its
# checkpoints, cache, plots and tensorboard directories: `RunLayout.owner_of`). A new file
# beside them, such as RUN/test.hyp.en, is the user's and is written. Outputs are checked
# before anything is translated.


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file (after links), or would once `a` is written."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(output: Path, inputs: dict[str, Path], run_dir: Path | None, what: str) -> None:
    """Refuse writing `what` (e.g. "the translation") to `output` when it is one of `inputs`
    (the flag naming each input -> its path) or is a path that `run_dir` (the model's run) owns."""
    refuse_link_loop(output)
    for flag, path in inputs.items():
        if same_file(output, path):
            raise UserError(f"{output}: is the {flag} file {path}; write {what} to another file")
    if run_dir is not None:
        owner = RunLayout(run_dir).owner_of(output)
        if owner is not None:
            part = owner.relative_to(run_dir) if owner != run_dir else "the run directory"
            raise UserError(f"{output}: belongs to the model's run {run_dir} ({part}); write {what} to another file")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM ends the process as Ctrl-C does: by an exception (SystemExit
    143), so that the temporary file of an output being written is removed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
