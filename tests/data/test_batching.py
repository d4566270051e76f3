"""Token-budget batches, epoch order and collation (`batching`)."""

from types import SimpleNamespace

import numpy as np
import pytest

from seq2seq_cli.data import batching
from seq2seq_cli.data.batching import BatchPlan, collate, epoch_batches, pad_batch, token_batches
from seq2seq_cli.data.corpora import Part
from seq2seq_cli.data.encoding import EncodedCorpus
from seq2seq_cli.ids import BOS, EOS, PAD


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


def test_a_batch_is_copied_as_one_buffer_of_its_tensors():
    corpus = EncodedCorpus.from_lists([[7, 8], [9]], [[10], [11, 12, 13]])
    batch = collate(corpus, np.array([0, 1]))
    parts = [batch.src, batch.tgt_in, batch.tgt_out, batch.tgt_rows]
    moved = batching.packed_copy(parts, "cpu", pin=False)
    assert [m.shape for m in moved] == [p.shape for p in parts]
    assert [m.tolist() for m in moved] == [p.tolist() for p in parts]
    assert len({m.untyped_storage().data_ptr() for m in moved}) == 1  # one buffer, one copy
    assert all(m.data_ptr() != p.data_ptr() for m, p in zip(moved, parts))
    assert batch.to("cpu").src is batch.src  # on the CPU nothing is copied


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


def reference_token_batches(src_lens, tgt_lens, max_tokens, rng=None, shuffle=True):
    """The batches as first written: one step of a Python loop per pair (`shuffle=False`: the
    batch order drawn but not applied)."""
    n = len(src_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = np.lexsort((tie, tgt_lens, src_lens))
    longest = np.maximum(src_lens, tgt_lens)[order]
    batches = []
    start, cur_max = 0, 0
    for i in range(n):
        new_max = max(cur_max, int(longest[i]))
        if i > start and new_max * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, new_max = i, int(longest[i])
        cur_max = new_max
    if n:
        batches.append(order[start:])
    if rng is not None:
        order_of_batches = rng.permutation(len(batches))
        if shuffle:
            batches = [batches[i] for i in order_of_batches]
    return batches


@pytest.mark.parametrize("chunk", [1 << 20, 37])  # 37: pairs handled in many slices
def test_token_batches_equal_the_loop_over_pairs_and_keep_the_random_stream(monkeypatch, chunk):
    monkeypatch.setattr(batching, "CHUNK", chunk)
    gen = np.random.default_rng(2024)
    cases = 0
    for n in (0, 1, 2, 3, 17, 250, 1500):
        # lengths 0 .. high-1: empty pairs, many ties, pairs over the budget; 2**20: too far
        # apart for the counting sort (three sorts instead)
        for high in (1, 3, 40, 700, 2**20):
            src, tgt = gen.integers(0, high, n), gen.integers(0, high, n)
            for dtype in (np.int32, np.int64):
                for max_tokens in (1, 5, 64, 300, 2048):
                    for seed in (None, 0, 99):
                        mine = np.random.default_rng(seed) if seed is not None else None
                        theirs = np.random.default_rng(seed) if seed is not None else None
                        got = token_batches(src.astype(dtype), tgt.astype(dtype), max_tokens, mine)
                        want = reference_token_batches(src.astype(dtype), tgt.astype(dtype), max_tokens, theirs)
                        assert len(got) == len(want)
                        assert [b.tolist() for b in got] == [b.tolist() for b in want], (n, high, max_tokens, seed)
                        if seed is not None:  # the generator is left where the first version left it
                            assert mine.integers(0, 2**62) == theirs.integers(0, 2**62)
                        cases += 1
    assert cases == 7 * 5 * 2 * 5 * 3


def test_token_batches_of_empty_pairs_only_go_past_the_first_window():
    zeros = np.zeros(5000, dtype=np.int32)
    assert [len(b) for b in token_batches(zeros, zeros, 10)] == [5000]
    lens = np.r_[np.zeros(3000, dtype=np.int32), np.full(10, 4, dtype=np.int32)]
    assert [b.tolist() for b in token_batches(lens, lens, 8)] == [b.tolist() for b in reference_token_batches(lens, lens, 8)]


def test_shuffling_an_int32_arange_is_the_generators_permutation():
    for n in (0, 1, 2, 7, 1000, 65_537):
        for seed in (0, 5, [3, 1]):
            a, b = np.random.default_rng(seed), np.random.default_rng(seed)
            tie = np.arange(n, dtype=np.int32)
            b.shuffle(tie)
            assert np.array_equal(a.permutation(n), tie)
            assert a.integers(0, 2**62) == b.integers(0, 2**62)


def test_the_plan_is_one_int32_order_and_indexes_like_a_list():
    rng = np.random.default_rng(3)
    src, tgt = rng.integers(1, 50, 2000).astype(np.int32), rng.integers(1, 50, 2000).astype(np.int32)
    plan = token_batches(src, tgt, 256, np.random.default_rng(8))
    want = reference_token_batches(src, tgt, 256, np.random.default_rng(8))
    assert isinstance(plan, BatchPlan) and plan.order.dtype == np.int32 and len(plan.bounds) == len(plan) + 1
    as_list = [b.tolist() for b in want]
    assert [b.tolist() for b in plan] == as_list  # iteration
    assert [b.tolist() for b in plan[3:40:7]] == as_list[3:40:7] and plan[-1].tolist() == as_list[-1]
    assert [b.tolist() for b in plan[1::2]] == as_list[1::2] and plan[len(plan):] == []
    assert sorted(plan.rows().tolist()) == list(range(2000))
    for bad in (len(plan), -len(plan) - 1):
        try:
            plan[bad]
        except IndexError:
            continue
        raise AssertionError(bad)


def reference_copies(parts):
    """Which copy of its pair each of an epoch's rows is: 0 .. floor(weight) - 1 for the corpus's
    whole passes, floor(weight) for the fraction's share."""
    copies = []
    for part in parts:
        full = part.per_epoch // part.count
        copies.append(np.minimum(np.arange(part.per_epoch) // part.count, full))
    return np.concatenate(copies)


def reference_epoch_rows(parts, seed, epoch):
    """The weighted corpora's epoch rows as first written (int64, permutations of the generator)."""
    chunks_of_all = []
    for number, part in enumerate(parts):
        n = part.count
        full, rest = divmod(part.per_epoch, n) if n else (0, 0)
        chunks = [np.arange(n, dtype=np.int64)] * full
        if rest:
            cycle, offset = divmod(epoch * rest, n)
            tail = np.random.default_rng([seed, 0x5EED, number, cycle]).permutation(n)[offset : offset + rest]
            if len(tail) < rest:
                head = np.random.default_rng([seed, 0x5EED, number, cycle + 1]).permutation(n)
                head = head[~np.isin(head, tail)][: rest - len(tail)]
                tail = np.concatenate([tail, head])
            chunks.append(tail.astype(np.int64))
        chunks_of_all.append(part.start + (np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)))
    return np.concatenate(chunks_of_all)


@pytest.mark.parametrize("chunk", [1 << 20, 37])
def test_weighted_epoch_batches_equal_the_first_version(monkeypatch, chunk):
    monkeypatch.setattr(batching, "CHUNK", chunk)
    rng = np.random.default_rng(11)
    sizes = (300, 57, 1000)
    starts = np.cumsum((0, *sizes))[:-1]
    parts = [Part(str(i), w, None, int(a), n) for i, (w, a, n) in enumerate(zip((2, 0.5, 0.3), starts, sizes))]
    for high in (40, 2**20):  # 2**20: lengths too far apart for the packed sort key
        lens = rng.integers(1, high, (2, sum(sizes))).astype(np.int32)
        corpus = SimpleNamespace(src_lens=lens[0], tgt_lens=lens[1], parts=parts)
        for seed in (1, 9):
            for epoch in range(5):  # 0.3 of 1000 crosses a permutation's end in epoch 3
                rows, copies = reference_epoch_rows(parts, seed, epoch), reference_copies(parts)
                gen = np.random.default_rng([seed, epoch])
                grouped = []  # each copy's rows batched on their own, then all the batches shuffled
                for copy in range(int(copies.max()) + 1):
                    mine = rows[copies == copy]
                    grouped += [mine[b] for b in reference_token_batches(lens[0][mine], lens[1][mine], 300, gen,
                                                                         shuffle=False)]
                want = [grouped[i] for i in gen.permutation(len(grouped))]
                plan = epoch_batches(corpus, 300, seed, epoch)
                assert plan.order.dtype == np.int32
                assert [b.tolist() for b in plan] == [b.tolist() for b in want]
