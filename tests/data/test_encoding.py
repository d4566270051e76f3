"""Encoding checks and filters (`encoding`): blank lines named, drops described."""

from types import SimpleNamespace

import pytest

from seq2seq_cli.config import DataConfig
from seq2seq_cli.data.encoding import Drop, EncodedCorpus, check_no_empty_lines, describe_drops
from seq2seq_cli.data.formats import read_parallel
from seq2seq_cli.errors import UserError


def _write_pair(tmp_path, src_lines, tgt_lines, src_bytes=None):
    (tmp_path / "c.es").write_bytes(src_bytes if src_bytes is not None else ("\n".join(src_lines) + "\n").encode())
    (tmp_path / "c.en").write_text("\n".join(tgt_lines) + "\n", encoding="utf-8")
    return str(tmp_path / "c")



@pytest.mark.parametrize("src,tgt,where", [
    (["uno", "dos", " "], ["one", "", "three"], "c.en:2: empty target"),  # the earlier pair wins
    (["uno", "", "tres"], ["one", "", "three"], "c.es:2: empty source"),  # in one pair, the source
])
def test_blank_lines_name_the_first_pair(tmp_path, src, tgt, where):
    prefix = _write_pair(tmp_path, src, tgt)
    d = DataConfig(train=prefix, src_lang="es", tgt_lang="en", on_empty="error")
    with pytest.raises(UserError, match=where):
        check_no_empty_lines(read_parallel(prefix, "es", "en", tmp_path / "cache"), prefix, d)


def test_drop_codes_name_the_counts():
    """The codes of the first filters keep their numbers (caches and metrics name them)."""
    assert [d.key for d in Drop][:5] == ["kept", "empty", "too_long", "ratio", "duplicate"]
    assert [int(d) for d in Drop] == list(range(len(Drop)))


def test_described_drops_always_name_the_length_limits():
    """The length limits always apply to training: they are described even when the counts
    do not list them (a corpus built in memory)."""
    config = SimpleNamespace(data=DataConfig(train="x", src_lang="es", tgt_lang="en", max_src_len=50, max_tgt_len=60))
    corpus = EncodedCorpus.from_lists([[5]], [[6]], {"empty": 2})
    assert describe_drops(corpus, config) == "dropped 2 empty, 0 over 50/60 subwords"
    corpus = EncodedCorpus.from_lists([[5]], [[6]], {"empty": 0, "too_long": 3})
    assert describe_drops(corpus, config) == "dropped 0 empty, 3 over 50/60 subwords"
