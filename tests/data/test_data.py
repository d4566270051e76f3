"""Reading parallel corpora (`formats.read_parallel`): aligned lines, one-line errors."""

import pytest

from seq2seq_cli.data.formats import read_parallel
from seq2seq_cli.errors import UserError


def _write_pair(tmp_path, src_lines, tgt_lines, src_bytes=None):
    (tmp_path / "c.es").write_bytes(src_bytes if src_bytes is not None else ("\n".join(src_lines) + "\n").encode())
    (tmp_path / "c.en").write_text("\n".join(tgt_lines) + "\n", encoding="utf-8")
    return str(tmp_path / "c")


def test_read_parallel_keeps_lines_aligned(tmp_path):
    prefix = _write_pair(tmp_path, ["uno", "", "tres\u2028x"], ["one", "two", "three"])
    ds = read_parallel(prefix, "es", "en", tmp_path / "cache")
    assert ds["src"] == ["uno", "", "tres\u2028x"]
    assert ds["tgt"] == ["one", "two", "three"]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    prefix = _write_pair(tmp_path, ["a", "b", "c"], ["a", "b"])
    with pytest.raises(UserError) as err:
        read_parallel(prefix, "es", "en", tmp_path / "cache")
    msg = str(err.value)
    assert f"{prefix}.es has 3 lines but {prefix}.en has 2" in msg and "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"c.es: file not found"):
        read_parallel(str(tmp_path / "c"), "es", "en")


def test_invalid_utf8_names_line_and_byte(tmp_path):
    prefix = _write_pair(tmp_path, [], ["a", "b", "c"], src_bytes=b"ok\nbad \xff here\nok\n")
    with pytest.raises(UserError, match=r"c.es:2: invalid UTF-8 at byte 4 of the line"):
        read_parallel(prefix, "es", "en", tmp_path / "cache")
