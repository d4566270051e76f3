import numpy as np
import pytest

from seq2seq_cli.batching import collate, epoch_batches, pad_batch, token_batches
from seq2seq_cli.encoding import EncodedCorpus
from seq2seq_cli.errors import UserError
from seq2seq_cli.formats import read_parallel
from seq2seq_cli.ids import BOS, EOS, PAD


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


def test_token_batches_cover_every_pair_once_within_budget():
    rng = np.random.default_rng(0)
    src_lens = rng.integers(1, 60, 500)
    tgt_lens = rng.integers(1, 60, 500)
    for shuffle in (None, np.random.default_rng(1)):
        batches = token_batches(src_lens, tgt_lens, 300, shuffle)
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == list(range(500))
        for b in batches:
            assert len(b) * max(src_lens[b].max(), tgt_lens[b].max()) <= 300


def test_oversized_pair_gets_a_batch_of_its_own():
    batches = token_batches(np.array([5, 500, 6]), np.array([5, 7, 6]), 100)
    assert [len(b) for b in batches if 1 in b] == [1]


def test_epoch_batches_depend_only_on_seed_and_epoch():
    corpus = EncodedCorpus.from_lists([[5] * (i % 17 + 1) for i in range(300)], [[6] * (i % 13 + 1) for i in range(300)])
    a, b = epoch_batches(corpus, 64, 1, 0), epoch_batches(corpus, 64, 1, 0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    c = epoch_batches(corpus, 64, 1, 1)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def test_collate_literal():
    corpus = EncodedCorpus.from_lists([[7, 8], [9]], [[10], [11, 12, 13]])
    batch = collate(corpus, np.array([0, 1]))
    src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
    assert src.tolist() == [[7, 8, EOS], [9, EOS, PAD]]
    assert tgt_in.tolist() == [[BOS, 10, PAD, PAD], [BOS, 11, 12, 13]]
    assert tgt_out.tolist() == [[10, EOS, PAD, PAD], [11, 12, 13, EOS]]
    assert (batch.src_tokens, batch.tgt_tokens) == (int((src != PAD).sum()), int((tgt_out != PAD).sum())) == (5, 6)


def test_collate_gathers_rows_across_arrow_chunks_in_order():
    import pyarrow as pa

    src = [[5 + i % 7] * (1 + i % 4) for i in range(40)]
    tgt = [[9] * (1 + i % 5) for i in range(40)]
    whole = EncodedCorpus.from_lists(src, tgt)
    chunked = EncodedCorpus(pa.Table.from_batches(whole.table.to_batches(max_chunksize=6)), whole.src_lens, whole.tgt_lens)
    assert chunked.table.column("src_ids").num_chunks == 7
    index = np.random.default_rng(0).permutation(40)[:17]
    expected = [pad_batch([src[i] for i in index], [], [EOS]), pad_batch([tgt[i] for i in index], [BOS], [])]
    got = collate(chunked, index)
    assert got.src.tolist() == expected[0].tolist() and got.tgt_in.tolist() == expected[1].tolist()


@pytest.mark.parametrize("src,tgt,where", [
    (["uno", "dos", " "], ["one", "", "three"], "c.en:2: empty target"),  # the earlier pair wins
    (["uno", "", "tres"], ["one", "", "three"], "c.es:2: empty source"),  # in one pair, the source
])
def test_blank_lines_name_the_first_pair(tmp_path, src, tgt, where):
    from seq2seq_cli.config import DataConfig
    from seq2seq_cli.encoding import check_no_empty_lines

    prefix = _write_pair(tmp_path, src, tgt)
    d = DataConfig(train=prefix, src_lang="es", tgt_lang="en", on_empty="error")
    with pytest.raises(UserError, match=where):
        check_no_empty_lines(read_parallel(prefix, "es", "en", tmp_path / "cache"), prefix, d)
